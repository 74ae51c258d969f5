"""Per-row top-k over a large vocabulary, in few passes (beam search's hot spot on CPU), and a fast argmax.

``torch.topk`` on CPU partially sorts a copy of every row; over (128, 8000) log-probabilities (32 sentences x 4
beams, the Multi30k vocabulary) it costs as much as the decoder's output-layer matmul. :func:`row_topk` finds the
same from one pass that takes the maximum of every block of ``block`` entries: the k largest entries of a row lie
in its k blocks with the largest maxima (a block holding one of them has a maximum at least as large as the k-th
largest entry, and at most k blocks can hold such a maximum), so the exact top-k is a small ``topk`` over those
blocks' entries. :func:`row_topk_reference` is the plain torch version; tests hold the two equal.

Greedy decoding needs only the top 1, and ``torch.argmax`` on CPU is slow too (about 10x a plain ``amax`` over a
50257-wide row: it tracks an index per element). :func:`row_argmax` takes the block maxima the same way, then the
argmax of the best block only; ``Tensor.argmax`` is its reference.
"""

from __future__ import annotations

import torch
from torch import Tensor

MIN_BLOCKED = 2048  # below this many columns torch.topk on the whole row is as fast
MIN_BLOCKED_ARGMAX = 1 << 15  # rows x columns below which Tensor.argmax is as fast as row_argmax


def row_topk_reference(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k largest entries of each row, best first: values (N, k) and column ids (N, k) long.

    Args:
        x: (N, V) float.
        k: 1 <= k <= V.
    """
    values, ids = x.topk(k, dim=-1)
    return values, ids


def row_topk(x: Tensor, k: int, block: int = 64) -> tuple[Tensor, Tensor]:
    """Same result as :func:`row_topk_reference` (ties may pick other ids of equal value), faster for large V.

    Args:
        x: (N, V) float, finite or -inf.
        k: 1 <= k <= V.
        block: entries per block.
    Returns:
        values (N, k), ids (N, k) long.
    """
    n, v = x.shape
    n_blocks = v // block
    if v < MIN_BLOCKED or n_blocks <= k:
        return row_topk_reference(x, k)
    body = n_blocks * block
    block_max = x[:, :body].reshape(n, n_blocks, block).amax(dim=-1)  # (N, n_blocks)
    top_blocks = block_max.topk(k, dim=-1).indices  # (N, k)
    cols = (top_blocks[:, :, None] * block + torch.arange(block, device=x.device)).view(n, k * block)
    if body < v:  # the partial last block (fewer than `block` columns) is always searched
        cols = torch.cat([cols, torch.arange(body, v, device=x.device).expand(n, -1)], dim=1)
    values, pick = x.gather(1, cols).topk(k, dim=-1)  # (N, k)
    return values, cols.gather(1, pick)


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
