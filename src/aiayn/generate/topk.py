"""Per-row top-k and log-sum-exp over a large vocabulary, in few passes (beam search's hot spot on CPU).

``torch.topk`` on CPU partially sorts a copy of every row; over (128, 8000) logits (32 sentences x 4 beams,
the Multi30k vocabulary) it costs as much as the decoder's output-layer matmul, and ``torch.logsumexp``
makes several more passes. :func:`row_top` finds both from one pass that takes the maximum of every block of
``block`` entries:

- the k largest entries of a row lie in its k blocks with the largest maxima (a block holding one of them has
  a maximum at least as large as the k-th largest entry, and at most k blocks can hold such a maximum), so
  the exact top-k is a small ``topk`` over those blocks' entries;
- the row maximum is the first of those k; the log-sum-exp is the maximum minus ``log_softmax`` at it (torch's
  kernel fuses the max, exp and sum passes).

:func:`row_top_reference` is the plain torch version; tests hold the two equal.

Greedy decoding needs only the top 1 and no log-sum-exp, and ``torch.argmax`` on CPU is slow too (about 10x a plain
``amax`` over a 50257-wide row: it tracks an index per element). :func:`row_argmax` takes the block maxima the same
way, then the argmax of the best block only; ``Tensor.argmax`` is its reference.
"""

from __future__ import annotations

import torch
from torch import Tensor

MIN_BLOCKED = 2048  # below this many columns torch.topk on the whole row is as fast
MIN_BLOCKED_ARGMAX = 1 << 15  # rows x columns below which Tensor.argmax is as fast as row_argmax


def row_top_reference(x: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """The k largest entries of each row (values and column ids, best first) and the row log-sum-exp.

    Args:
        x: (N, V) float.
        k: 1 <= k <= V.
    Returns:
        values (N, k), ids (N, k) long, lse (N, 1).
    """
    values, ids = x.topk(k, dim=-1)
    return values, ids, torch.logsumexp(x, dim=-1, keepdim=True)


def row_top(x: Tensor, k: int, block: int = 64) -> tuple[Tensor, Tensor, Tensor]:
    """Same result as :func:`row_top_reference` (ties may pick other ids of equal value), faster for large V.

    Args:
        x: (N, V) float, finite or -inf (a row of all -inf gives lse -inf).
        k: 1 <= k <= V.
        block: entries per block.
    Returns:
        values (N, k), ids (N, k) long, lse (N, 1).
    """
    n, v = x.shape
    n_blocks = v // block
    if v < MIN_BLOCKED or n_blocks <= k:
        return row_top_reference(x, k)
    body = n_blocks * block
    block_max = x[:, :body].reshape(n, n_blocks, block).amax(dim=-1)  # (N, n_blocks)
    top_blocks = block_max.topk(k, dim=-1).indices  # (N, k)
    cols = (top_blocks[:, :, None] * block + torch.arange(block, device=x.device)).view(n, k * block)
    if body < v:  # the partial last block (fewer than `block` columns) is always searched
        cols = torch.cat([cols, torch.arange(body, v, device=x.device).expand(n, -1)], dim=1)
    values, pick = x.gather(1, cols).topk(k, dim=-1)  # (N, k)
    ids = cols.gather(1, pick)

    # the log-sum-exp: log_softmax at a row's maximum is exactly -log(sum(exp(x - max))), the kernel's own fused
    # max / exp-sum passes, about 1.8x faster than shifting, exp and sum as separate passes (128 x 8000: 0.56
    # against 1.01 ms; 128 x 32000: 2.7 against 4.7 ms, 2 threads, docs/BENCHMARKS.md)
    row_max, at_max = values[:, :1], ids[:, :1]  # (N, 1): the largest entry is the first of the top k
    lse = row_max - torch.log_softmax(x, dim=-1).gather(1, at_max)
    lse = torch.where(row_max.isfinite(), lse, row_max)  # a row of -inf: lse -inf (log_softmax gives NaN there)
    return values, ids, lse


def row_argmax(x: Tensor, block: int = 128) -> Tensor:
    """``x.argmax(dim=-1)`` (the first index of each row's maximum), in about the time of one ``amax`` pass.

    Args:
        x: (N, V) float, finite or -inf.
        block: entries per block.
    Returns:
        (N,) long column ids.
    """
    n, v = x.shape
    n_blocks = v // block
    if n * v < MIN_BLOCKED_ARGMAX or n_blocks < 2:
        return x.argmax(dim=-1)
    body = n_blocks * block
    blocks = x[:, :body].reshape(n, n_blocks, block)
    best, b = blocks.amax(dim=-1).max(dim=-1, keepdim=True)  # (N, 1): the largest block maximum, its first block
    cand = blocks.gather(1, b[:, :, None].expand(n, 1, block))  # (N, 1, block): that block's entries
    ids = cand.argmax(dim=-1).add_(b, alpha=block).squeeze(1)  # (N,)
    if body < v:  # the partial last block wins only with a strictly larger entry (argmax takes the first)
        tail_max, tail_id = x[:, body:].max(dim=-1)  # (N,)
        ids = torch.where(tail_max > best.squeeze(1), tail_id + body, ids)
    return ids
