"""The tiled online-softmax attention equals the reference attention, forward and backward, under every mask and bias
the models make: fp32 at 1e-5, with keys in several blocks and blocks of uneven size."""

from __future__ import annotations

import pytest
import torch

from aiayn.nn import masks as M
from aiayn.nn.attention import scaled_dot_product_attention
from aiayn.nn.positions import ALiBi, T5RelativeBias
from aiayn.nn.tiled_attention import tiled_attention

TOL = dict(atol=1e-5, rtol=1e-5)
B, H, DH = 2, 3, 8


def _qkv(t: int, s: int, heads_kv: int = H) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (torch.randn(B, H, t, DH, requires_grad=True), torch.randn(B, heads_kv, s, DH, requires_grad=True),
            torch.randn(B, heads_kv, s, DH, requires_grad=True))


def _masks(t: int, s: int) -> dict[str, torch.Tensor | None]:
    is_token = torch.ones(B, s, dtype=torch.bool)
    is_token[1, :5] = False  # left padding in row 1
    return {"none": None, "padding": M.padding_mask(is_token), "sliding": M.sliding_window_mask(t, 7, s),
            "padding+sliding": M.combine(M.padding_mask(is_token), M.sliding_window_mask(t, 7, s))}


def _biases(t: int, s: int) -> dict[str, torch.Tensor | None]:
    q_pos, k_pos = torch.arange(s - t, s)[None], torch.arange(s)[None]
    t5 = T5RelativeBias(H, 8, 20, bidirectional=False)
    return {"none": None, "alibi": ALiBi(H)(q_pos, k_pos), "t5": t5(q_pos, k_pos)}


def _both(q, k, v, mask, bias, is_causal, softcap=None, block=16):
    """Output and gradients (q, k, v, and the bias when it has one) of the reference and of the tiled attention."""
    results = []
    for tiled in (False, True):
        if tiled:
            kk, vv = (x.repeat_interleave(H // x.shape[1], dim=1) for x in (k, v))
            out = tiled_attention(q, kk, vv, mask, bias, is_causal=is_causal, softcap=softcap, block=block)
        else:
            out, _ = scaled_dot_product_attention(q, k, v, mask=mask, bias=bias, is_causal=is_causal,
                                                  backend="reference", softcap=softcap)
        weight = torch.linspace(-1, 1, out.numel()).view_as(out)
        inputs = [q, k, v] + ([bias] if bias is not None and bias.requires_grad else [])
        results.append((out, torch.autograd.grad((out * weight).sum(), inputs)))
    return results


@pytest.mark.parametrize("bias_name", ["none", "alibi", "t5"])
@pytest.mark.parametrize("mask_name", ["none", "padding", "sliding", "padding+sliding"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_tiled_equals_reference_forward_and_gradients(mask_name: str, bias_name: str, is_causal: bool) -> None:
    t = s = 50  # blocks of 16: three full ones and one of 2
    q, k, v = _qkv(t, s)
    (ref, ref_grads), (out, grads) = _both(q, k, v, _masks(t, s)[mask_name], _biases(t, s)[bias_name], is_causal)
    torch.testing.assert_close(out, ref, **TOL)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, **TOL)


def test_tiled_equals_reference_with_queries_at_the_end_of_the_keys_and_gqa() -> None:
    """A cached chunk: T = 9 queries at positions 41..49 of S = 50 keys, causal, with one key/value head serving all
    three query heads (MQA)."""
    q, k, v = _qkv(9, 50, heads_kv=1)
    (ref, ref_grads), (out, grads) = _both(q, k, v, _masks(9, 50)["padding"], _biases(9, 50)["alibi"], True)
    torch.testing.assert_close(out, ref, **TOL)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, **TOL)


@pytest.mark.parametrize("softcap", [2.0, 30.0])
def test_tiled_equals_reference_with_soft_capped_scores(softcap: float) -> None:
    q, k, v = _qkv(33, 33)
    with torch.no_grad():
        q.mul_(4.0)  # scores well into tanh's bend
    (ref, ref_grads), (out, grads) = _both(q, k, v, _masks(33, 33)["padding"], _biases(33, 33)["t5"], True,
                                           softcap=softcap)
    torch.testing.assert_close(out, ref, **TOL)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, **TOL)


def test_rows_with_no_allowed_key_give_zeros_and_zero_gradients_never_nan() -> None:
    t = s = 40
    q, k, v = _qkv(t, s)
    mask = torch.ones(B, 1, t, s, dtype=torch.bool)
    mask[0, 0, 3] = False  # one empty row
    mask[1, 0, :, :20] = False  # keys of the first block masked for every row, so blocks start empty
    mask[1, 0, 30:] = False  # and ten empty rows
    (ref, ref_grads), (out, grads) = _both(q, k, v, mask, None, False)
    assert not out.isnan().any() and not any(g.isnan().any() for g in grads)
    assert (out[0, :, 3] == 0).all() and (out[1, :, 30:] == 0).all()
    torch.testing.assert_close(out, ref, **TOL)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, **TOL)


def test_the_tiled_backend_of_the_one_attention_function() -> None:
    """``backend="tiled"`` routes through the same mask and GQA handling as the others."""
    q, k, v = _qkv(20, 20, heads_kv=1)
    mask = _masks(20, 20)["padding+sliding"]
    ref, _ = scaled_dot_product_attention(q, k, v, mask=mask, is_causal=True, backend="reference")
    out, _ = scaled_dot_product_attention(q, k, v, mask=mask, is_causal=True, backend="tiled")
    torch.testing.assert_close(out, ref, **TOL)
    with pytest.raises(ValueError, match="dropout"):
        scaled_dot_product_attention(q, k, v, backend="tiled", dropout_p=0.1)


def test_tiled_in_bfloat16_accumulates_in_fp32() -> None:
    q, k, v = (x.detach() for x in _qkv(40, 40))
    ref, _ = scaled_dot_product_attention(q, k, v, is_causal=True, backend="reference")
    out = tiled_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), is_causal=True, block=16)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=0)
