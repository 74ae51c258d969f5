"""Tiled attention with an online softmax: FlashAttention's algorithm (Dao et al. 2022) in plain torch.

The reference attention holds the (B, H, T, S) scores. This one never does: it walks the keys in blocks of
``block`` and keeps, for every query row, a running maximum ``m``, a running sum ``l`` of exp(score - m) and a
running output ``acc``. When a new block raises the maximum from m to m', what was accumulated is rescaled by
exp(m - m'):

    m' = max(m, rowmax(s_j))          p_j = exp(s_j - m')
    l' = l exp(m - m') + rowsum(p_j)   acc' = acc exp(m - m') + p_j V_j        out = acc / l

The backward pass keeps only the output and the row's log-sum-exp ``lse = m + log l`` and recomputes each block's
probabilities from them, p_j = exp(s_j - lse), so training memory too is linear in the length:

    dV_j = p_j^T dO     dP_j = dO V_j^T     dS_j = p_j (dP_j - rowsum(dO * O))     dQ += dS_j K_j     dK_j = dS_j^T Q

This is how fused kernels (FlashAttention, torch's SDPA flash backend) work, written to be read; it equals
:func:`aiayn.nn.attention.scaled_dot_product_attention`'s reference backend up to float rounding.

Causal masking is done by index: a key block is multiplied only with the query rows that may see some of it, which
skips the upper triangle's work. Masks and biases given as tensors are sliced block by block.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

DEFAULT_BLOCK = 256
BLOCK_ELEMENTS = 1 << 16  # a block's (T, block) scores per batch row and head, at least: few queries, longer blocks


def tiled_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, bias: Tensor | None = None, *,
                    is_causal: bool = False, scale: float | None = None, softcap: float | None = None,
                    block: int | None = None) -> Tensor:
    """softmax(cap(q k^T * scale + bias), masked) v by key blocks, without (B, H, T, S) intermediates.

    Args:
        q: (B, H, T, Dh) queries.
        k, v: (B, H, S, Dh) keys and values (heads already expanded for GQA/MQA).
        mask: bool broadcastable to (B, H, T, S), True = may attend. A row with no allowed key gives zeros.
        bias: float broadcastable to (B, H, T, S), added to the scores (ALiBi, T5); it receives a gradient.
        is_causal: query i (at position S - T + i) sees keys j <= S - T + i, in addition to ``mask``.
        scale: score scale, default 1/sqrt(Dh).
        softcap: ``cap * tanh(scores / cap)`` on the biased scores before masking (Gemma 2), or None.
        block: keys per block; default :data:`DEFAULT_BLOCK`, or more for few queries (a decoding step's one query
            takes :data:`BLOCK_ELEMENTS` keys a block), so that each block's work outweighs its Python overhead.
    Returns:
        (B, H, T, Dh) in q's dtype; accumulation in at least fp32.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if block is None:
        block = max(DEFAULT_BLOCK, BLOCK_ELEMENTS // q.shape[2])
    return _TiledAttention.apply(q, k, v, mask, bias, is_causal, scale, softcap, block)


def _rows(t: int, s: int, j0: int, is_causal: bool) -> int:
    """The first query row that may see key j0 or later: the rows before it are all masked for that block."""
    return max(0, j0 - (s - t)) if is_causal else 0


def _block_scores(q: Tensor, k: Tensor, mask: Tensor | None, bias: Tensor | None, r0: int, j0: int, j1: int,
                  t: int, s: int, is_causal: bool, scale: float, softcap: float | None) -> tuple[Tensor, Tensor | None]:
    """Scores of query rows r0: against keys j0:j1, (B, H, T - r0, j1 - j0): capped, with masked entries at -inf;
    and tanh of the scaled scores (None without a cap), which the backward pass needs."""
    s_blk = torch.matmul(q[:, :, r0:], k[:, :, j0:j1].transpose(-2, -1)).mul_(scale)  # (B, H, Tr, Bk), a new tensor
    if bias is not None:
        s_blk += _slice(bias, r0, j0, j1)
    tanh = None
    if softcap is not None:
        tanh = torch.tanh(s_blk / softcap)
        s_blk = torch.mul(tanh, softcap)
    if mask is not None:
        s_blk.masked_fill_(~_slice(mask, r0, j0, j1), -math.inf)
    if is_causal:  # only the rows before the one at position j1 - 1 miss part of the block
        edge = min(t, j1 - 1 - (s - t)) - r0
        if edge > 0:
            qpos = torch.arange(s - t + r0, s - t + r0 + edge, device=q.device)[:, None]  # (edge, 1)
            future = torch.arange(j0, j1, device=q.device)[None, :] > qpos  # (edge, Bk)
            s_blk[:, :, :edge].masked_fill_(future, -math.inf)
    return s_blk, tanh


def _slice(x: Tensor, r0: int, j0: int, j1: int) -> Tensor:
    """Rows r0: and columns j0:j1 of a tensor broadcastable to (B, H, T, S) (broadcast dims stay size 1)."""
    x = x if x.shape[-2] == 1 else x[..., r0:, :]
    return x if x.shape[-1] == 1 else x[..., j0:j1]


def _sum_to(x: Tensor, shape: torch.Size) -> Tensor:
    """Sum ``x`` over the dimensions in which ``shape`` (same rank, or fewer leading dims) broadcasts."""
    while x.dim() > len(shape):
        x = x.sum(0)
    dims = [i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1]
    return x.sum(dims, keepdim=True) if dims else x


class _TiledAttention(torch.autograd.Function):
    """The forward by key blocks with running max and sum; the backward recomputes each block from the saved
    log-sum-exp (no (B, H, T, S) tensor is kept between them)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None,  # type: ignore[override]
                is_causal: bool, scale: float, softcap: float | None, block: int) -> Tensor:
        b, h, t, _ = q.shape
        s, dv = k.shape[2], v.shape[-1]
        acc_dtype = torch.promote_types(q.dtype, torch.float32)
        qf, kf, vf = q.to(acc_dtype), k.to(acc_dtype), v.to(acc_dtype)
        m = q.new_full((b, h, t, 1), -math.inf, dtype=acc_dtype)  # running row maximum
        l = q.new_zeros((b, h, t, 1), dtype=acc_dtype)  # running sum of exp(score - m)
        acc = q.new_zeros((b, h, t, dv), dtype=acc_dtype)  # running output, unnormalised
        biasf = bias.to(acc_dtype) if bias is not None else None
        for j0 in range(0, s, block):
            j1 = min(j0 + block, s)
            r0 = _rows(t, s, j0, is_causal)
            if r0 >= t:
                break  # causal: no later query sees this block or any after it
            s_blk, _ = _block_scores(qf, kf, mask, biasf, r0, j0, j1, t, s, is_causal, scale, softcap)
            m_old = m[:, :, r0:]
            m_new = torch.maximum(m_old, s_blk.amax(-1, keepdim=True))  # (B, H, Tr, 1)
            m_safe = m_new.masked_fill(m_new == -math.inf, 0.0)  # rows with nothing allowed yet: exp(-inf) = 0
            p = s_blk.sub_(m_safe).exp_()  # (B, H, Tr, Bk), in place of the scores
            alpha = torch.exp(m_old - m_safe)  # rescales what was accumulated under the old maximum
            l[:, :, r0:].mul_(alpha).add_(p.sum(-1, keepdim=True))
            acc[:, :, r0:].mul_(alpha).add_(torch.matmul(p, vf[:, :, j0:j1]))
            m[:, :, r0:] = m_new
        empty = l == 0  # rows with no allowed key: output 0, and lse +inf makes every recomputed p 0
        out = torch.where(empty, 0.0, acc / l.masked_fill(empty, 1.0))
        lse = torch.where(empty, math.inf, m + torch.log(l.masked_fill(empty, 1.0)))  # (B, H, T, 1)
        ctx.save_for_backward(q, k, v, mask, bias, out, lse)
        ctx.config = (is_causal, scale, softcap, block)
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        q, k, v, mask, bias, out, lse = ctx.saved_tensors
        is_causal, scale, softcap, block = ctx.config
        t, s = q.shape[2], k.shape[2]
        acc_dtype = out.dtype
        qf, kf, vf, do = q.to(acc_dtype), k.to(acc_dtype), v.to(acc_dtype), grad_out.to(acc_dtype)
        biasf = bias.to(acc_dtype) if bias is not None else None
        delta = (do * out).sum(-1, keepdim=True)  # (B, H, T, 1): rowsum(dO * O)
        dq, dk, dv = torch.zeros_like(qf), torch.zeros_like(kf), torch.zeros_like(vf)
        want_bias = bias is not None and ctx.needs_input_grad[4]
        dbias = torch.zeros_like(biasf) if want_bias else None
        for j0 in range(0, s, block):
            j1 = min(j0 + block, s)
            r0 = _rows(t, s, j0, is_causal)
            if r0 >= t:
                break
            s_blk, tanh = _block_scores(qf, kf, mask, biasf, r0, j0, j1, t, s, is_causal, scale, softcap)
            p = s_blk.sub_(lse[:, :, r0:]).exp_()  # (B, H, Tr, Bk): the forward's probabilities, recomputed
            do_r = do[:, :, r0:]
            dv[:, :, j0:j1] = torch.matmul(p.transpose(-2, -1), do_r)
            dp = torch.matmul(do_r, vf[:, :, j0:j1].transpose(-2, -1))
            ds = dp.sub_(delta[:, :, r0:]).mul_(p)  # gradient of the capped scores: p (dP - rowsum(dO * O))
            if tanh is not None:
                ds = ds.mul_(1.0 - tanh * tanh)  # d(cap * tanh(x / cap)) / dx
            if dbias is not None:
                rows = slice(None) if dbias.shape[-2] == 1 else slice(r0, None)
                cols = slice(None) if dbias.shape[-1] == 1 else slice(j0, j1)
                dbias[..., rows, cols] += _sum_to(ds, dbias[..., rows, cols].shape)
            dq[:, :, r0:] += torch.matmul(ds, kf[:, :, j0:j1]).mul_(scale)
            dk[:, :, j0:j1] = torch.matmul(ds.transpose(-2, -1), qf[:, :, r0:]).mul_(scale)
        dbias_out = dbias.to(bias.dtype) if dbias is not None else None
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, dbias_out, None, None, None, None)
