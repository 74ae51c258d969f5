"""The CUDA accelerator's static KV cache and compiled decoding step (aiayn.accel.cuda) equal the reference's cached
decoding: step by step with beams reordered and sentences dropped, and through greedy generation, greedy translation
and beam search. Eager and inductor-compiled steps run on any host; the CUDA-graph step ("reduce-overhead") where
there is a GPU. Declined configs, hooks, and a batch or length past the buffers run the reference."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch

from aiayn import ModelConfig, build_model
from aiayn.accel import accelerate, substituted
from aiayn.accel.cuda import for_decoding
from aiayn.accel.cuda.decode_step import StaticDecodeStep
from aiayn.accel.cuda.static_cache import StaticDecoderCache, bucket
from aiayn.accel.cuda.support import step_supports, unsupported
from aiayn.generate import LMStepper, Seq2SeqStepper, generate, translate
from aiayn.generate.lm import left_pad
from aiayn.generate.steppers import eval_mode

ATOL = 1e-5
CUDA_ATOL = 1e-4  # the inductor's CUDA kernels against torch's eager ones
VOCAB = 61

VARIANTS = {
    "paper": dict(),
    "none_pre_rms_swiglu": dict(position="none", norm_position="pre", norm="rmsnorm", activation="swiglu"),
    "learned_gelu_offset": dict(position="learned", activation="gelu", position_offset=2),
    "rope_gqa": dict(position="rope", n_kv_heads=2),
    "rope_mqa_qk_norm_yarn": dict(position="rope", n_kv_heads=1, qk_norm=True, rope_scaling="yarn",
                                  rope_scaling_factor=2.0),
    "halves_deepnorm_embedding_norm": dict(sinusoidal_layout="halves", deepnorm=True, embedding_norm=True),
    "reference_backend_head_dim": dict(attention_backend="reference", head_dim=4),
}
DECLINED = {
    "alibi": dict(position="alibi"),
    "t5": dict(position="t5"),
    "sliding_window": dict(position="rope", sliding_window=3),
    "moe": dict(ffn="moe", n_experts=2, moe_top_k=1),
    "softcap": dict(attn_logit_softcap=5.0),
    "tiled_backend": dict(attention_backend="tiled"),
}


def _pair(arch: str, device: str = "cpu", compile: str = "eager", **kw: object) -> tuple[torch.nn.Module,
                                                                                           torch.nn.Module]:
    """The reference model and a copy accelerated with the static step."""
    torch.manual_seed(0)
    reference = build_model(ModelConfig.preset("tiny", arch=arch, vocab_size=VOCAB, **kw)).to(device).eval()
    return reference, for_decoding(copy.deepcopy(reference), compile=compile)


@pytest.fixture
def static_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The buffer rows of every step that ran as the static step (eager mode: StaticDecodeStep.run)."""
    calls: list[int] = []
    real = StaticDecodeStep.run

    def counted(self: StaticDecodeStep, ids: torch.Tensor, *args: object) -> torch.Tensor:
        calls.append(ids.shape[0])
        return real(self, ids, *args)

    monkeypatch.setattr(StaticDecodeStep, "run", counted)
    return calls


def _lm_stepper(device: str, steps_capacity: int = 12) -> Callable[[torch.nn.Module], LMStepper]:
    ids, is_token = left_pad([[1, 5, 6, 7], [1, 9], [1, 11, 12]], 0, device)
    return lambda model: LMStepper(model, ids, is_token, capacity=ids.shape[1] + steps_capacity)


def _seq2seq_stepper(device: str) -> Callable[[torch.nn.Module], Seq2SeqStepper]:
    src = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0], [11, 12, 13, 2, 0]], device=device)
    return lambda model: Seq2SeqStepper(model, src, capacity=12)


def _steps(make_stepper: Callable[[torch.nn.Module], object], model: torch.nn.Module, n_steps: int = 6,
           beams: int = 3) -> list[torch.Tensor]:
    """Logits of a first step and ``n_steps`` more through one stepper: rows expanded to ``beams`` beams, beams
    permuted within their sentence, and the middle sentence dropped after the third step (as beam search does)."""
    g = torch.Generator().manual_seed(1)
    with eval_mode(model):
        stepper = make_stepper(model)
        logits = [stepper.first()]
        n, device = logits[0].shape[0], logits[0].device
        stepper.reorder(torch.arange(n, device=device).repeat_interleave(beams), group=beams)
        for i in range(n_steps):
            tokens = torch.randint(3, VOCAB, (beams * n,), generator=g).to(device)
            logits.append(stepper.step(tokens))
            if i == 2:
                keep = torch.tensor([0, 2])
                index = (keep[:, None] * beams + torch.arange(beams)).view(-1).to(device)
                stepper.reorder(index, group=beams)
                n = 2
            else:
                perm = torch.randint(0, beams, (n, beams), generator=g) + beams * torch.arange(n)[:, None]
                stepper.reorder(perm.view(-1).to(device), same_sources=True, group=beams)
    return logits


def _assert_equal(got: list[torch.Tensor], want: list[torch.Tensor], atol: float = ATOL) -> None:
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, atol=atol, rtol=0, msg=lambda m, i=i: f"step {i}: {m}")


@pytest.mark.parametrize("variant", VARIANTS)
def test_lm_steps_equal_the_reference(variant: str, device: str, static_runs: list[int]) -> None:
    reference, model = _pair("decoder", device, **VARIANTS[variant])
    make = _lm_stepper(device)
    _assert_equal(_steps(make, model), _steps(make, reference))
    # every step after the prompt was static: 9 rows (3 prompts x 3 beams) in 16, then 6 in the same buffers
    assert static_runs == [16] * 6


@pytest.mark.parametrize("variant", VARIANTS)
def test_seq2seq_steps_equal_the_reference(variant: str, device: str, static_runs: list[int]) -> None:
    reference, model = _pair("encoder-decoder", device, **VARIANTS[variant])
    make = _seq2seq_stepper(device)
    _assert_equal(_steps(make, model), _steps(make, reference))
    assert static_runs == [4 * 3] * 6  # 3 sentences rounded to 4 memory rows, 3 beams each


def test_greedy_generation_equals_the_reference(device: str, static_runs: list[int]) -> None:
    reference, model = _pair("decoder", device, position="rope", n_kv_heads=2, norm_position="pre")
    prompts = [[1, 5, 6, 7, 8], [1, 9], [1, 11, 12]]
    want = generate(reference, prompts, max_new_tokens=9, greedy=True, stop_ids=())
    assert generate(model, prompts, max_new_tokens=9, greedy=True, stop_ids=()) == want
    assert static_runs == [4] * 8


@pytest.mark.parametrize("beam_size", [1, 4])
def test_translation_equals_the_reference(beam_size: int, device: str, static_runs: list[int]) -> None:
    reference, model = _pair("encoder-decoder", device, n_kv_heads=2)
    src = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0], [11, 12, 13, 2, 0]], device=device)
    want = translate(reference, src, beam_size=beam_size, max_len_b=10, n_best=beam_size)
    got = translate(model, src, beam_size=beam_size, max_len_b=10, n_best=beam_size)
    assert [[h.tokens for h in hyps] for hyps in got] == [[h.tokens for h in hyps] for hyps in want]
    for hyps, ref_hyps in zip(got, want):
        for h, r in zip(hyps, ref_hyps):
            assert h.score == pytest.approx(r.score, abs=1e-4)
    assert static_runs and set(static_runs) == {4 * beam_size}


def test_buffers_are_reused_from_call_to_call() -> None:
    """A second call of the same sizes takes the first call's buffers (a CUDA graph recorded on them stays valid)."""
    _, model = _pair("decoder")
    caches: list[StaticDecoderCache] = []
    real = StaticDecoderCache.adopt

    def adopt(self: StaticDecoderCache, rows: int, pool: object) -> bool:
        ok = real(self, rows, pool)
        caches.append(self)
        return ok

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(StaticDecoderCache, "adopt", adopt)
        generate(model, [[1, 5, 6]], max_new_tokens=4, greedy=True, stop_ids=())
        first = caches[-1]
        kv = first.static.kv if first.static is not None else None
        del first, caches[:]
        import gc

        gc.collect()  # the finished call's cache is dropped: its buffers go back to the pool
        generate(model, [[1, 7, 8]], max_new_tokens=4, greedy=True, stop_ids=())
        assert caches and caches[-1].static is not None and caches[-1].static.kv is kv


def test_a_longer_decode_than_the_buffers_falls_back_and_continues(static_runs: list[int]) -> None:
    """Past the buffers' positions the cache moves back, the reference grows it, and the next step adopts it again."""
    reference, model = _pair("decoder", position="rope")
    make = _lm_stepper("cpu", steps_capacity=1)  # capacity 5 + 1 -> buffers of 8 positions
    _assert_equal(_steps(make, model, n_steps=8, beams=1), _steps(make, reference, n_steps=8, beams=1))
    assert 0 < len(static_runs) < 8  # the steps at positions 8 ran the reference


def test_more_rows_than_the_buffers_fall_back() -> None:
    """A reorder to more rows than the buffers hold moves the cache back; decoding stays equal."""
    reference, model = _pair("decoder")
    make = _lm_stepper("cpu")

    def run(m: torch.nn.Module) -> list[torch.Tensor]:
        with eval_mode(m):
            stepper = make(m)
            out = [stepper.first(), stepper.step(torch.tensor([3, 4, 5]))]  # 3 rows in buffers of 4
            stepper.reorder(torch.tensor([0, 0, 1, 1, 2, 2]))
            out.append(stepper.step(torch.tensor([3, 4, 5, 6, 7, 8])))
            out.append(stepper.step(torch.tensor([9, 10, 11, 12, 13, 14])))
        return out

    _assert_equal(run(model), run(reference))


@pytest.mark.parametrize("variant", DECLINED)
def test_declined_configs_run_the_reference(variant: str, static_runs: list[int]) -> None:
    kw = DECLINED[variant]
    assert unsupported(ModelConfig.preset("tiny", arch="decoder", **kw))
    reference, model = _pair("decoder", **kw)
    assert not step_supports(model.decoder)
    make = _lm_stepper("cpu")
    _assert_equal(_steps(make, model, beams=1), _steps(make, reference, beams=1))
    assert static_runs == []


def test_hooks_and_attention_recorders_run_the_modules(static_runs: list[int]) -> None:
    reference, model = _pair("decoder")
    seen: list[int] = []
    handle = model.decoder.layers[0].ffn.register_forward_hook(lambda m, i, o: seen.append(1))
    make = _lm_stepper("cpu")
    _assert_equal(_steps(make, model, beams=1), _steps(make, reference, beams=1))
    handle.remove()
    assert static_runs == [] and len(seen) == 7  # the prompt and 6 steps, all through the modules
    model.decoder.layers[1].self_attn.recorder = lambda *args: None
    _assert_equal(_steps(make, model, beams=1), _steps(make, reference, beams=1))
    assert static_runs == []


def test_accelerate_substitutes_the_static_stack_on_cuda_only() -> None:
    _, model = _pair("decoder")
    assert substituted(model) == {"StaticDecodingStack": 1}
    cpu_model = accelerate(build_model(ModelConfig.preset("tiny", arch="decoder")).eval(), "decode")
    assert "StaticDecodingStack" not in substituted(cpu_model)
    assert bucket(1) == 1 and bucket(5) == 8 and bucket(8) == 8


def _compile_works() -> str | None:
    """None where torch.compile's default mode compiles and runs here, else why not."""
    try:
        fn = torch.compile(lambda x: x * 2 + 1, mode="default", dynamic=False)
        fn(torch.ones(2))
    except Exception as e:  # any failure means no compiler here
        return f"torch.compile does not run here: {type(e).__name__}: {e}"
    return None


@pytest.mark.slow
def test_the_compiled_step_equals_the_reference() -> None:
    """The inductor-compiled step (``compile="default"``: no CUDA graphs, so it runs on the CPU), LM and
    encoder-decoder with beams."""
    why = _compile_works()
    if why:
        pytest.skip(why)
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    reference, model = _pair("decoder", compile="default", position="rope", n_kv_heads=2)
    make = _lm_stepper("cpu")
    _assert_equal(_steps(make, model), _steps(make, reference))
    reference, model = _pair("encoder-decoder", compile="default")
    make = _seq2seq_stepper("cpu")
    _assert_equal(_steps(make, model), _steps(make, reference))
    assert counters["stats"]["unique_graphs"] - graphs == 2  # one whole graph per model: compiled, no graph break
    assert not counters["graph_break"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
def test_cuda_graph_step_equals_eager_decoding() -> None:
    """``accelerate(model, "decode")`` on CUDA takes the static step with ``torch.compile(mode="reduce-overhead")``;
    its steps (up to the compiled kernels' float rounding), greedy generation and beam search equal the eager
    reference's."""
    from torch._dynamo.utils import counters

    graphs, skips = counters["stats"]["unique_graphs"], counters["inductor"]["cudagraph_skips"]
    reference, model = _pair("decoder", "cuda", position="rope", n_kv_heads=2)
    model = accelerate(copy.deepcopy(reference), "decode")
    assert substituted(model) == {"StaticDecodingStack": 1}
    make = _lm_stepper("cuda")
    for _ in range(2):  # the second call replays the graphs recorded by the first
        _assert_equal(_steps(make, model), _steps(make, reference), atol=CUDA_ATOL)
    prompts = [[1, 5, 6, 7, 8], [1, 9]]
    want = generate(reference, prompts, max_new_tokens=9, greedy=True, stop_ids=())
    assert generate(model, prompts, max_new_tokens=9, greedy=True, stop_ids=()) == want
    reference = _pair("encoder-decoder", "cuda")[0]
    model = accelerate(copy.deepcopy(reference), "decode")
    src = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0]], device="cuda")
    _assert_equal(_steps(_seq2seq_stepper("cuda"), model), _steps(_seq2seq_stepper("cuda"), reference),
                  atol=CUDA_ATOL)
    want = translate(reference, src, beam_size=4, max_len_b=10)
    assert [h[0].tokens for h in translate(model, src, beam_size=4, max_len_b=10)] == [h[0].tokens for h in want]
    assert counters["stats"]["unique_graphs"] > graphs  # compiled ...
    assert counters["inductor"]["cudagraph_skips"] == skips  # ... into CUDA graphs, none skipped
