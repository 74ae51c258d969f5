"""FlexAttention: the mask mods equal the dense masks of ``aiayn.nn.masks``, ALiBi and T5 as score mods equal their
dense biases, and attention through FlexAttention (eager, and compiled where a C compiler exists) equals the reference
attention with the same masks, biases and soft-capping; its block masks skip the blocks a pattern leaves out."""

from __future__ import annotations

import shutil
import warnings

import pytest
import torch

pytest.importorskip("torch.nn.attention.flex_attention", reason="FlexAttention needs torch 2.5 or later")
from aiayn.nn import flex as F  # noqa: E402
from aiayn.nn import masks as M  # noqa: E402
from aiayn.nn.attention import scaled_dot_product_attention  # noqa: E402
from aiayn.nn.positions import ALiBi, T5RelativeBias, t5_relative_bucket  # noqa: E402

TOL = dict(atol=1e-5, rtol=1e-5)
B, H, DH = 2, 4, 8


# The dense masks and biases of aiayn.nn.masks / aiayn.nn.positions as FlexAttention mods
def sliding_window_mod(window: int, offset: int = 0, causal: bool = True) -> F.MaskMod:
    """:func:`aiayn.nn.masks.sliding_window_mask` as a mask mod: the ``window`` nearest keys (itself included)."""
    def mod(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        d = q + offset - k
        near = (d < window) & (d > -window)
        return near & (d >= 0) if causal else near

    return mod

def block_sparse_mod(block: int, local_blocks: int = 1, stride: int | None = None, causal: bool = False,
                     offset: int = 0) -> F.MaskMod:
    """:func:`aiayn.nn.masks.block_sparse_mask` as a mask mod."""
    def mod(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        d = (q + offset) // block - k // block
        out = (d < local_blocks) & (d > -local_blocks)
        if stride:
            out = out | (k // block % stride == stride - 1)
        return out & (k <= q + offset) if causal else out

    return mod

def local_global_mod(window: int, n_global: int, causal: bool = False, offset: int = 0) -> F.MaskMod:
    """:func:`aiayn.nn.masks.local_global_mask` with global positions 0 .. n_global - 1, as a mask mod."""
    def mod(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        d = q + offset - k
        out = ((d < window) & (d > -window)) | (k < n_global) | (q + offset < n_global)
        return out & (d >= 0) if causal else out

    return mod

def document_mod(doc_ids: torch.Tensor, causal: bool = True) -> F.MaskMod:
    """:func:`aiayn.nn.masks.document_mask` as a mask mod; doc_ids (B, T) with T = S."""
    def mod(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        same = doc_ids[b, q] == doc_ids[b, k]
        return same & (k <= q) if causal else same

    return mod

def padding_mod(key_is_token: torch.Tensor) -> F.MaskMod:
    """:func:`aiayn.nn.masks.padding_mask` as a mask mod; key_is_token (B, S) bool."""
    return lambda b, h, q, k: key_is_token[b, k]

def alibi_score_mod(slopes: torch.Tensor, offset: int = 0) -> F.ScoreMod:
    """:class:`aiayn.nn.positions.ALiBi` as a score mod: score - slope_h * |pos_q - pos_k|; slopes (H,)."""
    return lambda score, b, h, q, k: score - slopes[h] * (q + offset - k).abs()

def t5_score_mod(table: torch.Tensor, bidirectional: bool, num_buckets: int, max_distance: int,
                 offset: int = 0) -> F.ScoreMod:
    """:class:`aiayn.nn.positions.T5RelativeBias` as a score mod; table (num_buckets, H) is its embedding weight."""
    def mod(score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        bucket = t5_relative_bucket(k - (q + offset), bidirectional, num_buckets, max_distance)
        return score + table[bucket, h]

    return mod


@pytest.fixture(autouse=True)
def eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """FlexAttention without torch.compile (exact, and no compile time per shape); the compiled kernel has a test."""
    monkeypatch.setattr(F.SETTINGS, "compile", False)
    warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")


def _grid(mod: F.MaskMod, b: int, t: int, s: int) -> torch.Tensor:
    """A mask mod evaluated at every (b, q, k): (B, 1, T, S) bool."""
    return mod(torch.arange(b)[:, None, None, None], torch.zeros(1, 1, 1, 1, dtype=torch.long),
               torch.arange(t)[None, None, :, None], torch.arange(s)[None, None, None, :]).expand(b, 1, t, s)


@pytest.mark.parametrize("t", [37, 5], ids=["square", "queries-at-the-end"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_mask_mods_equal_the_dense_masks(t: int, causal: bool) -> None:
    s, off = 37, 37 - t
    pairs = {
        "window": (sliding_window_mod(6, off, causal), M.sliding_window_mask(t, 6, s, causal=causal)),
        "block_sparse": (block_sparse_mod(4, 2, 3, causal, off), M.block_sparse_mask(t, 4, 2, 3, causal, s=s)),
        "local_global": (local_global_mod(5, 3, causal, off), M.local_global_mask(t, 5, [0, 1, 2], causal, s=s)),
    }
    for name, (mod, dense) in pairs.items():
        assert torch.equal(_grid(mod, 1, t, s)[0, 0], dense), name
    doc_ids = torch.tensor([[0] * 10 + [1] * 20 + [2] * 7, [0] * 37])
    assert torch.equal(_grid(document_mod(doc_ids, causal), B, s, s),
                       M.document_mask(doc_ids, causal).expand(B, 1, s, s))
    is_token = torch.rand(B, s) > 0.3
    assert torch.equal(_grid(padding_mod(is_token), B, t, s), M.padding_mask(is_token).expand(B, 1, t, s))


def _qkv(t: int, s: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.randn(B, H, t, DH), torch.randn(B, H, s, DH), torch.randn(B, H, s, DH)


def test_flex_with_mask_and_score_mods_equals_the_reference_with_dense_masks_and_biases() -> None:
    t = s = 150  # two of FlexAttention's 128-blocks
    q, k, v = _qkv(t, s)
    q_pos, k_pos = torch.arange(t)[None], torch.arange(s)[None]
    alibi, t5 = ALiBi(H), T5RelativeBias(H, 16, 64, bidirectional=False)
    cases = {
        "window+alibi": (sliding_window_mod(40), alibi_score_mod(alibi.slopes),
                         M.sliding_window_mask(t, 40), alibi(q_pos, k_pos)),
        "block_sparse+t5": (block_sparse_mod(16, 2, 4, causal=True),
                            t5_score_mod(t5.embedding.weight, False, 16, 64),
                            M.block_sparse_mask(t, 16, 2, 4, causal=True), t5(q_pos, k_pos)),
        "local_global+softcap": (local_global_mod(20, 2, causal=True), F.softcap_score_mod(3.0),
                                 M.local_global_mask(t, 20, [0, 1], causal=True), None),
    }
    with torch.no_grad():
        for name, (mask_mod, score_mod, mask, bias) in cases.items():
            out = F.attend(q, k, v, mask_mod=mask_mod, score_mod=score_mod)
            softcap = 3.0 if "softcap" in name else None
            ref, _ = scaled_dot_product_attention(q, k, v, mask=mask, bias=bias, backend="reference", softcap=softcap)
            torch.testing.assert_close(out, ref, **TOL, msg=name)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_the_flex_backend_equals_the_reference(is_causal: bool) -> None:
    """Dense masks and biases as the stack makes them, read by index; a row with no allowed key gives zeros."""
    t, s = 9, 30
    q, k, v = _qkv(t, s)
    is_token = torch.ones(B, s, dtype=torch.bool)
    is_token[1, :25] = False  # row 1's first queries see nothing
    mask = M.combine(M.padding_mask(is_token), M.sliding_window_mask(t, 8, s))
    bias = T5RelativeBias(H, 8, 20, bidirectional=False)(torch.arange(s - t, s)[None], torch.arange(s)[None])
    with torch.no_grad():
        for softcap in (None, 4.0):
            ref, _ = scaled_dot_product_attention(q, k, v, mask=mask, bias=bias, is_causal=is_causal,
                                                  backend="reference", softcap=softcap)
            out, _ = scaled_dot_product_attention(q, k, v, mask=mask, bias=bias, is_causal=is_causal, backend="flex",
                                                  softcap=softcap)
            torch.testing.assert_close(out, ref, **TOL)
            assert not out.isnan().any()


def test_compiled_decoding_steps_take_the_fused_kernel_and_equal_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fewer queries than one block: nothing to skip, so no compilation for each new key length."""
    monkeypatch.setattr(F.SETTINGS, "compile", True)
    monkeypatch.setattr(F, "_kernel", lambda device: pytest.fail("FlexAttention ran for a decoding step"))
    q, k, v = _qkv(3, 30)
    mask = M.sliding_window_mask(3, 8, 30)
    with torch.no_grad():
        for softcap in (None, 4.0):
            ref, _ = scaled_dot_product_attention(q, k, v, mask=mask, is_causal=True, backend="reference",
                                                  softcap=softcap)
            out, _ = scaled_dot_product_attention(q, k, v, mask=mask, is_causal=True, backend="flex", softcap=softcap)
            torch.testing.assert_close(out, ref, **TOL)


def test_gradients_on_the_cpu_equal_the_reference() -> None:
    """torch has no FlexAttention backward on the CPU; the backend computes the same attention by tiles there."""
    q, k, v = (x.requires_grad_() for x in _qkv(20, 20))
    mask = M.sliding_window_mask(20, 5)
    grads = []
    for backend in ("reference", "flex"):
        out, _ = scaled_dot_product_attention(q, k, v, mask=mask, is_causal=True, backend=backend)
        grads.append(torch.autograd.grad(out.pow(2).sum(), [q, k, v]))
    for g, r in zip(*grads):
        torch.testing.assert_close(g, r, **TOL)


def test_block_masks_skip_what_the_pattern_leaves_out() -> None:
    """At 2048 positions in blocks of 128 (16 x 16 blocks): causal computes 136 blocks; a window of 256 at most 3
    per query block (its own, the one before, and part of the one before that): 45; block-sparse (two local blocks, a
    summary block every 8) 38; local+global fewer than causal."""
    n = 2048
    counts = {}
    for name, mod in {"causal": F.causal_mod(), "window": sliding_window_mod(256),
                      "block_sparse": block_sparse_mod(128, 2, 8, causal=True),
                      "local_global": local_global_mod(256, 16, causal=True)}.items():
        blocks = F.block_mask(mod, None, None, n, n, "cpu")
        counts[name] = int(blocks.kv_num_blocks.sum() + (blocks.full_kv_num_blocks.sum()
                                                        if blocks.full_kv_num_blocks is not None else 0))
    assert counts["causal"] == 16 * 17 // 2
    assert counts["window"] == 1 + 2 + 14 * 3
    assert counts["block_sparse"] == 1 + 15 * 2 + 7  # two local blocks per row, and summary block 7 below rows 9..15
    assert counts["local_global"] < counts["causal"]


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                    reason="torch.compile of FlexAttention on the CPU needs a C compiler")
def test_compiled_flex_equals_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(F.SETTINGS, "compile", True)
    q, k, v = _qkv(256, 256)
    with torch.no_grad():
        out = F.attend(q, k, v, mask_mod=sliding_window_mod(64), score_mod=alibi_score_mod(ALiBi(H).slopes))
        ref, _ = scaled_dot_product_attention(q, k, v, mask=M.sliding_window_mask(256, 64),
                                              bias=ALiBi(H)(torch.arange(256)[None], torch.arange(256)[None]),
                                              backend="reference")
    torch.testing.assert_close(out, ref, **TOL)
