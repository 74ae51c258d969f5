"""The seed lesson's worked numbers, reproduced exactly by the library's one attention function.

Each test is a number or a shape the lesson computes by hand: two small attention examples, the rendered
causal mask, and the shape trace through multi-head attention (small and paper-big sized).
"""

from __future__ import annotations

import math

import pytest
import torch

import aiayn.nn.attention as attention_module
from aiayn.config import ModelConfig
from aiayn.nn.attention import MultiHeadAttention, scaled_dot_product_attention
from aiayn.nn.masks import causal_mask, render


def _as_heads(rows: list[list[float]], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A (T, Dh) matrix as a (1, 1, T, Dh) batch of one head."""
    return torch.tensor(rows, dtype=dtype)[None, None]


def _softmax(xs: list[float]) -> list[float]:
    exps = [math.exp(x) for x in xs]
    return [e / sum(exps) for e in exps]


def test_two_token_example_with_sqrt_dk_scaling() -> None:
    q = _as_heads([[1, 0], [0, 1]])
    k = _as_heads([[1, 0], [1, 1]])
    v = _as_heads([[1, 2], [3, 4]])
    out, weights = scaled_dot_product_attention(q, k, v, backend="reference", return_weights=True)
    assert weights is not None
    a, o = weights[0, 0], out[0, 0]
    assert a.shape == (2, 2) and o.shape == (2, 2)
    assert torch.equal(a.round(decimals=3), torch.tensor([[0.5, 0.5], [0.330, 0.670]], dtype=torch.float32))
    assert torch.equal(o.round(decimals=2), torch.tensor([[2.00, 3.00], [2.34, 3.34]], dtype=torch.float32))
    # the second row exactly: softmax([0, 1/sqrt(2)])
    expected = _softmax([0.0, 1 / math.sqrt(2)])
    assert a[1].tolist() == pytest.approx(expected, abs=1e-6)
    o2 = [expected[0] * 1 + expected[1] * 3, expected[0] * 2 + expected[1] * 4]
    assert o[1].tolist() == pytest.approx(o2, abs=1e-6)


def test_three_token_example_without_scaling() -> None:
    q = _as_heads([[2], [0], [1]])
    k = _as_heads([[1], [3], [-1]])
    v = _as_heads([[10], [20], [30]])
    out, weights = scaled_dot_product_attention(q, k, v, backend="reference", return_weights=True, scale=1.0)
    assert weights is not None
    a, o = weights[0, 0], out[0, 0, :, 0]
    # query 2 is the zero vector: every score is 0, so attention is uniform and the output is the mean value
    assert a[1].tolist() == pytest.approx([1 / 3, 1 / 3, 1 / 3], abs=1e-6)
    assert float(o[1]) == pytest.approx(20.0, abs=1e-6)
    # queries 1 and 3: the exact exponential ratios of the raw scores q_i * k_j
    row1, row3 = _softmax([2.0, 6.0, -2.0]), _softmax([1.0, 3.0, -1.0])
    assert a[0].tolist() == pytest.approx(row1, rel=1e-6)
    assert a[2].tolist() == pytest.approx(row3, rel=1e-6)
    assert float(o[0]) == pytest.approx(sum(w * x for w, x in zip(row1, [10, 20, 30])), rel=1e-6)
    assert float(o[2]) == pytest.approx(sum(w * x for w, x in zip(row3, [10, 20, 30])), rel=1e-6)


def test_causal_mask_of_length_four_renders_as_the_lesson_draws_it() -> None:
    expected = ("   0 -inf -inf -inf\n"
                "   0    0 -inf -inf\n"
                "   0    0    0 -inf\n"
                "   0    0    0    0")
    assert render(causal_mask(4)) == expected
    assert render(causal_mask(4), as_bias=False) == "1 0 0 0\n1 1 0 0\n1 1 1 0\n1 1 1 1"


def _trace_shapes(monkeypatch: pytest.MonkeyPatch, mha: MultiHeadAttention, x: torch.Tensor
                  ) -> tuple[dict[str, tuple[int, ...]], torch.Tensor | None]:
    """Run ``mha`` on ``x`` with weights, recording per-head q/k/v shapes and the concatenated heads."""
    seen: dict[str, tuple[int, ...]] = {}
    inner = attention_module.scaled_dot_product_attention

    def spy(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: object):  # type: ignore[no-untyped-def]
        seen["q"], seen["k"], seen["v"] = tuple(q.shape), tuple(k.shape), tuple(v.shape)
        return inner(q, k, v, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(attention_module, "scaled_dot_product_attention", spy)
    handle = mha.out_proj.register_forward_pre_hook(
        lambda _m, args: seen.__setitem__("concat", tuple(args[0].shape)))
    try:
        out, weights = mha(x, return_weights=True)
    finally:
        handle.remove()
    seen["out"] = tuple(out.shape)
    return seen, weights


def test_shape_trace_d8_h2_l3(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(d_model=8, n_heads=2).eval()
    seen, weights = _trace_shapes(monkeypatch, mha, torch.randn(1, 3, 8))
    assert seen["q"] == seen["k"] == seen["v"] == (1, 2, 3, 4)  # per head: Q is 3 x 4
    assert weights is not None and weights.shape == (1, 2, 3, 3)  # per head: scores are 3 x 3
    assert seen["concat"] == (1, 3, 8)  # concat of the heads: 3 x 8
    assert seen["out"] == (1, 3, 8)
    assert torch.allclose(weights.sum(-1), torch.ones(1, 2, 3))


def test_shape_trace_paper_big_d1024_h16_l128(monkeypatch: pytest.MonkeyPatch) -> None:
    config = ModelConfig.preset("paper-big")
    assert (config.d_model, config.n_heads, config.head_dim) == (1024, 16, 64)
    torch.manual_seed(0)
    mha = MultiHeadAttention(config.d_model, config.n_heads).eval()
    with torch.no_grad():
        seen, weights = _trace_shapes(monkeypatch, mha, torch.randn(1, 128, 1024))
    assert seen["q"] == (1, 16, 128, 64)  # d_k = 1024 / 16 = 64
    assert weights is not None and weights.shape == (1, 16, 128, 128)  # one 128 x 128 score matrix per head
    assert seen["concat"] == (1, 128, 1024)


def test_reference_backend_keeps_float64_precision() -> None:
    q = _as_heads([[2], [0], [1]], torch.float64)
    k = _as_heads([[1], [3], [-1]], torch.float64)
    v = _as_heads([[10], [20], [30]], torch.float64)
    out, weights = scaled_dot_product_attention(q, k, v, backend="reference", return_weights=True, scale=1.0)
    assert weights is not None and weights.dtype == torch.float64
    assert weights[0, 0, 1].tolist() == pytest.approx([1 / 3, 1 / 3, 1 / 3], abs=1e-14)
    assert weights[0, 0, 0].tolist() == pytest.approx(_softmax([2.0, 6.0, -2.0]), rel=1e-12)
