"""Attention weights captured from fast passes equal the reference attention's weights.

:func:`aiayn.inspect.capture_attention` records, from the pass that computes the output (SDPA, the CPU
accelerator's attention kernel), ``softmax(q k^T * scale + bias, masked)``. These tests hold the recorded weights equal
(1e-6) to what the reference backend returns with ``return_weights=True``, for every family, mask and position
scheme, for a padded batch, and step by step through the KV cache while decoding (accelerated too).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from aiayn import accel
from aiayn.accel.cpu import functional as cpu_kernels
from aiayn.config import ModelConfig
from aiayn.generate.lm import generate
from aiayn.generate.translate import greedy_translate
from aiayn.inspect import capture_attention
from aiayn.models.build import build_model
from aiayn.nn.attention import MultiHeadAttention
from aiayn.nn.cache import CrossAttnCache

ATOL = 1e-6
V, MAX = 40, 64
BASE = dict(vocab_size=V, d_model=32, n_heads=4, n_layers=2, d_ff=48, max_len=MAX, dropout=0.0, attn_dropout=0.0)

FAMILIES: dict[str, dict[str, Any]] = {
    "paper (sinusoidal, post-LN, enc-dec)": dict(preset="paper-base"),
    "gpt2 (learned)": dict(preset="gpt2-small"),
    "llama (RoPE, GQA)": dict(preset="llama", n_kv_heads=2),
    "alibi decoder": dict(arch="decoder", position="alibi"),
    "t5 bias (enc-dec)": dict(preset="t5-small"),
    "sliding window": dict(preset="llama", n_kv_heads=2, sliding_window=3),
    "bert (encoder, token types)": dict(preset="bert-base"),
    "block-sparse mask": dict(arch="decoder", attention_mask="block_sparse"),
    "local+global mask": dict(arch="decoder", attention_mask="local_global"),
    "soft-capped scores, QK-norm": dict(arch="decoder", attn_logit_softcap=5.0, qk_norm=True),
}


def _config(case: dict[str, Any]) -> ModelConfig:
    case = dict(case)
    preset = case.pop("preset", None)
    fields = {**BASE, **case}
    if preset in ("paper-base", "t5-small", "bert-base"):
        fields["n_encoder_layers"] = 2
    valid = {k: v for k, v in fields.items() if k in ModelConfig.__dataclass_fields__}
    return ModelConfig.preset(preset, **valid) if preset else ModelConfig(**valid)


def _model(case: dict[str, Any], accelerated: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(_config(case)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))  # norms and biases away from their initial values
    return accel.accelerate(model, "decode") if accelerated else model


def _padded(batch: int = 3, length: int = 9, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (batch, length), generator=g)
    is_token = torch.ones(batch, length, dtype=torch.bool)
    is_token[1, -3:] = False  # right padding in row 1
    return ids.masked_fill(~is_token, 0), is_token


def _reference_and_captured(model: torch.nn.Module, ids: torch.Tensor, is_token: torch.Tensor):
    arch = model.config.arch
    with torch.no_grad():
        if arch == "encoder-decoder":
            tgt = ids[:, :6].clone()
            want = model(ids, tgt, src_is_token=is_token, return_weights=True).attentions
            with capture_attention(model) as cap:
                model(ids, tgt, src_is_token=is_token)
            pairs = [("encoder", "encoder"), ("decoder", "self"), ("cross", "cross")]
        elif arch == "decoder":
            want = model(ids, is_token=is_token, return_weights=True).attentions
            with capture_attention(model) as cap:
                model(ids, is_token=is_token)
            pairs = [("decoder", "self")]
        else:
            want = model(ids, is_token, return_weights=True).attentions
            with capture_attention(model) as cap:
                model(ids, is_token)
            pairs = [("encoder", "encoder")]
    return want, cap, pairs


@pytest.mark.parametrize("accelerated", [False, True], ids=["reference-modules", "accelerated"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_captured_weights_equal_the_reference_weights(family: str, accelerated: bool) -> None:
    model = _model(FAMILIES[family], accelerated)
    ids, is_token = _padded()
    want, cap, pairs = _reference_and_captured(model, ids, is_token)
    for kind, name in pairs:
        layers = cap.kind(kind)
        assert len(layers) == len(want[name]) and all(len(calls) == 1 for calls in layers)
        for layer, (calls, ref) in enumerate(zip(layers, want[name])):
            got = calls[0].weights
            assert got.shape == ref.shape, (kind, layer)
            torch.testing.assert_close(got, ref.float(), atol=ATOL, rtol=0, msg=f"{kind} layer {layer}")
            if calls[0].allowed is not None:  # what the mask forbade has weight exactly 0
                assert not bool(got.masked_select(~calls[0].allowed.expand_as(got)).any())


def test_only_the_chosen_layers_and_kinds_record() -> None:
    model = _model(FAMILIES["paper (sinusoidal, post-LN, enc-dec)"], accelerated=False)
    ids, is_token = _padded()
    with torch.no_grad(), capture_attention(model, layers=[1], kinds=["cross"]) as cap:
        model(ids, ids[:, :4], src_is_token=is_token)
    assert sorted(cap.calls) == ["decoder.layers.1.cross_attn"]
    assert all(m.recorder is None for m in model.modules() if isinstance(m, MultiHeadAttention))


@pytest.mark.parametrize("accelerated", [False, True], ids=["reference-modules", "accelerated"])
@pytest.mark.parametrize("family", ["gpt2 (learned)", "llama (RoPE, GQA)", "alibi decoder", "sliding window"])
def test_weights_recorded_while_decoding_equal_the_full_pass(family: str, accelerated: bool,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Greedy generation records one call per step; step t's weights are row t of a full pass over the output."""
    steps = []
    original = cpu_kernels.cpu_attention_kernel

    def counted(q, *args):
        steps.append(q.shape[2])
        return original(q, *args)

    monkeypatch.setattr(cpu_kernels, "cpu_attention_kernel", counted)
    model = _model(FAMILIES[family], accelerated)
    prompt = [3, 7, 9, 11]
    with capture_attention(model, kinds=["decoder"]) as cap:
        out = generate(model, [prompt], max_new_tokens=6, greedy=True, stop_ids=())[0]
    assert (1 in steps) == accelerated  # the accelerator's kernel served the decoding steps, and they recorded
    seq = torch.tensor([prompt + out[:-1]])  # every token the decoder read
    with torch.no_grad():
        full = model(seq, return_weights=True).attentions["self"]
    for layer, calls in enumerate(cap.kind("decoder")):
        assert calls[0].weights.shape[2] == len(prompt)  # the prefill, then one row per step
        for step, call in enumerate(calls[1:]):
            got, want = call.weights[0, :, 0], full[layer][0, :, len(prompt) + step]  # (H, S_step), (H, S_full)
            if model.config.sliding_window is not None:
                # the core's rolling cache holds the window's keys in slot order, not position order: compare the
                # weights as sets (the keys outside the window have weight 0 on both sides)
                got, want = got.sort(-1, descending=True).values, want.sort(-1, descending=True).values
                n = min(got.shape[-1], want.shape[-1])
                assert not bool(got[:, n:].any()) and not bool(want[:, n:].any())
                got, want = got[:, :n], want[:, :n]
            else:
                want = want[:, :got.shape[-1]]
            torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
        assert len(calls) == 1 + len(out) - 1


@pytest.mark.parametrize("accelerated", [False, True], ids=["reference-modules", "accelerated"])
def test_cross_attention_recorded_while_translating_equals_the_full_pass(accelerated: bool) -> None:
    model = _model(FAMILIES["paper (sinusoidal, post-LN, enc-dec)"], accelerated)
    src = torch.tensor([[5, 9, 13, 17, 21, 25, 2]])
    with capture_attention(model) as cap:
        hyp = greedy_translate(model, src, max_len_b=6, bos_id=1, eos_id=2, pad_id=0)[0]
    tgt = torch.tensor([[1] + [t for t in hyp.tokens if t != 2]])
    with torch.no_grad():
        full = model(src, tgt, return_weights=True).attentions
    for kind, name in (("cross", "cross"), ("decoder", "self")):
        for layer, calls in enumerate(cap.kind(kind)):
            assert len(calls) == tgt.shape[1]  # one call per decoding step
            for step, call in enumerate(calls):
                s = call.weights.shape[-1]
                torch.testing.assert_close(call.weights[0, :, 0], full[name][layer][0, :, step, :s], atol=ATOL,
                                           rtol=0, msg=f"{kind} layer {layer} step {step}")


def test_a_cross_attention_cache_shared_by_beams_records_each_row() -> None:
    """With ``group`` g rows per memory row (beam search), the recorded (B, H, T, S) rows are each beam's own."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4, cross=True).eval()
    memory = torch.randn(2, 5, 32)
    memory_mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    memory_mask[1, ..., -2:] = False
    x = torch.randn(6, 1, 32)  # 3 beams of each of 2 sentences
    cache = CrossAttnCache()
    cache.group = 3
    got = []
    mha.recorder = lambda w, allowed, bias: got.append((w, allowed))
    with torch.no_grad():
        mha(x, memory, mask=memory_mask, cache=cache)
        _, want = mha(x, memory.repeat_interleave(3, 0), mask=memory_mask.repeat_interleave(3, 0), return_weights=True)
    w, allowed = got[0]
    torch.testing.assert_close(w, want, atol=ATOL, rtol=0)
    assert allowed.shape == (6, 4, 1, 5) and not bool(allowed[3:, ..., -2:].any()) and bool(allowed[:3].all())
