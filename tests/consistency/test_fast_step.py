"""The flat decoding step (aiayn.generate.fast_step) equals the step through the modules, for every variant."""

from __future__ import annotations

import pytest
import torch

from aiayn import ModelConfig, build_model
from aiayn.generate import LMStepper, Seq2SeqStepper, generate, translate
from aiayn.generate.fast_step import ENV_VAR, FastDecoderStep
from aiayn.generate.lm import left_pad
from aiayn.generate.steppers import eval_mode
from aiayn.nn.layout import cpu_inference_layout
from aiayn.nn.packed import frozen_weights

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


def _model(arch: str, **kw: object) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", arch=arch, vocab_size=61, **kw)
    return cpu_inference_layout(build_model(cfg).eval())  # the layout translate and generate users get


def _steps(make_stepper, fast: bool, monkeypatch: pytest.MonkeyPatch, model: torch.nn.Module) -> list[torch.Tensor]:
    """Logits of a first step and four more with beam-like reorders in between, through one stepper."""
    monkeypatch.setenv(ENV_VAR, "1" if fast else "0")
    g = torch.Generator().manual_seed(1)
    with eval_mode(model):
        stepper = make_stepper()
        assert (stepper.fast is not None) == fast
        logits = [stepper.first()]
        n = logits[0].shape[0]
        stepper.reorder(torch.arange(n).repeat_interleave(3), group=3)  # 3 beams per row
        for _ in range(4):
            tokens = torch.randint(3, 61, (3 * n,), generator=g)
            logits.append(stepper.step(tokens))
            perm = torch.randint(0, 3, (n, 3), generator=g) + 3 * torch.arange(n)[:, None]
            stepper.reorder(perm.view(-1), same_sources=True, group=3)
    return logits


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_seq2seq_fast_step_equals_module_step(variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Padded sources, 3 beams per sentence folded over one memory row, reordered every step."""
    model = _model("encoder-decoder", **VARIANTS[variant])
    src = torch.randint(3, 61, (2, 7))
    src[1, 5:] = 0  # padding: the cross-attention mask is in play

    def make() -> Seq2SeqStepper:
        return Seq2SeqStepper(model, src, capacity=8, src_is_token=src != 0)

    for got, want in zip(_steps(make, True, monkeypatch, model), _steps(make, False, monkeypatch, model)):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("variant", list(DECODER_ONLY))
def test_lm_fast_step_equals_module_step(variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Left-padded prompts (a key mask over the cache, per-row positions) and reorders, as batched generation."""
    model = _model("decoder", **DECODER_ONLY[variant])
    ids, is_token = left_pad([[5, 6, 7, 8, 9], [10, 11]], pad_id=0)

    def make() -> LMStepper:
        return LMStepper(model, ids, is_token, capacity=4)  # smaller than needed: the cache grows

    for got, want in zip(_steps(make, True, monkeypatch, model), _steps(make, False, monkeypatch, model)):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def test_translate_and_generate_are_the_same_either_way(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whole beam-search translations (finished sentences leave the batch) and greedy generations."""
    s2s = _model("encoder-decoder")
    lm = _model("decoder", position="rope", n_kv_heads=2)
    src = torch.randint(3, 61, (5, 9))
    src[2, 4:] = 0
    out = {}
    for fast in ("0", "1"):
        monkeypatch.setenv(ENV_VAR, fast)
        hyps = translate(s2s, src, beam_size=4, max_len_a=1.0, max_len_b=5, n_best=2)
        gen = [generate(lm, [[5, 6, 7], [8]], max_new_tokens=6, stop_ids=(), greedy=True),
               generate(lm, [[5, 6, 7], [8]], max_new_tokens=6, stop_ids=(), seed=3)]
        out[fast] = ([[(h.tokens, round(h.score, 4)) for h in sent] for sent in hyps], gen)
    assert out["0"] == out["1"]


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


def test_a_hook_on_a_decoder_layer_still_fires_in_translate() -> None:
    model = _model("encoder-decoder")
    calls = []
    model.decoder.layers[0].register_forward_hook(lambda m, i, o: calls.append(i[0].shape[1]))
    translate(model, torch.randint(3, 61, (2, 5)), beam_size=2, max_len_a=0.0, max_len_b=3)
    assert len(calls) >= 3 and set(calls) == {1}  # the first step and every later one



def test_first_step_projects_the_memory_and_takes_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first step fills the cross-attention caches without a module pass over the decoder."""
    model = _model("encoder-decoder")
    src = torch.randint(3, 61, (2, 7))
    monkeypatch.setenv(ENV_VAR, "1")
    with eval_mode(model):
        want = [c.project_memory(model.encode(src)[0]) for c in (lay.cross_attn for lay in model.decoder.layers)]
        stepper = Seq2SeqStepper(model, src, capacity=8)
        monkeypatch.setattr(model, "decode", lambda *a, **k: pytest.fail("the first step went through the modules"))
        assert stepper.first().shape == (2, 61)
    assert stepper.memory is None
    for (k, v), cache in zip(want, stepper.cache.cross_attn):
        torch.testing.assert_close(cache.k, k, atol=0, rtol=0)
        torch.testing.assert_close(cache.v, v, atol=0, rtol=0)
