"""A decoding step's layers as native calls (aiayn.accel.cpu.native_step) equal the flat Python loop of
aiayn.accel.cpu.fast_step, through both native products (few rows, many rows), for the variants they serve; the
others keep the Python loop. The models are accelerated for decoding (:func:`aiayn.accel.accelerate`), whose stacks
take the flat step by themselves; whole decodes also equal the reference model's."""

from __future__ import annotations

import pytest
import torch

from aiayn import ModelConfig, build_model
from aiayn.accel import accelerate
from aiayn.accel.cpu import native, native_step
from aiayn.accel.cpu.fast_step import FastDecoderStep, FastEncoder
from aiayn.accel.cpu.gemm import use_fp32_backend
from aiayn.accel.cpu.packed import PackedLinear, unpack_output_layers
from aiayn.accel.cpu.quantize import quantize_int8
from aiayn.accel.cpu.settings import SETTINGS
from aiayn.generate import LMStepper, Seq2SeqStepper, generate, translate
from aiayn.generate.lm import left_pad
from aiayn.generate.steppers import eval_mode

pytestmark = pytest.mark.skipif(native.library() is None, reason="the native kernels are not built here")

ATOL = 1e-5
BEAMS = 3
SERVED = {  # variants the native layers serve
    "paper": dict(),  # post-norm LayerNorm, ReLU, sinusoidal positions
    "pre_gelu_learned": dict(norm_position="pre", activation="gelu", position="learned"),
    "gqa_no_positions": dict(n_kv_heads=2, position="none"),
    "deepnorm": dict(deepnorm=True),  # the residual's alpha != 1
    "llama": dict(position="rope", n_kv_heads=2, norm_position="pre", norm="rmsnorm", activation="swiglu"),
    "rope_geglu": dict(position="rope", activation="geglu"),
}
NOT_SERVED = {  # ... and some they leave to the Python loop (a position bias per head: no native form)
    "alibi": dict(position="alibi"),
    "t5": dict(position="t5"),
}
#: sentences (or prompts) per batch: 1 x 3 beams = 3 rows go through the few-rows product, 8 x 3 = 24 through the
#: panel product (on CPUs where it is preferred)
ROWS = {"few_rows": 1, "panel": 8}


def _reference(arch: str, **kw: object) -> torch.nn.Module:
    """The core's model, un-accelerated."""
    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", arch=arch, vocab_size=61, d_model=128, n_heads=4, d_ff=256, **kw)
    return build_model(cfg).eval()


def _model(arch: str, **kw: object) -> torch.nn.Module:
    """The same weights, accelerated for decoding (as load_pretrained and the CLI give them)."""
    return accelerate(_reference(arch, **kw), "decode", accel="auto")


def _skip_unless_kernel(rows: str, model: torch.nn.Module) -> None:
    """Skip a case that needs the panel product where it does not serve (the few-row product serves everywhere)."""
    if rows == "panel":
        _skip_unless_panels(model)


def _skip_unless_panels(model: torch.nn.Module) -> None:
    if not native.panel_linear_preferred():
        pytest.skip("the panel product serves many rows only on AVX2 CPUs without AVX-512")
    if any(isinstance(m, PackedLinear) and m.few_rows_only for m in model.modules()):
        pytest.skip("where oneDNN is not the fp32 backend (Intel CPUs) the layers leave many rows to torch's BLAS")


class _Counting:
    """Counts the steps the native layers took (and built ones) while patched in."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.steps = self.built = 0
        build, call = native_step.NativeLayers.build.__func__, native_step.NativeLayers.__call__

        def counted_build(cls, *a, **k):
            made = build(cls, *a, **k)
            self.built += made is not None
            return made

        def counted_call(layers, *a, **k):
            out = call(layers, *a, **k)
            self.steps += out is not None
            return out

        monkeypatch.setattr(native_step.NativeLayers, "build", classmethod(counted_build))
        monkeypatch.setattr(native_step.NativeLayers, "__call__", counted_call)


def _steps(make_stepper, native_layers: bool, monkeypatch: pytest.MonkeyPatch, model: torch.nn.Module,
           n: int) -> list[torch.Tensor]:
    """Logits of a first step and four more with beam-like reorders in between (the first expands each of the n
    sentences to BEAMS beams)."""
    monkeypatch.setattr(SETTINGS, "native_layers", bool(native_layers))
    g = torch.Generator().manual_seed(1)
    flat_steps = []  # every step must take the flat step (FastDecoderStep), native layers or its Python loop
    real_step = FastDecoderStep.__call__
    with eval_mode(model), monkeypatch.context() as patch:
        patch.setattr(FastDecoderStep, "__call__",
                      lambda self, *a, **k: flat_steps.append(1) or real_step(self, *a, **k))
        stepper = make_stepper()
        logits = [stepper.first()]
        stepper.reorder(torch.arange(n).repeat_interleave(BEAMS), group=BEAMS)
        for _ in range(4):
            logits.append(stepper.step(torch.randint(3, 61, (BEAMS * n,), generator=g)))
            perm = torch.randint(0, BEAMS, (n, BEAMS), generator=g) + BEAMS * torch.arange(n)[:, None]
            stepper.reorder(perm.view(-1), same_sources=True, group=BEAMS)
    # an encoder-decoder's first step too; a decoder-only model's prompt goes through the modules
    assert len(flat_steps) == (5 if isinstance(stepper, Seq2SeqStepper) else 4)
    return logits


def _seq2seq_maker(model: torch.nn.Module, n: int):
    src = torch.randint(3, 61, (n, 7), generator=torch.Generator().manual_seed(2))
    src[0, 5:] = 0  # padding: the cross-attention mask is in play
    return lambda: Seq2SeqStepper(model, src, capacity=8, src_is_token=src != 0)


def _lm_maker(model: torch.nn.Module, n: int):
    prompts = [[5, 6, 7, 8, 9], [10, 11]] * n
    ids, is_token = left_pad(prompts[:n], pad_id=0)  # left padding: a key mask over the cache
    return lambda: LMStepper(model, ids, is_token, capacity=4)  # smaller than needed: the cache grows


@pytest.mark.parametrize("rows", list(ROWS))
@pytest.mark.parametrize("variant", list(SERVED))
@pytest.mark.parametrize("arch", ["encoder-decoder", "decoder"])
def test_native_layers_equal_the_python_loop(arch: str, variant: str, rows: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    model, n = _model(arch, **SERVED[variant]), ROWS[rows]
    _skip_unless_kernel(rows, model)
    _native_equal_to_the_loop(arch, model, n, monkeypatch)


def _native_equal_to_the_loop(arch: str, model: torch.nn.Module, n: int,
                              monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """The steps' logits with the native layers, after checking that every step took them (an encoder-decoder's
    first step too; a decoder-only model's prompt goes through the modules) and that they equal the Python loop's."""
    make = (_seq2seq_maker if arch == "encoder-decoder" else _lm_maker)(model, n)
    want = _steps(make, False, monkeypatch, model, n)
    counting = _Counting(monkeypatch)
    got = _steps(make, True, monkeypatch, model, n)
    assert counting.built >= 1 and counting.steps == (5 if arch == "encoder-decoder" else 4)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=ATOL, rtol=0)
    return got


@pytest.mark.parametrize("variant", ["paper", "llama"])
@pytest.mark.parametrize("arch", ["encoder-decoder", "decoder"])
def test_native_layers_serve_where_onednn_is_not_the_backend(arch: str, variant: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Where torch's BLAS is the fp32 backend (Intel CPUs), the inference layout makes every linear layer a
    PackedLinear for a decoding step's few rows alone: the steps take the native layers, and give what the plain
    ``nn.Linear`` layers of that host's earlier layout give."""
    with use_fp32_backend("torch"):
        model, n = _model(arch, **SERVED[variant]), ROWS["few_rows"]
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        assert all(type(m) is PackedLinear for m in linears)
        assert all(m.few_rows_only for m in linears)  # the output layer too: under 256 wide, not oneDNN-packed
        make = (_seq2seq_maker if arch == "encoder-decoder" else _lm_maker)(model, n)
        counting = _Counting(monkeypatch)
        got = _steps(make, True, monkeypatch, model, n)
        assert counting.built >= 1 and counting.steps == (5 if arch == "encoder-decoder" else 4)
        unpack_output_layers(model, few_rows_only=True)
        assert sum(type(m) is torch.nn.Linear for m in model.modules()) == len(linears)
        want = _steps(make, True, monkeypatch, model, n)
    assert counting.steps == (5 if arch == "encoder-decoder" else 4)  # none more: plain layers, the Python loop
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=ATOL, rtol=0)


@pytest.mark.parametrize("variant", ["paper", "pre_gelu_learned", "llama"])
@pytest.mark.parametrize("arch", ["encoder-decoder", "decoder"])
def test_int8_models_take_the_native_layers_too(arch: str, variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An int8 copy's layers (Int8Linear: the weight-only native kernel at a step's few rows) run as native calls,
    equal to the same int8 layers' Python loop, and close to the fp32 model."""
    fp32, n = _model(arch, **SERVED[variant]), ROWS["few_rows"]
    got = _native_equal_to_the_loop(arch, quantize_int8(fp32), n, monkeypatch)
    full = _steps((_seq2seq_maker if arch == "encoder-decoder" else _lm_maker)(fp32, n), True, monkeypatch, fp32, n)
    for g, f in zip(got, full):
        assert ((g - f).norm() / f.norm()).item() < 0.05


@pytest.mark.parametrize("variant", list(NOT_SERVED))
def test_variants_without_a_native_form_keep_the_python_loop(variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model, n = _model("decoder", **NOT_SERVED[variant]), ROWS["few_rows"]
    counting = _Counting(monkeypatch)
    _steps(_lm_maker(model, n), True, monkeypatch, model, n)
    assert counting.steps == 0


def test_translate_and_generate_are_the_same_with_and_without(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whole beam searches (sentences finish and leave the batch) and greedy generations, at few rows and many; the
    fp32 ones also equal the reference models'."""
    s2s, lm = _model("encoder-decoder"), _model("decoder", norm_position="pre", activation="gelu")
    ref_s2s, ref_lm = _reference("encoder-decoder"), _reference("decoder", norm_position="pre", activation="gelu")
    s2s_int8, lm_int8 = quantize_int8(s2s), quantize_int8(lm)  # int8 copies too (a batch-1 step's rows only)
    src = torch.randint(3, 61, (9, 9), generator=torch.Generator().manual_seed(3))
    src[2, 4:] = 0
    tokens, scores = {}, {}
    for flag in ("0", "1"):
        monkeypatch.setattr(SETTINGS, "native_layers", flag == "1")
        hyps = [translate(s2s, s, beam_size=4, max_len_a=1.0, max_len_b=5, n_best=2) for s in (src[:1], src)]
        hyps.append(translate(s2s_int8, src[:1], beam_size=4, max_len_a=1.0, max_len_b=5, n_best=2))
        gen = generate(lm, [[5, 6, 7], [8]] * 4, max_new_tokens=6, stop_ids=(), greedy=True)
        gen += generate(lm_int8, [[5, 6, 7]], max_new_tokens=6, stop_ids=(), greedy=True)
        tokens[flag] = ([[[h.tokens for h in sent] for sent in batch] for batch in hyps], gen)
        scores[flag] = torch.tensor([h.score for batch in hyps for sent in batch for h in sent])
    assert tokens["0"] == tokens["1"]
    torch.testing.assert_close(scores["1"], scores["0"], atol=1e-4, rtol=0)  # sums of ~10 log-probabilities
    ref_hyps = [translate(ref_s2s, s, beam_size=4, max_len_a=1.0, max_len_b=5, n_best=2) for s in (src[:1], src)]
    ref_gen = generate(ref_lm, [[5, 6, 7], [8]] * 4, max_new_tokens=6, stop_ids=(), greedy=True)
    assert tokens["1"][0][:2] == [[[h.tokens for h in sent] for sent in batch] for batch in ref_hyps]
    assert tokens["1"][1][:8] == ref_gen
    ref_scores = torch.tensor([h.score for batch in ref_hyps for sent in batch for h in sent])
    torch.testing.assert_close(scores["1"][:len(ref_scores)], ref_scores, atol=1e-4, rtol=0)


@pytest.mark.parametrize("rows", list(ROWS))
@pytest.mark.parametrize("variant", ["paper", "pre_gelu_learned", "gqa_no_positions", "deepnorm"])
def test_native_encoder_equals_the_modules(variant: str, rows: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An encoder's pass as native calls, with padded sentences (the key mask) of 1 or 8 x 3 sentences, equals the
    reference model's; the accelerated model's own encoder takes it."""
    reference = _reference("encoder-decoder", **SERVED[variant])
    model = _model("encoder-decoder", **SERVED[variant])
    _skip_unless_panels(model)  # 7 tokens a sentence: more rows than the few-row product takes, at either size
    n = BEAMS * ROWS[rows]  # as many sentences as the decoding tests have rows
    src = torch.randint(3, 61, (n, 7), generator=torch.Generator().manual_seed(4))
    src[0, 5:] = 0
    monkeypatch.setattr(SETTINGS, "native_layers", True)
    encodes = []
    real_encode = native_step.NativeLayers.encode
    monkeypatch.setattr(native_step.NativeLayers, "encode",
                        lambda self, *a, **k: encodes.append(1) or real_encode(self, *a, **k))
    with eval_mode(model):
        fast = FastEncoder.build(model.encoder)
        assert fast is not None
        got = fast(src, src != 0)
        assert got is not None and encodes == [1]
        own, _, _ = model.encode(src, src != 0)
        assert encodes == [1, 1]  # the accelerated encoder took the native pass by itself
    with eval_mode(reference):
        want, _, _ = reference.encode(src, src != 0)
    assert encodes == [1, 1]
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    torch.testing.assert_close(own, got, atol=0, rtol=0)


def test_native_encoder_leaves_rope_and_unbuilt_cases_to_the_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model("encoder-decoder", position="rope")
    src = torch.randint(3, 61, (3, 7))
    with eval_mode(model):
        assert FastEncoder.build(model.encoder)(src, src != 0) is None  # RoPE: the modules
        monkeypatch.setattr(SETTINGS, "native_layers", False)
        assert FastEncoder.build(model.encoder)(src, src != 0) is None
        monkeypatch.setattr(SETTINGS, "native_layers", True)
        bf16 = _model("encoder-decoder").to(torch.bfloat16)
        assert FastEncoder.build(bf16.encoder)(src, src != 0) is None  # fp32 only
    assert FastEncoder.build(model.encoder) is None  # outside a decoding call's frozen block

