"""A rolling KV cache for sliding-window attention: memory bounded by the window, not by the decoded length.

With a window of W, a query at cache index n sees keys n - W + 1 .. n. So each layer keeps W slots; the key of cache
index i lives in slot i % W and is overwritten W positions later (Mistral's rolling buffer). The slots are not in
position order, which attention does not mind: softmax over keys is order-free, provided the mask and the position
biases describe the same order. So the cache also keeps, per slot, its cache index (for the window mask), its
position id (for ALiBi / T5 biases) and whether it holds a real token (for padding).

A step of T new positions attends over the filled slots followed by its own T keys (at most W + T keys), and then
writes the last min(T, W) of them into the slots. Outputs equal those of the full :class:`~aiayn.nn.cache.DecoderCache`
up to float rounding (the keys are summed in another order).
"""

from __future__ import annotations

import torch
from torch import Tensor

from aiayn.nn.cache import DecoderCache


def _slots(start: int, t: int, window: int, device: torch.device) -> tuple[Tensor, int]:
    """The slots of cache indices start .. start + t - 1 that survive the step (the last min(t, W) of them), and
    how many of the t leading ones do not."""
    kept = min(t, window)
    return torch.arange(start + t - kept, start + t, device=device) % window, t - kept


class RollingAttnCache:
    """One layer's keys and values in W slots: (B, Hkv, W, Dh) each, slot i % W holding cache index i.

    Args:
        window: W, the sliding window of the model's self-attention.
    """

    def __init__(self, window: int) -> None:
        self.window = window
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.length = 0  # positions appended so far

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store new keys/values k, v (B, Hkv, t, Dh); return this step's keys and values (B, Hkv, f + t, Dh): the f
        filled slots in slot order, then the new ones (the order :meth:`RollingDecoderCache.extend` describes)."""
        b, h, t, d = k.shape
        filled = min(self.length, self.window)
        keys = torch.cat([self.k[:, :, :filled], k], dim=2) if filled else k  # a copy: the slots change below
        values = torch.cat([self.v[:, :, :filled], v], dim=2) if filled else v
        if self.k is None:
            self.k = k.new_zeros(b, h, self.window, d)
            self.v = v.new_zeros(b, h, self.window, d)
        slots, skip = _slots(self.length, t, self.window, k.device)
        self.k.index_copy_(2, slots, k[:, :, skip:])
        self.v.index_copy_(2, slots, v[:, :, skip:])
        self.length += t
        return keys, values

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (B',) long (beam search)."""
        if self.k is not None:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)


class RollingDecoderCache(DecoderCache):
    """A :class:`~aiayn.nn.cache.DecoderCache` whose self-attention layers keep only the last ``window`` positions.

    Besides the layers' slots it keeps, per slot, the cache index (``slot_index`` (W,), -1 while empty), the position
    id (``slot_pos`` (B, W)) and the padding flag (``slot_token`` (B, W)); :meth:`extend` returns the flags and ids of
    a step's keys in the layers' order, and :meth:`window_mask` the step's sliding-window mask over them.
    """

    def __init__(self, n_layers: int, window: int, cross: bool = False) -> None:
        super().__init__(n_layers, capacity=0, cross=cross)
        self.window = window
        self.self_attn = [RollingAttnCache(window) for _ in range(n_layers)]  # type: ignore[misc]
        self.slot_index: Tensor | None = None  # (W,) long
        self.slot_pos: Tensor | None = None  # (B, W) long
        self.slot_token: Tensor | None = None  # (B, W) bool
        self.key_index: Tensor | None = None  # (S',) long: the cache index of each key of the last step

    def extend(self, is_token: Tensor | None, positions: Tensor, padded: bool = False,
               default: bool = False) -> tuple[Tensor | None, Tensor | None]:
        """Record t new positions (flags (B, t) bool or None, ids (B, t) long); return the padding flags and ids of
        the step's keys, each (B, f + t): the f filled slots, then the new positions."""
        b, t = positions.shape
        device, n = positions.device, self._length
        self.padded = self.padded or padded
        if is_token is None:
            is_token = torch.ones(b, t, dtype=torch.bool, device=device)
        new_index = torch.arange(n, n + t, device=device)
        filled = min(n, self.window)
        if filled:
            self.key_mask = torch.cat([self.slot_token[:, :filled], is_token], dim=1)
            self.key_pos = torch.cat([self.slot_pos[:, :filled], positions], dim=1)
            self.key_index = torch.cat([self.slot_index[:filled], new_index])
        else:
            self.key_mask, self.key_pos, self.key_index = is_token, positions, new_index
            self.slot_index = torch.full((self.window,), -1, dtype=torch.long, device=device)
            self.slot_pos = torch.zeros(b, self.window, dtype=torch.long, device=device)
            self.slot_token = torch.zeros(b, self.window, dtype=torch.bool, device=device)
        slots, skip = _slots(n, t, self.window, device)
        self.slot_index[slots] = new_index[skip:]
        self.slot_pos[:, slots] = positions[:, skip:]
        self.slot_token[:, slots] = is_token[:, skip:]
        self._length += t
        return self.key_mask, self.key_pos

    def key_positions(self, rows: int, device: torch.device | str = "cpu") -> Tensor:
        """(B, S') long: the position id of each key of the last step."""
        return self.key_pos

    def window_mask(self, t: int) -> Tensor:
        """(T, S') bool: the last step's T queries (cache indices length - T ..) may attend the keys within the
        window up to themselves, as :func:`aiayn.nn.masks.sliding_window_mask` over the full cache."""
        q = torch.arange(self._length - t, self._length, device=self.key_index.device)[:, None]  # (T, 1)
        k = self.key_index[None, :]  # (1, S')
        return (k <= q) & (k > q - self.window)

    def reorder(self, index: Tensor, memory_index: Tensor | None = None, group: int = 1) -> None:
        """Keep decoder rows ``index`` (N',) long in every layer (as :meth:`DecoderCache.reorder`)."""
        for layer in self.self_attn:
            layer.reorder(index)
        if self.slot_pos is not None:
            self.slot_pos = self.slot_pos.index_select(0, index)
            self.slot_token = self.slot_token.index_select(0, index)
        if memory_index is not None:
            for c in self.cross_attn:
                c.reorder(memory_index, group)
            self.memory_mask_ready = False
        if self.key_pos is not None:
            self.key_mask = self.key_mask.index_select(0, index)
            self.key_pos = self.key_pos.index_select(0, index)
