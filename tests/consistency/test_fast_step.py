"""The flat decoding step (aiayn.accel.cpu.fast_step), which a model accelerated for decoding takes by itself, equals
the step through the modules and the reference model's step, for every variant."""

from __future__ import annotations

import copy

import pytest
import torch

from aiayn import ModelConfig, build_model
from aiayn.accel import accelerate
from aiayn.accel.cpu.fast_step import FastDecoderStep
from aiayn.accel.cpu.packed import frozen_block, frozen_weights
from aiayn.accel.cpu.settings import SETTINGS
from aiayn.generate import LMStepper, Seq2SeqStepper, generate, translate
from aiayn.generate.lm import left_pad
from aiayn.generate.steppers import eval_mode

ATOL = 1e-5

VARIANTS = {
    "paper": dict(),
    "none": dict(position="none"),
    "learned_gelu": dict(position="learned", activation="gelu"),
    "rope_gqa": dict(position="rope", n_kv_heads=2),
    "alibi_mqa_pre_rms_swiglu": dict(position="alibi", n_kv_heads=1, norm_position="pre", norm="rmsnorm",
                                     activation="swiglu"),
    "t5_geglu": dict(position="t5", activation="geglu"),
    "deepnorm": dict(deepnorm=True),
}
DECODER_ONLY = {**VARIANTS, "sliding_window": dict(position="rope", sliding_window=3)}


def _reference(arch: str, **kw: object) -> torch.nn.Module:
    """The core's model, un-accelerated."""
    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", arch=arch, vocab_size=61, **kw)
    return build_model(cfg).eval()


def _model(arch: str, **kw: object) -> torch.nn.Module:
    """The model translate and generate users get (load_pretrained, the CLI): accelerated for decoding."""
    return accelerate(_reference(arch, **kw), "decode", accel="auto")


@pytest.fixture
def fast_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows of every step that ran as the flat program (FastDecoderStep.__call__)."""
    calls: list[int] = []
    real = FastDecoderStep.__call__

    def counted(self: FastDecoderStep, ids: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        calls.append(ids.shape[0])
        return real(self, ids, *args, **kwargs)

    monkeypatch.setattr(FastDecoderStep, "__call__", counted)
    return calls


def _steps(make_stepper, fast: bool, monkeypatch: pytest.MonkeyPatch, model: torch.nn.Module) -> list[torch.Tensor]:
    """Logits of a first step and four more with beam-like reorders in between, through one stepper of ``model``,
    with the accelerator's flat step on or off."""
    monkeypatch.setattr(SETTINGS, "fast_decode_step", bool(fast))
    g = torch.Generator().manual_seed(1)
    with eval_mode(model):
        stepper = make_stepper(model)
        logits = [stepper.first()]
        n = logits[0].shape[0]
        stepper.reorder(torch.arange(n).repeat_interleave(3), group=3)  # 3 beams per row
        for _ in range(4):
            tokens = torch.randint(3, 61, (3 * n,), generator=g)
            logits.append(stepper.step(tokens))
            perm = torch.randint(0, 3, (n, 3), generator=g) + 3 * torch.arange(n)[:, None]
            stepper.reorder(perm.view(-1), same_sources=True, group=3)
    return logits


def _assert_fast_equals_modules_and_reference(make, model, reference, monkeypatch, fast_calls,  # noqa: ANN001
                                              expected_calls: list[int]) -> None:
    """The accelerated model's steps with the flat program (which made ``expected_calls``), its steps with the setting
    off, and the reference model's steps: all equal, and neither of the last two took the flat program."""
    fast = _steps(make, True, monkeypatch, model)
    assert fast_calls == expected_calls
    modules = _steps(make, False, monkeypatch, model)
    want = _steps(make, True, monkeypatch, reference)
    assert len(fast_calls) == len(expected_calls)  # neither the setting off nor the reference model took it
    for got, mod, ref in zip(fast, modules, want, strict=True):
        torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)
        torch.testing.assert_close(mod, ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_seq2seq_fast_step_equals_module_step(variant: str, monkeypatch: pytest.MonkeyPatch,
                                             fast_calls: list[int]) -> None:
    """Padded sources, 3 beams per sentence folded over one memory row, reordered every step: the accelerated
    model's flat steps (its first too) equal its module steps and the reference model's."""
    reference = _reference("encoder-decoder", **VARIANTS[variant])
    model = accelerate(copy.deepcopy(reference), "decode", accel="auto")
    src = torch.randint(3, 61, (2, 7))
    src[1, 5:] = 0  # padding: the cross-attention mask is in play

    def make(m: torch.nn.Module) -> Seq2SeqStepper:
        return Seq2SeqStepper(m, src, capacity=8, src_is_token=src != 0)

    # every step, the first included, took the flat program
    _assert_fast_equals_modules_and_reference(make, model, reference, monkeypatch, fast_calls, [2, 6, 6, 6, 6])


@pytest.mark.parametrize("variant", list(DECODER_ONLY))
def test_lm_fast_step_equals_module_step(variant: str, monkeypatch: pytest.MonkeyPatch,
                                        fast_calls: list[int]) -> None:
    """Left-padded prompts (a key mask over the cache, per-row positions) and reorders, as batched generation: the
    accelerated model's flat steps equal its module steps and the reference model's."""
    reference = _reference("decoder", **DECODER_ONLY[variant])
    model = accelerate(copy.deepcopy(reference), "decode", accel="auto")
    ids, is_token = left_pad([[5, 6, 7, 8, 9], [10, 11]], pad_id=0)

    def make(m: torch.nn.Module) -> LMStepper:
        return LMStepper(m, ids, is_token, capacity=4)  # smaller than needed: the cache grows

    # every step after the prompts' prefill took the flat program
    _assert_fast_equals_modules_and_reference(make, model, reference, monkeypatch, fast_calls, [6, 6, 6, 6])


def test_translate_and_generate_are_the_same_either_way(monkeypatch: pytest.MonkeyPatch,
                                                        fast_calls: list[int]) -> None:
    """Whole beam-search translations (finished sentences leave the batch) and greedy generations: the accelerated
    models with the flat step on and off, and the reference models."""
    references = {"s2s": _reference("encoder-decoder"), "lm": _reference("decoder", position="rope", n_kv_heads=2)}
    accelerated = {k: accelerate(copy.deepcopy(m), "decode", accel="auto") for k, m in references.items()}
    src = torch.randint(3, 61, (5, 9))
    src[2, 4:] = 0
    out = {}
    for fast, models in (("0", accelerated), ("1", accelerated), ("reference", references)):
        monkeypatch.setattr(SETTINGS, "fast_decode_step", fast != "0")
        fast_calls.clear()
        hyps = translate(models["s2s"], src, beam_size=4, max_len_a=1.0, max_len_b=5, n_best=2)
        gen = [generate(models["lm"], [[5, 6, 7], [8]], max_new_tokens=6, stop_ids=(), greedy=True),
               generate(models["lm"], [[5, 6, 7], [8]], max_new_tokens=6, stop_ids=(), seed=3)]
        out[fast] = ([[(h.tokens, round(h.score, 4)) for h in sent] for sent in hyps], gen)
        assert bool(fast_calls) == (fast == "1")
    assert out["0"] == out["1"] == out["reference"]


def test_hooks_training_and_unfrozen_weights_keep_the_modules() -> None:
    """The flat program would skip hooks and dropout, and plans only hold inside a frozen_weights block."""
    model = _model("encoder-decoder")
    stack = model.decoder
    assert FastDecoderStep.build(stack) is None  # outside a decoding call's frozen block
    with eval_mode(model):
        assert FastDecoderStep.build(stack) is not None
        handle = stack.layers[1].ffn.register_forward_hook(lambda *a: None)
        assert FastDecoderStep.build(stack) is None
        handle.remove()
        handle = torch.nn.modules.module.register_module_forward_hook(lambda *a: None)
        assert FastDecoderStep.build(stack) is None
        handle.remove()
    model.train()
    with torch.inference_mode(), frozen_weights():
        assert FastDecoderStep.build(stack) is None  # dropout is on


def test_a_hook_on_a_decoder_layer_still_fires_in_translate(fast_calls: list[int]) -> None:
    model = _model("encoder-decoder")
    calls = []
    model.decoder.layers[0].register_forward_hook(lambda m, i, o: calls.append(i[0].shape[1]))
    translate(model, torch.randint(3, 61, (2, 5)), beam_size=2, max_len_a=0.0, max_len_b=3)
    assert len(calls) >= 3 and set(calls) == {1}  # the first step and every later one
    assert fast_calls == [] and model.decoder.__dict__["_fast_step"][1] is None  # declined for the call


def test_the_step_is_built_once_per_decoding_call(fast_calls: list[int]) -> None:
    """The accelerated stack keeps its flat step for the decoding call's frozen block and builds a new one for the
    next call (whose weights may have changed in between); copies leave it behind."""
    model = _model("encoder-decoder")
    src = torch.randint(3, 61, (2, 5))
    translate(model, src, beam_size=2, max_len_a=0.0, max_len_b=3)
    block, step = model.decoder.__dict__["_fast_step"]
    assert isinstance(step, FastDecoderStep) and block > 0 and fast_calls
    assert frozen_block() == 0  # the call's block has ended
    translate(model, src, beam_size=2, max_len_a=0.0, max_len_b=3)
    block2, step2 = model.decoder.__dict__["_fast_step"]
    assert block2 != block and step2 is not step
    assert "_fast_step" not in copy.deepcopy(model).decoder.__dict__



def test_first_step_projects_the_memory_and_takes_the_fast_path(monkeypatch: pytest.MonkeyPatch,
                                                                fast_calls: list[int]) -> None:
    """The first step fills the cross-attention caches without a module pass over the decoder's layers."""
    model = _model("encoder-decoder")
    src = torch.randint(3, 61, (2, 7))
    monkeypatch.setattr(SETTINGS, "fast_decode_step", True)
    with eval_mode(model):
        want = [c.project_memory(model.encode(src)[0]) for c in (lay.cross_attn for lay in model.decoder.layers)]
        stepper = Seq2SeqStepper(model, src, capacity=8)
        for lay in model.decoder.layers:
            monkeypatch.setattr(lay, "forward", lambda *a, **k: pytest.fail("the first step went through the modules"))
        assert stepper.first().shape == (2, 61)
        assert fast_calls == [2]
    assert stepper.memory is None
    for (k, v), cache in zip(want, stepper.cache.cross_attn):
        torch.testing.assert_close(cache.k, k, atol=0, rtol=0)
        torch.testing.assert_close(cache.v, v, atol=0, rtol=0)
