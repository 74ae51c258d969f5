"""Key/value caches for incremental decoding (gpt-fast style: preallocated, indexed by position).

A decoder step computes keys and values only for the new tokens; the self-attention cache holds those
of all earlier positions, and the cross-attention cache holds the projected encoder memory, computed once
per source sentence.
"""

from __future__ import annotations

import torch
from torch import Tensor


class SelfAttnCache:
    """Preallocated keys and values of one layer, stored time-major; grows by doubling if needed.

    The buffers are (capacity, B, Hkv, Dh): the filled positions ``[:length]`` are one contiguous block, so beam
    search's reordering of the batch rows (:meth:`reorder`, every step) is one ``index_select`` of exactly the
    filled part into a spare buffer, which then becomes the cache: no temporary, no copy back, no work for the
    unfilled capacity. Attention reads (B, Hkv, length, Dh) views of the same memory (strided, no copy).
    The price: while rows are reordered at a constant batch size (beam search), the spare doubles this layer's
    cache memory; a reorder that changes the batch size keeps no spare.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.k: Tensor | None = None  # (capacity, B, Hkv, Dh)
        self.v: Tensor | None = None
        self._spare: tuple[Tensor, Tensor] | None = None  # reorder targets, same shape as k and v
        self.length = 0

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store new keys/values k, v (B, Hkv, t, Dh); return all cached so far, (B, Hkv, length, Dh) views."""
        b, h, t, d = k.shape
        end = self.length + t
        if self.k is None:
            cap = max(self.capacity, end)
            self.k = k.new_empty(cap, b, h, d)
            self.v = v.new_empty(cap, b, h, d)
        elif end > self.k.shape[0]:  # grow: double the capacity
            cap = max(2 * self.k.shape[0], end)
            self.k = torch.cat([self.k, self.k.new_empty(cap - self.k.shape[0], b, h, d)])
            self.v = torch.cat([self.v, self.v.new_empty(cap - self.v.shape[0], b, h, d)])
            self._spare = None
        self.k[self.length:end] = k.permute(2, 0, 1, 3)
        self.v[self.length:end] = v.permute(2, 0, 1, 3)
        self.length = end
        return self.k[:end].permute(1, 2, 0, 3), self.v[:end].permute(1, 2, 0, 3)

    def reorder(self, index: Tensor, flat_index: Tensor | None = None) -> None:
        """Keep batch rows ``index`` (B',) long, e.g. the surviving beams. Copies only the filled positions.

        ``flat_index`` is :func:`time_major_index` of ``index`` for this cache's length and batch size, when the
        caller already has it (a decoder reorders every layer with the same one).
        """
        if self.k is None:
            return
        n, k, v = self.length, self.k, self.v
        b, b_new = k.shape[1], index.shape[0]
        if self._spare is None or self._spare[0].shape[1] != b_new:
            shape = (k.shape[0], b_new, *k.shape[2:])
            self._spare = (k.new_empty(shape), v.new_empty(shape))
        new_k, new_v = self._spare
        if flat_index is None:
            flat_index = time_major_index(index, n, b)
        # rows of the (capacity * B, Hkv * Dh) views: one dim-0 index_select, which torch parallelizes and copies
        # row by row (a dim-1 select of the (n, B, Hkv, Dh) block ran on one thread only)
        width = k.shape[2] * k.shape[3]
        for old, new in ((k, new_k), (v, new_v)):
            torch.index_select(old.view(-1, width)[:n * b], 0, flat_index, out=new.view(-1, width)[:n * b_new])
        self.k, self.v = new_k, new_v
        # the old buffers become the next spare if the batch size did not change
        self._spare = (k, v) if b == b_new else None


def time_major_index(index: Tensor, length: int, batch: int) -> Tensor:
    """Rows of a flattened (length, batch) time-major block that keep batch rows ``index`` (B',) long at every
    position: (length * B',) long, ``t * batch + index[j]`` at ``t * B' + j``."""
    return (torch.arange(length, device=index.device)[:, None] * batch + index).view(-1)


class CrossAttnCache:
    """Projected encoder memory (Bm, Hkv, S, Dh) of one layer, filled on the first decoding step.

    ``group`` decoder rows share each memory row: row i attends to memory row ``i // group``. Beam search keeps
    one copy of each sentence's memory for its K beams (group = K) instead of K copies, and attention folds the
    K beams' queries into one (Bm, H, K, Dh) block per sentence.
    """

    def __init__(self) -> None:
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.group = 1

    def reorder(self, index: Tensor, group: int = 1) -> None:
        """Keep memory rows ``index`` (Bm',) long; ``group`` decoder rows will share each of them."""
        if self.k is not None:
            self.k = self.k.index_select(0, index)
            self.v = self.v.index_select(0, index)
        self.group = group


class DecoderCache:
    """Everything a decoder stack keeps between steps.

    Attributes:
        self_attn: one :class:`SelfAttnCache` per layer.
        cross_attn: one :class:`CrossAttnCache` per layer (empty list for decoder-only models).
        key_mask: (B, length) bool, True at real (non-padding) cached positions.
        key_pos: (B, length) long, position id of each cached position (for ALiBi/T5 biases).
        padded: whether any cached position is padding (so a key mask is needed).
        memory_mask: the cross-attention padding mask (Bm, 1, 1, S) of the memory rows, or None; valid while
            ``memory_mask_ready``.
    """

    def __init__(self, n_layers: int, capacity: int, cross: bool = False) -> None:
        self.self_attn = [SelfAttnCache(capacity) for _ in range(n_layers)]
        self.cross_attn = [CrossAttnCache() for _ in range(n_layers)] if cross else []
        self.key_mask: Tensor | None = None
        self.key_pos: Tensor | None = None
        self.padded = False
        self.memory_mask: Tensor | None = None
        self.memory_mask_ready = False

    @property
    def length(self) -> int:
        """Number of cached positions."""
        return 0 if self.key_pos is None else self.key_pos.shape[1]

    def extend(self, is_token: Tensor, positions: Tensor, padded: bool = False) -> tuple[Tensor, Tensor]:
        """Record the new positions' padding flags and ids, both (B, t); return the full (B, length) ones.

        ``padded`` says whether any of the new positions is padding (the caller knows without a host sync).
        """
        self.padded = self.padded or padded
        if self.key_pos is None:
            self.key_mask, self.key_pos = is_token, positions
        else:
            self.key_mask = torch.cat([self.key_mask, is_token], dim=1)
            self.key_pos = torch.cat([self.key_pos, positions], dim=1)
        return self.key_mask, self.key_pos

    def reorder(self, index: Tensor, memory_index: Tensor | None = None, group: int = 1) -> None:
        """Keep decoder rows ``index`` (N',) long in every layer (beam search).

        ``memory_index`` (Bm',) long, when given, keeps those rows of the cross-attention caches, each then
        shared by ``group`` consecutive decoder rows (see :class:`CrossAttnCache`); None leaves the cross caches
        alone (rows reordered among those sharing one source sentence, whose projected memory is identical).
        """
        filled = [c for c in self.self_attn if c.k is not None]
        flat = time_major_index(index, filled[0].length, filled[0].k.shape[1]) if filled else None
        for c in filled:
            c.reorder(index, flat)
        if memory_index is not None:
            for c in self.cross_attn:
                c.reorder(memory_index, group)
            self.memory_mask_ready = False  # the rows' sources changed: recompute from the new padding flags
        if self.key_pos is not None:
            self.key_mask = self.key_mask.index_select(0, index)
            self.key_pos = self.key_pos.index_select(0, index)
