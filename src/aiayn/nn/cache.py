"""Key/value caches for incremental decoding (gpt-fast style: preallocated, indexed by position).

A decoder step computes keys and values only for the new tokens; the self-attention cache holds those
of all earlier positions, and the cross-attention cache holds the projected encoder memory, computed once
per source sentence.
"""

from __future__ import annotations

import torch
from torch import Tensor


class SelfAttnCache:
    """Preallocated (B, Hkv, capacity, Dh) keys and values of one layer; grows by doubling if needed."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.length = 0

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store new keys/values k, v (B, Hkv, t, Dh); return all cached so far, (B, Hkv, length, Dh)."""
        b, h, t, d = k.shape
        end = self.length + t
        if self.k is None:
            cap = max(self.capacity, end)
            self.k = k.new_empty(b, h, cap, d)
            self.v = v.new_empty(b, h, cap, d)
        elif end > self.k.shape[2]:  # grow: double the capacity
            cap = max(2 * self.k.shape[2], end)
            self.k = torch.cat([self.k, self.k.new_empty(b, h, cap - self.k.shape[2], d)], dim=2)
            self.v = torch.cat([self.v, self.v.new_empty(b, h, cap - self.v.shape[2], d)], dim=2)
        self.k[:, :, self.length:end] = k
        self.v[:, :, self.length:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (B',) long, e.g. the surviving beams. Copies only the filled positions."""
        if self.k is None:
            return
        n, k, v = self.length, self.k, self.v
        if index.shape[0] != k.shape[0]:  # the batch size changes; otherwise (beam reordering) reuse the buffers
            self.k, self.v = k.new_empty(index.shape[0], *k.shape[1:]), v.new_empty(index.shape[0], *v.shape[1:])
        self.k[:, :, :n] = k[:, :, :n].index_select(0, index)  # index_select copies before the buffer is written
        self.v[:, :, :n] = v[:, :, :n].index_select(0, index)


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
        for c in self.self_attn:
            c.reorder(index)
        if memory_index is not None:
            for c in self.cross_attn:
                c.reorder(memory_index, group)
            self.memory_mask_ready = False  # the rows' sources changed: recompute from the new padding flags
        if self.key_pos is not None:
            self.key_mask = self.key_mask.index_select(0, index)
            self.key_pos = self.key_pos.index_select(0, index)
