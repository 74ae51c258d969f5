"""Independent pins for the pieces that the reference and the fused attention paths share.

The backend-equivalence and torch-parity tests compare two code paths that both call the same score scale and
the same mask builders, so a bug in either would pass them. Every expected value here is written out by hand
from the definition (paper eq. 1; "True = may attend"), never computed with aiayn's own helpers:

* the score scale 1/sqrt(d_k), on a 3x3 example whose softmax has exact rational weights;
* every mask builder in :mod:`aiayn.nn.masks`, against literal boolean matrices;
* the empty-row convention: a query row with no allowed key gives zeros (and zero weights), never NaN.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from aiayn.config import ModelConfig
from aiayn.models.build import build_model
from aiayn.nn import masks as M
from aiayn.nn.attention import MultiHeadAttention, scaled_dot_product_attention

BACKENDS = ["reference", "sdpa"]


def _m(*rows: str) -> Tensor:
    """A (T, S) bool matrix from strings of 1 (may attend) and 0, one string per query row."""
    return torch.tensor([[c == "1" for c in r] for r in rows], dtype=torch.bool)


# ---------------------------------------------------------------------------------------------- score scale
# Head width d_k = 4, so the paper's scale is 1/sqrt(4) = 1/2 (and 1/d_k = 1/4, no scale = 1: all different).
# Keys k0 = e0, k1 = e1, k2 = 0; values are 4 * e0, 4 * e1, 4 * e2. Raw scores q.k are chosen so that after
# the 1/2 scale the exponentials are small integers:
#   q0 = 2 ln3 e0          -> scaled scores (ln3, 0, 0)    -> exp (3, 1, 1) -> weights (3/5, 1/5, 1/5)
#   q1 = 2 ln2 (e0 + e1)   -> scaled scores (ln2, ln2, 0)  -> exp (2, 2, 1) -> weights (2/5, 2/5, 1/5)
#   q2 = 0                 -> scaled scores (0, 0, 0)      -> weights (1/3, 1/3, 1/3)
LN2, LN3 = math.log(2.0), math.log(3.0)
Q = torch.tensor([[2 * LN3, 0.0, 0.0, 0.0],
                  [2 * LN2, 2 * LN2, 0.0, 0.0],
                  [0.0, 0.0, 0.0, 0.0]])  # (T=3, Dh=4)
K = torch.tensor([[1.0, 0.0, 0.0, 0.0],
                  [0.0, 1.0, 0.0, 0.0],
                  [0.0, 0.0, 0.0, 0.0]])  # (S=3, Dh=4)
V = 4.0 * torch.eye(3, 4)  # (S=3, Dh=4)
W_SQRT = torch.tensor([[3 / 5, 1 / 5, 1 / 5],
                       [2 / 5, 2 / 5, 1 / 5],
                       [1 / 3, 1 / 3, 1 / 3]])  # the paper's scale 1/sqrt(d_k)
OUT_SQRT = torch.tensor([[12 / 5, 4 / 5, 4 / 5, 0.0],
                         [8 / 5, 8 / 5, 4 / 5, 0.0],
                         [4 / 3, 4 / 3, 4 / 3, 0.0]])
# T5's scale = 1.0 (no scaling): raw scores (2 ln3, 0, 0) -> exp (9, 1, 1); (2 ln2, 2 ln2, 0) -> exp (4, 4, 1)
W_ONE = torch.tensor([[9 / 11, 1 / 11, 1 / 11],
                      [4 / 9, 4 / 9, 1 / 9],
                      [1 / 3, 1 / 3, 1 / 3]])
OUT_ONE = torch.tensor([[36 / 11, 4 / 11, 4 / 11, 0.0],
                        [16 / 9, 16 / 9, 4 / 9, 0.0],
                        [4 / 3, 4 / 3, 4 / 3, 0.0]])


def _qkv() -> tuple[Tensor, Tensor, Tensor]:
    return Q[None, None].clone(), K[None, None].clone(), V[None, None].clone()  # (1, 1, 3, 4) each


@pytest.mark.parametrize("backend", BACKENDS)
def test_default_scale_is_one_over_sqrt_dk(backend: str) -> None:
    out, _ = scaled_dot_product_attention(*_qkv(), backend=backend)
    torch.testing.assert_close(out[0, 0], OUT_SQRT, atol=1e-6, rtol=0)


def test_default_scale_weights_are_the_hand_computed_ones() -> None:
    out, w = scaled_dot_product_attention(*_qkv(), return_weights=True)
    assert w is not None
    torch.testing.assert_close(w[0, 0], W_SQRT, atol=1e-6, rtol=0)
    torch.testing.assert_close(out[0, 0], OUT_SQRT, atol=1e-6, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_explicit_scale_one_is_unscaled(backend: str) -> None:
    out, _ = scaled_dot_product_attention(*_qkv(), backend=backend, scale=1.0)
    torch.testing.assert_close(out[0, 0], OUT_ONE, atol=1e-6, rtol=0)
    _, w = scaled_dot_product_attention(*_qkv(), scale=1.0, return_weights=True)
    assert w is not None
    torch.testing.assert_close(w[0, 0], W_ONE, atol=1e-6, rtol=0)


def _identity_mha(scale: float | None = None) -> MultiHeadAttention:
    """Self-attention over x = [q of 2 heads | k of 2 heads | v of 2 heads] (D = 24), each head 4 wide.

    The fused projection is the identity, so q, k and v are slices of x; the output projection copies the two
    heads' outputs into the first 8 columns. Head width is 4 while D is 24: the scale must use the head width.
    """
    mha = MultiHeadAttention(24, 2, head_dim=4, scale=scale).eval()
    with torch.no_grad():
        mha.qkv_proj.weight.copy_(torch.eye(24))
        mha.qkv_proj.bias.zero_()
        mha.out_proj.weight.copy_(torch.eye(24, 8))
        mha.out_proj.bias.zero_()
    return mha


def _head_input() -> Tensor:
    """(1, 3, 24): head 0 gets the worked example, head 1 the same example with its keys swapped."""
    k_swapped = K[[1, 0, 2]]  # head 1: key rows 0 and 1 exchanged -> weight columns 0 and 1 exchanged
    return torch.cat([Q, Q, K, k_swapped, V, V], dim=-1)[None]  # (1, T=3, 24)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scale", [None, 1.0], ids=["default", "t5"])
def test_multi_head_attention_scale(backend: str, scale: float | None) -> None:
    mha = _identity_mha(scale)
    mha.backend = backend
    w_want = W_SQRT if scale is None else W_ONE
    head1 = w_want[:, [1, 0, 2]] @ V  # keys swapped: the first two weights trade places
    want = torch.cat([w_want @ V, head1, torch.zeros(3, 16)], dim=-1)  # (3, 24)
    with torch.no_grad():
        got, _ = mha(_head_input())
        _, weights = mha(_head_input(), return_weights=True)
    torch.testing.assert_close(got[0], want, atol=1e-6, rtol=0)
    assert weights is not None
    torch.testing.assert_close(weights[0, 0], w_want, atol=1e-6, rtol=0)
    torch.testing.assert_close(weights[0, 1], w_want[:, [1, 0, 2]], atol=1e-6, rtol=0)


def test_models_wire_the_scale_by_position_scheme() -> None:
    """T5 attention is unscaled (scale 1.0, folded into its init); every other family uses the default."""
    small = dict(vocab_size=20, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=16)
    for position, want in (("t5", 1.0), ("sinusoidal", None), ("rope", None)):
        model = build_model(ModelConfig.preset("tiny", position=position, **small))
        scales = {m.scale for m in model.modules() if isinstance(m, MultiHeadAttention)}
        assert scales == {want}, (position, scales)


# ---------------------------------------------------------------------------------------------- masks
def test_padding_mask_literal() -> None:
    is_token = torch.tensor([[True, True, False], [True, False, False]])
    got = M.padding_mask(is_token)
    assert got.shape == (2, 1, 1, 3) and got.dtype == torch.bool
    assert torch.equal(got[0, 0], _m("110"))
    assert torch.equal(got[1, 0], _m("100"))
    ids = torch.tensor([[9, 4, 7, 7], [7, 3, 7, 7]])
    got = M.padding_mask_from_ids(ids, pad_id=7)
    assert torch.equal(got[:, 0, 0], torch.tensor([[True, True, False, False], [False, True, False, False]]))


@pytest.mark.parametrize("t,s,want", [
    (1, 1, ["1"]),
    (4, None, ["1000",
               "1100",
               "1110",
               "1111"]),
    (1, 4, ["1111"]),  # one decoding step over a cache of 4: sees everything
    (2, 5, ["11110",
            "11111"]),  # queries at absolute positions 3 and 4
    (3, 5, ["11100",
            "11110",
            "11111"]),
], ids=["1x1", "4x4", "1x4", "2x5", "3x5"])
def test_causal_mask_literal(t: int, s: int | None, want: list[str]) -> None:
    got = M.causal_mask(t, s)
    assert got.dtype == torch.bool
    assert torch.equal(got, _m(*want))


@pytest.mark.parametrize("t,window,s,causal,want", [
    # window 3 over 6 tokens: query i sees i-2, i-1, i (exactly 3 keys, itself included), never i-3
    (6, 3, None, True, ["100000",
                        "110000",
                        "111000",
                        "011100",
                        "001110",
                        "000111"]),
    (6, 2, None, True, ["100000",
                        "110000",
                        "011000",
                        "001100",
                        "000110",
                        "000011"]),
    (5, 1, None, True, ["10000",
                        "01000",
                        "00100",
                        "00010",
                        "00001"]),
    # non-causal window 2: |i - j| < 2
    (5, 2, None, False, ["11000",
                         "11100",
                         "01110",
                         "00111",
                         "00011"]),
    # non-causal window 3: |i - j| < 3, so i sees i-2 .. i+2
    (6, 3, None, False, ["111000",
                         "111100",
                         "111110",
                         "011111",
                         "001111",
                         "000111"]),
    # two new queries at absolute positions 4 and 5 over a cache of 6 keys, window 3
    (2, 3, 6, True, ["001110",
                     "000111"]),
    # a window exactly as long as the sequence: the first query that would lose key 0 does not exist
    (4, 4, None, True, ["1000",
                        "1100",
                        "1110",
                        "1111"]),
    # one shorter: the last query just loses key 0
    (4, 3, None, True, ["1000",
                        "1100",
                        "1110",
                        "0111"]),
], ids=["w3", "w2", "w1", "bidir-w2", "bidir-w3", "cached-w3", "w=T", "w=T-1"])
def test_sliding_window_mask_literal(t: int, window: int, s: int | None, causal: bool, want: list[str]) -> None:
    got = M.sliding_window_mask(t, window, s, causal=causal)
    assert torch.equal(got, _m(*want)), M.render(got, as_bias=False)


def test_sliding_window_exact_edge_counts() -> None:
    """Causal window w: every query far enough from the start sees exactly w keys, the nearest w."""
    t, w = 9, 4
    got = M.sliding_window_mask(t, w)
    assert got.sum(-1).tolist() == [1, 2, 3, 4, 4, 4, 4, 4, 4]
    for i in range(t):
        assert got[i].nonzero().flatten().tolist() == list(range(max(0, i - w + 1), i + 1))


def test_prefix_lm_mask_literal() -> None:
    got = M.prefix_lm_mask(5, torch.tensor([2, 0, 5, 3]))
    assert got.shape == (4, 1, 5, 5) and got.dtype == torch.bool
    assert torch.equal(got[0, 0], _m("11000",
                                     "11000",
                                     "11100",
                                     "11110",
                                     "11111"))
    assert torch.equal(got[1, 0], _m("10000",
                                     "11000",
                                     "11100",
                                     "11110",
                                     "11111"))
    assert torch.equal(got[2, 0], _m("11111",
                                     "11111",
                                     "11111",
                                     "11111",
                                     "11111"))
    assert torch.equal(got[3, 0], _m("11100",
                                     "11100",
                                     "11100",
                                     "11110",
                                     "11111"))


def test_local_global_mask_literal() -> None:
    got = M.local_global_mask(7, window=2, global_positions=[0, 4])
    assert torch.equal(got, _m("1111111",
                               "1110100",
                               "1111100",
                               "1011100",
                               "1111111",
                               "1000111",
                               "1000111"))
    got = M.local_global_mask(7, window=3, global_positions=[2])
    assert torch.equal(got, _m("1110000",
                               "1111000",
                               "1111111",
                               "0111110",
                               "0011111",
                               "0011111",
                               "0010111"))
    got = M.local_global_mask(7, window=2, global_positions=[0, 4], causal=True)
    assert torch.equal(got, _m("1000000",
                               "1100000",
                               "1110000",
                               "1011000",
                               "1111100",
                               "1000110",
                               "1000111"))


def test_block_sparse_mask_literal() -> None:
    # 8 tokens in blocks of 2: block ids 0 0 1 1 2 2 3 3
    assert torch.equal(M.block_sparse_mask(8, block=2), _m("11000000",
                                                         "11000000",
                                                         "00110000",
                                                         "00110000",
                                                         "00001100",
                                                         "00001100",
                                                         "00000011",
                                                         "00000011"))
    # local_blocks=2: own block and each neighbour block
    assert torch.equal(M.block_sparse_mask(8, block=2, local_blocks=2), _m("11110000",
                                                                         "11110000",
                                                                         "11111100",
                                                                         "11111100",
                                                                         "00111111",
                                                                         "00111111",
                                                                         "00001111",
                                                                         "00001111"))
    # stride 2: key blocks 1 and 3 (kb % 2 == 1) are summaries every query sees
    assert torch.equal(M.block_sparse_mask(8, block=2, stride=2), _m("11110011",
                                                                   "11110011",
                                                                   "00110011",
                                                                   "00110011",
                                                                   "00111111",
                                                                   "00111111",
                                                                   "00110011",
                                                                   "00110011"))
    assert torch.equal(M.block_sparse_mask(8, block=2, stride=2, causal=True), _m("10000000",
                                                                                "11000000",
                                                                                "00100000",
                                                                                "00110000",
                                                                                "00111000",
                                                                                "00111100",
                                                                                "00110010",
                                                                                "00110011"))
    # blocks of 3 over 7 tokens (a ragged last block): ids 0 0 0 1 1 1 2
    assert torch.equal(M.block_sparse_mask(7, block=3, causal=True), _m("1000000",
                                                                      "1100000",
                                                                      "1110000",
                                                                      "0001000",
                                                                      "0001100",
                                                                      "0001110",
                                                                      "0000001"))


def test_document_mask_literal() -> None:
    docs = torch.tensor([[0, 0, 0, 1, 1, -1],
                         [5, 6, 6, 6, 7, 7]])
    got = M.document_mask(docs)
    assert got.shape == (2, 1, 6, 6) and got.dtype == torch.bool
    assert torch.equal(got[0, 0], _m("100000",
                                     "110000",
                                     "111000",
                                     "000100",
                                     "000110",
                                     "000001"))
    assert torch.equal(got[1, 0], _m("100000",
                                     "010000",
                                     "011000",
                                     "011100",
                                     "000010",
                                     "000011"))
    got = M.document_mask(docs, causal=False)
    assert torch.equal(got[0, 0], _m("111000",
                                     "111000",
                                     "111000",
                                     "000110",
                                     "000110",
                                     "000001"))
    assert torch.equal(got[1, 0], _m("100000",
                                     "011100",
                                     "011100",
                                     "011100",
                                     "000011",
                                     "000011"))


def test_combine_literal() -> None:
    causal = _m("100", "110", "111")
    pad = torch.tensor([[True, False, True]])[:, None, None, :]  # (1, 1, 1, 3)
    got = M.combine(causal, None, pad)
    assert got is not None and got.shape == (1, 1, 3, 3)
    assert torch.equal(got[0, 0], _m("100", "100", "101"))


# ---------------------------------------------------------------------------------------------- masks in use
@pytest.mark.parametrize("backend", BACKENDS)
def test_is_causal_attends_to_the_literal_causal_pattern(backend: str) -> None:
    """``is_causal=True`` (square, and T < S as with a cache) equals an explicit literal mask; the weights show
    exactly which keys each query reads."""
    torch.manual_seed(0)
    for t, s, allowed in ((4, 4, _m("1000", "1100", "1110", "1111")),
                          (2, 5, _m("11110", "11111"))):
        q, k, v = torch.randn(2, 3, t, 8), torch.randn(2, 3, s, 8), torch.randn(2, 3, s, 8)
        got, _ = scaled_dot_product_attention(q, k, v, is_causal=True, backend=backend)
        # written out: softmax over the allowed keys only, scale 1/sqrt(8)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(8)
        want = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ v
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        _, w = scaled_dot_product_attention(q, k, v, is_causal=True, return_weights=True)
        assert w is not None and torch.equal(w[0, 0] > 0, allowed)


def _decoder(**kw: object) -> torch.nn.Module:
    cfg = ModelConfig.preset("tiny", arch="decoder", vocab_size=20, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                             max_len=32, position="rope", **kw)
    return build_model(cfg).eval()


def test_decoder_model_reads_exactly_the_causal_window() -> None:
    """A decoder with ``sliding_window=3`` reads the keys a window of 3 allows: itself and two before."""
    ids = torch.randint(1, 20, (1, 6))
    with torch.no_grad():
        plain = _decoder()(ids, return_weights=True).attentions["self"][0]
        windowed = _decoder(sliding_window=3)(ids, return_weights=True).attentions["self"][0]
    assert torch.equal(plain[0, 0] > 0, _m("100000",
                                           "110000",
                                           "111000",
                                           "111100",
                                           "111110",
                                           "111111"))
    assert torch.equal(windowed[0, 0] > 0, _m("100000",
                                              "110000",
                                              "111000",
                                              "011100",
                                              "001110",
                                              "000111"))


# ---------------------------------------------------------------------------------------------- empty rows
@pytest.mark.parametrize("backend", BACKENDS)
def test_fully_masked_row_gives_zeros_not_nan(backend: str) -> None:
    torch.manual_seed(0)
    q = torch.randn(1, 2, 3, 4, requires_grad=True)
    k = torch.randn(1, 2, 3, 4, requires_grad=True)
    v = torch.randn(1, 2, 3, 4, requires_grad=True)
    mask = _m("110", "000", "001")  # query 1 may attend nothing
    out, _ = scaled_dot_product_attention(q, k, v, mask=mask, backend=backend)
    assert bool(torch.isfinite(out).all())
    assert torch.equal(out[:, :, 1], torch.zeros(1, 2, 4))
    # the other rows are ordinary attention over their allowed keys; row 2 copies value 2
    torch.testing.assert_close(out[:, :, 2], v[:, :, 2], atol=1e-6, rtol=0)
    w01 = torch.softmax((q[:, :, 0:1] * k[:, :, :2]).sum(-1) / 2.0, dim=-1)  # (1, 2, 2): scale 1/sqrt(4)
    torch.testing.assert_close(out[:, :, 0], (w01[..., None] * v[:, :, :2]).sum(-2), atol=1e-6, rtol=0)
    out.sum().backward()
    for x in (q, k, v):
        assert x.grad is not None and bool(torch.isfinite(x.grad).all())
    assert torch.equal(q.grad[:, :, 1], torch.zeros(1, 2, 4))  # the empty row depends on nothing


def test_fully_masked_row_has_zero_weights() -> None:
    q, k, v = torch.randn(2, 1, 3, 4), torch.randn(2, 1, 3, 4), torch.randn(2, 1, 3, 4)
    pad = torch.tensor([[True, True, True], [False, False, False]])  # example 1 is all padding
    out, w = scaled_dot_product_attention(q, k, v, mask=M.padding_mask(pad), return_weights=True)
    assert w is not None
    assert torch.equal(w[1], torch.zeros(1, 3, 3)) and torch.equal(out[1], torch.zeros(1, 3, 4))
    torch.testing.assert_close(w[0].sum(-1), torch.ones(1, 3))


@pytest.mark.parametrize("backend", BACKENDS)
def test_causal_step_past_left_padding_only_is_zero(backend: str) -> None:
    """Causal + padding where a query's only visible keys are padding (left padding): that row is zeros."""
    q, k, v = torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4)
    pad = torch.tensor([[False, False, True]])  # the first two positions are padding
    out, _ = scaled_dot_product_attention(q, k, v, mask=M.padding_mask(pad), is_causal=True, backend=backend)
    assert bool(torch.isfinite(out).all())
    assert torch.equal(out[0, 0, :2], torch.zeros(2, 4))  # queries 0 and 1 see only padding
    torch.testing.assert_close(out[0, 0, 2], v[0, 0, 2], atol=1e-6, rtol=0)
