"""Key/value caches for incremental decoding (gpt-fast style: preallocated, indexed by position).

A decoder step computes keys and values only for the new tokens; the self-attention cache holds those
of all earlier positions, and the cross-attention cache holds the projected encoder memory, computed once
per source sentence.

One cache, two ways of addressing its fixed-capacity buffer:

- **by position** (the default): position i in row i of the buffer; a step reads the filled rows ``[:length]`` and
  needs no mask while nothing is padding. The buffer doubles if a caller outgrows the capacity it asked for.
- **by slot** (a sliding window shorter than the capacity, or ``static=True``): C slots; cache index i is written to
  slot ``i % C`` and every slot records its cache index (-1 while empty), position id and padding flag, from which a
  step's mask (valid, causal, within the window, not padding) is made. A one-token step writes its keys first and
  then attends over all C slots: shapes and addresses never change from step to step, so the step can be compiled
  and replayed (CUDA graphs); the window's rolling is the modulo. A chunk of T > 1 positions attends over the slots
  followed by its own T keys, then stores the last min(T, C) of them.
"""

from __future__ import annotations

import torch
from torch import Tensor


class KVStore:
    """The keys and values of every layer of a decoder stack, in one preallocated time-major buffer.

    The buffer is (capacity, B, L, 2, Hkv, Dh): position, batch row, layer, key or value. The filled positions
    ``[:length]`` are one contiguous block of rows of B * L * 2 * Hkv * Dh values each, so beam search's reordering of
    the batch rows (:meth:`reorder`, every step) is one ``index_select`` for all layers' keys and values together,
    of exactly the filled part, into a spare buffer that then becomes the store: no temporary, no copy back, no work
    for the unfilled capacity, and a handful of dispatched ops per step however many layers there are. Each layer
    reads (B, Hkv, length, Dh) views of the same memory (strided, no copy; :class:`SelfAttnCache`). The price: while
    rows are reordered at a constant batch size (beam search), the spare doubles the cache's memory; a reorder that
    changes the batch size keeps no spare. The buffer is made on the first append (its shape, dtype and device come
    from the keys) and doubles its capacity when a layer outgrows it.
    """

    def __init__(self, n_layers: int, capacity: int, slotted: bool = False, static: bool = False) -> None:
        self.n_layers, self.capacity, self.slotted, self.static = n_layers, capacity, slotted or static, static
        self.data: Tensor | None = None  # (capacity, B, L, 2, Hkv, Dh)
        self._spare: Tensor | None = None  # reorder target, same shape as data
        # made once and kept for a decode's reorders: each buffer as (capacity * B, width), the store and its spare
        # (newest first); and (capacity, 1) t * B, the first flattened row of each position
        self._flats: list[tuple[Tensor, Tensor]] = []
        self._starts: Tensor | None = None
        self._starts_batch = 0  # the batch size B of _starts
        self.filled = 0  # positions written by at least one layer (slotted: all C slots count)
        # addressed by slot: what the current step does, set by DecoderCache.extend for every layer
        self.step_slots: Tensor | None = None  # (t',) long: the slots of the step's stored (last t') positions
        self.step_skip = 0  # how many leading new positions are not stored (a chunk longer than the capacity)
        self.write_first = False  # one-token step: write, then read all C slots
        self.read_slots = False  # a chunk: read the slots (before its writes) when any is filled

    def claim(self, end: int, like: Tensor | None = None) -> Tensor:
        """The buffer, holding positions up to ``end`` (its capacity doubled if needed), which count as filled.

        ``like``: the keys (B, Hkv, t, Dh) about to be written; they make the buffer on first use and must fit it.
        Without them the buffer must already exist (a decoding step's one-position write).
        """
        data = self.data
        if data is None:
            if like is None:
                raise RuntimeError("the cache is empty: its first positions go through SelfAttnCache.append()")
            b, h, _, d = like.shape
            if self.slotted:  # zeros: empty slots are masked, and 0 weight times a stale NaN would still be NaN
                data = self.data = like.new_zeros(self.capacity, b, self.n_layers, 2, h, d)
                self.filled = self.capacity
                if self.static:
                    static_address(data)
            else:
                data = self.data = like.new_empty(max(self.capacity, end), b, self.n_layers, 2, h, d)
        elif like is not None and (data.shape[1:] != (like.shape[0], self.n_layers, 2, like.shape[1], like.shape[3])
                                   or data.dtype != like.dtype):
            raise ValueError(f"keys of shape {tuple(like.shape)} ({like.dtype}) do not fit this cache, made for "
                             f"batch {data.shape[1]}, {data.shape[4]} heads of width {data.shape[5]} ({data.dtype})")
        if self.slotted:
            return data
        if end > data.shape[0]:  # grow: double the capacity
            grown = data.new_empty(max(2 * data.shape[0], end), *data.shape[1:])
            grown[:self.filled] = data[:self.filled]
            data, self.data, self._spare = grown, grown, None
        self.filled = max(self.filled, end)
        return data

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (B',) long, e.g. the surviving beams, in every layer: one ``index_select`` of
        rows of the flattened (capacity * B, L * 2 * Hkv * Dh) buffer's filled positions (a dim-0 select, which torch
        parallelizes and copies row by row) into the spare buffer, which then becomes the store."""
        data, n = self.data, self.filled
        if data is None:
            return
        b, b_new = data.shape[1], index.shape[0]
        if self.static and b == b_new:  # in place: a compiled step keeps reading the same addresses
            data.copy_(data.index_select(1, index))
            return
        if self._spare is None or self._spare.shape[1] != b_new:
            self._spare = data.new_empty(data.shape[0], b_new, *data.shape[2:])
        new = self._spare
        if self._starts is None or self._starts.shape[0] != data.shape[0] or self._starts_batch != b:
            self._starts, self._starts_batch = torch.arange(data.shape[0], device=data.device)[:, None] * b, b
        torch.index_select(self._flat(data)[:n * b], 0, time_major_index(index, n, b, self._starts),
                           out=self._flat(new)[:n * b_new])
        self.data = new
        self._spare = data if b == b_new else None  # the old buffer becomes the next spare at an unchanged size
        if self.static:
            static_address(new)

    def _flat(self, buffer: Tensor) -> Tensor:
        """``buffer`` (C, B, ...) as (C * B, width), the view made once per buffer (a reorder then makes none)."""
        for held, flat in self._flats:
            if held is buffer:
                return flat
        flat = buffer.view(buffer.shape[0] * buffer.shape[1], -1)
        self._flats = [(buffer, flat), *self._flats[:1]]
        return flat


class SelfAttnCache:
    """One layer's keys and values in its stack's :class:`KVStore`; appended at every step, read as strided views.

    Args:
        store: the stack's store (:class:`DecoderCache` makes one for all its layers).
        layer: this layer's index in the store.
    """

    def __init__(self, store: KVStore, layer: int) -> None:
        self.store, self.layer = store, layer
        self.length = 0

    @property
    def k(self) -> Tensor | None:
        """This layer's key buffer (capacity, B, Hkv, Dh); None before the first append."""
        data = self.store.data
        return None if data is None else data[:, :, self.layer, 0]

    @property
    def v(self) -> Tensor | None:
        """This layer's value buffer (capacity, B, Hkv, Dh); None before the first append."""
        data = self.store.data
        return None if data is None else data[:, :, self.layer, 1]

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store new keys/values k, v (B, Hkv, t, Dh); return the keys and values this step attends over, each
        (B, Hkv, S, Dh): by position, all cached so far (views); by slot, the step's keys in the order its mask
        describes (:class:`DecoderCache`)."""
        if self.store.slotted:
            return self._append_slots(k, v)
        end = self.length + k.shape[2]
        data = self.store.claim(end, like=k)
        slot = data[self.length:end, :, self.layer]  # (t, B, 2, Hkv, Dh)
        slot[:, :, 0] = k.permute(2, 0, 1, 3)
        slot[:, :, 1] = v.permute(2, 0, 1, 3)
        self.length = end
        return self._views(data, end)

    def append_step(self, kv: Tensor) -> tuple[Tensor, Tensor]:
        """Store one new position's keys and values, kv (B, 2 * Hkv, 1, Dh) laid out as a fused QKV projection gives
        them (all key heads, then all value heads); return all cached so far, (B, Hkv, length, Dh) views.

        The same as :meth:`append` of the two halves as (B, Hkv, 1, Dh) each, in one copy (a decoding step's hot
        path), after the first :meth:`append`.
        """
        store = self.store
        if store.slotted:  # (B, 2 * Hkv, 1, Dh) -> (1, B, 2, Hkv, Dh) into the step's slot of every row
            data = store.claim(store.capacity)
            data[:, :, self.layer].index_copy_(0, store.step_slots, kv.view(1, *data.shape[1:2], *data.shape[3:]))
            return self._slot_views(data)
        end = self.length + 1
        data = store.claim(end)
        s_t, s_b, s_l, _, s_h, _ = data.stride()  # (B, 2 * Hkv, 1, Dh) at position `length` of this layer
        data.as_strided(kv.shape, (s_b, s_h, 0, 1), data.storage_offset() + self.length * s_t + self.layer * s_l
                        ).copy_(kv)
        self.length = end
        return self._views(data, end)

    def _append_slots(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`append` addressed by slot: a one-token step writes, then returns all C slots; a chunk returns the
        filled slots' keys followed by its own (copies, taken before its writes), then stores its last positions."""
        store = self.store
        data = store.claim(store.capacity, like=k)
        if store.write_first:
            stored_k, stored_v = k, v
        else:
            keys, values = self._slot_views(data)
            keys = torch.cat([keys, k], dim=2) if store.read_slots else k  # (B, Hkv, [C +] t, Dh)
            values = torch.cat([values, v], dim=2) if store.read_slots else v
            stored_k, stored_v = k[:, :, store.step_skip:], v[:, :, store.step_skip:]
        layer = data[:, :, self.layer]  # (C, B, 2, Hkv, Dh)
        layer[:, :, 0].index_copy_(0, store.step_slots, stored_k.permute(2, 0, 1, 3))
        layer[:, :, 1].index_copy_(0, store.step_slots, stored_v.permute(2, 0, 1, 3))
        return self._slot_views(data) if store.write_first else (keys, values)

    def _slot_views(self, data: Tensor) -> tuple[Tensor, Tensor]:
        """This layer's keys and values in all C slots, as (B, Hkv, C, Dh) views of ``data`` (indexing, which a
        compiler traces, where :meth:`_views` computes strides)."""
        layer = data[:, :, self.layer]  # (C, B, 2, Hkv, Dh)
        return layer[:, :, 0].permute(1, 2, 0, 3), layer[:, :, 1].permute(1, 2, 0, 3)

    def _views(self, data: Tensor, n: int) -> tuple[Tensor, Tensor]:
        """This layer's keys and values at positions [:n], as (B, Hkv, n, Dh) views of ``data``."""
        _, b, _, _, h, d = data.shape
        s_t, s_b, s_l, s_kv, s_h, _ = data.stride()
        base = data.storage_offset() + self.layer * s_l
        shape, strides = (b, h, n, d), (s_b, s_h, s_t, 1)
        return data.as_strided(shape, strides, base), data.as_strided(shape, strides, base + s_kv)


def static_address(*tensors: Tensor) -> None:
    """Mark buffers that a compiled step writes in place as living at fixed addresses, so that CUDA graphs replay
    over them instead of copying them at every step (``torch._dynamo.mark_static_address``)."""
    for t in tensors:
        torch._dynamo.mark_static_address(t, guard=False)


def time_major_index(index: Tensor, length: int, batch: int, starts: Tensor | None = None) -> Tensor:
    """Rows of a flattened (length, batch) time-major block that keep batch rows ``index`` at every position:
    (length * B',) long, ``t * batch + index[j]`` at ``t * B' + j``; ``index`` (B',) long, or (length, B') for a row
    per position (``index[t, j]``). ``starts``: (>= length, 1) long ``t * batch``, when the caller keeps it."""
    if starts is None:
        starts = torch.arange(length, device=index.device)[:, None] * batch
    return (starts[:length] + index).view(-1)


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
    """Everything a decoder stack keeps between steps (see the module docstring for the two ways of addressing).

    Args:
        n_layers: layers of the stack.
        capacity: positions to hold (by position the buffer grows past it; by slot it is C, unless ``window``).
        cross: also keep cross-attention caches (a decoder of an encoder-decoder model).
        window: the stack's sliding window; shorter than ``capacity`` it makes a cache of ``window`` slots.
        static: address by slot with C = ``capacity`` (no window needed): the fixed shapes a compiled step wants.

    Attributes:
        self_attn: one :class:`SelfAttnCache` per layer.
        cross_attn: one :class:`CrossAttnCache` per layer (empty list for decoder-only models).
        key_mask: (B, length) bool, True at real (non-padding) cached positions; None while every row's positions
            are 0 .. length - 1 and none is padding (:meth:`extend` with ``default=True``: nothing is stored, built
            or reordered per step then; :meth:`key_positions` makes the ids on demand). By slot: None (the step's
            keys' flags are returned, not kept).
        key_pos: (B, length) long, position id of each cached position (for ALiBi/T5 biases); None with key_mask.
        padded: whether any cached position is padding (so a key mask is needed).
        memory_mask: the cross-attention padding mask (Bm, 1, 1, S) of the memory rows, or None; valid while
            ``memory_mask_ready``.
        slotted: addressed by slot. Then ``cursor`` (1,) long is the next cache index, ``slot_index`` (C,) long,
            ``slot_pos`` (B, C) long and ``slot_token`` (B, C) bool describe the slots, and ``step_mask``
            (B, 1, T, S) bool is the last step's self-attention mask.
    """

    def __init__(self, n_layers: int, capacity: int, cross: bool = False, window: int | None = None,
                 static: bool = False) -> None:
        ring = window is not None and capacity > window
        self.slotted, self.window = static or ring, window
        self.static = static
        self.store = KVStore(n_layers, window if ring else capacity, slotted=self.slotted, static=static)
        self.self_attn = [SelfAttnCache(self.store, i) for i in range(n_layers)]
        self.cross_attn = [CrossAttnCache() for _ in range(n_layers)] if cross else []
        self.key_mask: Tensor | None = None
        self.key_pos: Tensor | None = None
        self._length = 0  # cached positions; with key_pos None they are 0 .. length - 1 in every row, none padding
        self.padded = False
        self.memory_mask: Tensor | None = None
        self.memory_mask_ready = False
        self.cursor: Tensor | None = None
        self.slot_index: Tensor | None = None
        self.slot_pos: Tensor | None = None
        self.slot_token: Tensor | None = None
        self.step_mask: Tensor | None = None

    @property
    def length(self) -> int:
        """Number of cached positions (by slot: read from the device)."""
        if self.slotted:
            return 0 if self.cursor is None else int(self.cursor)
        return self._length

    def next_positions(self, t: int, device: torch.device | str) -> Tensor:
        """(1, T) long: the default position ids of the next T positions, ``length + arange(T)``; by slot made on the
        device from ``cursor``, without a host sync."""
        if self.slotted and self.cursor is not None:
            return (self.cursor + torch.arange(t, device=device))[None]
        start = self.length
        return torch.arange(start, start + t, device=device)[None]

    def key_positions(self, rows: int, device: torch.device | str = "cpu") -> Tensor:
        """(rows|B, length) long: every cached position's id (``key_pos``, or 0 .. length - 1 broadcast over the
        rows where nothing is stored)."""
        if self.key_pos is not None:
            return self.key_pos
        return torch.arange(self._length, device=device)[None].expand(rows, self._length)

    def advance(self, t: int, padded: bool = False) -> bool:
        """Record t new positions at the default ids (length .. length + t - 1) without storing anything, where
        nothing needs storing: every extension so far, and this one (``padded`` False), unpadded and at default
        positions, by position. Returns whether it did; where it did not, :meth:`extend` records them."""
        if self.slotted or self.key_pos is not None or self.padded or padded:
            return False
        self._length += t
        return True

    def extend(self, is_token: Tensor | None, positions: Tensor, padded: bool = False,
               default: bool = False) -> tuple[Tensor | None, Tensor | None]:
        """Record t new positions: their padding flags (B, t) bool (None: all real tokens) and ids (B, t); return the
        full (B, length) flags and ids, or (None, None) while nothing needs storing.

        ``padded`` says whether any of the new positions is padding (the caller knows without a host sync);
        ``default`` that ``positions`` are length .. length + t - 1 in every row. While every extension is
        unpadded and default, nothing is stored: a decoding step then spends no op here nor in :meth:`reorder`.
        By slot: the flags and ids of the step's keys (B, S), and ``step_mask`` is set.
        """
        if self.slotted:
            return self._extend_slots(is_token, positions)
        b, t = positions.shape
        if default and self.advance(t, padded):
            return None, None
        self.padded = self.padded or padded
        if is_token is None:
            is_token = torch.ones(b, t, dtype=torch.bool, device=positions.device)
        if self.key_pos is None and self._length:  # the stored form from here on
            self.key_mask = torch.ones(b, self._length, dtype=torch.bool, device=positions.device)
            self.key_pos = self.key_positions(b, positions.device)
        if self.key_pos is None:
            self.key_mask, self.key_pos = is_token, positions
        else:
            self.key_mask = torch.cat([self.key_mask, is_token], dim=1)
            self.key_pos = torch.cat([self.key_pos, positions], dim=1)
        self._length += t
        return self.key_mask, self.key_pos

    def _extend_slots(self, is_token: Tensor | None, positions: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`extend` by slot: record the new positions in their slots and make the step's mask, with device
        ops only (no host sync, the same shapes at every one-token step)."""
        b, t = positions.shape
        device, c, store = positions.device, self.store.capacity, self.store
        if is_token is None:
            is_token = torch.ones(b, t, dtype=torch.bool, device=device)
        started = self.cursor is not None
        if not started:
            self.cursor = torch.zeros(1, dtype=torch.long, device=device)
            self.slot_index = torch.full((c,), -1, dtype=torch.long, device=device)
            self.slot_pos = torch.zeros(b, c, dtype=torch.long, device=device)
            self.slot_token = torch.zeros(b, c, dtype=torch.bool, device=device)
            if self.static:
                static_address(self.cursor, self.slot_index, self.slot_pos, self.slot_token)
        elif self.window is None and t > 1 and self.length + t > c:  # a one-token step past C is the caller's error
            raise ValueError(f"{self.length} + {t} positions do not fit a static cache of {c}")
        index = self.cursor + torch.arange(t, device=device)  # (T,) the new positions' cache indices
        skip = max(t - c, 0)
        slots = index[skip:] % c  # (t',) where the last t' = min(T, C) new positions go
        store.step_slots, store.step_skip = slots, skip
        store.write_first, store.read_slots = t == 1, started
        if t > 1:  # the slots as they were, then the new positions (copies: the writes below change the slots)
            key_index = torch.cat([self.slot_index, index]) if started else index
            key_token = torch.cat([self.slot_token, is_token], dim=1) if started else is_token
            key_pos = torch.cat([self.slot_pos, positions], dim=1) if started else positions
        self.slot_index.index_copy_(0, slots, index[skip:])
        self.slot_pos.index_copy_(1, slots, positions[:, skip:])
        self.slot_token.index_copy_(1, slots, is_token[:, skip:])
        if t == 1:
            key_index, key_token, key_pos = self.slot_index, self.slot_token, self.slot_pos
        visible = (key_index[None, :] >= 0) & (key_index[None, :] <= index[:, None])  # (T, S) filled and causal
        if self.window is not None:
            visible = visible & (key_index[None, :] > index[:, None] - self.window)
        self.step_mask = visible[None, None] & key_token[:, None, None, :]  # (B, 1, T, S)
        self.cursor.add_(t)
        return key_token, key_pos  # step-local: nothing to store or reorder

    def reorder(self, index: Tensor, memory_index: Tensor | None = None, group: int = 1) -> None:
        """Keep decoder rows ``index`` (N',) long in every layer (beam search).

        ``memory_index`` (Bm',) long, when given, keeps those rows of the cross-attention caches, each then
        shared by ``group`` consecutive decoder rows (see :class:`CrossAttnCache`); None leaves the cross caches
        alone (rows reordered among those sharing one source sentence, whose projected memory is identical).
        """
        self.store.reorder(index)
        if memory_index is not None:
            for c in self.cross_attn:
                c.reorder(memory_index, group)
            self.memory_mask_ready = False  # the rows' sources changed: recompute from the new padding flags
        if self.slot_pos is not None and self.static and index.shape[0] == self.slot_pos.shape[0]:
            self.slot_pos.copy_(self.slot_pos.index_select(0, index))  # in place, as the store
            self.slot_token.copy_(self.slot_token.index_select(0, index))
        elif self.slot_pos is not None:
            self.slot_pos = self.slot_pos.index_select(0, index)
            self.slot_token = self.slot_token.index_select(0, index)
            if self.static:
                static_address(self.slot_pos, self.slot_token)
        if self.key_pos is not None:
            self.key_mask = self.key_mask.index_select(0, index)
            self.key_pos = self.key_pos.index_select(0, index)

    def joined(self, other: DecoderCache) -> DecoderCache:
        """A cache of this cache's rows followed by ``other``'s, for a batch that new rows join while it decodes.

        Both must be self-attention caches addressed by position. Each row keeps its keys, values and position ids;
        the shorter cache's rows are right-aligned (its rows' first positions become padding, masked), so every
        row's next position is the joined cache's next one.
        Returns:
            a new cache of B_self + B_other rows and length max(L_self, L_other); neither input is changed.
        """
        if self.slotted or other.slotted or self.cross_attn or other.cross_attn:
            raise ValueError("only decoder-only caches addressed by position can be joined")
        a, b = self.store.data, other.store.data
        if a is None or b is None:
            raise ValueError("join caches after their prompts are stored")
        ra, rb, n = a.shape[1], b.shape[1], max(self._length, other._length)
        joined = DecoderCache(self.store.n_layers, max(a.shape[0], b.shape[0], n))
        joined.store.data, joined.store.filled = a.new_empty(joined.store.capacity, ra + rb, *a.shape[2:]), n
        for layer in joined.self_attn:
            layer.length = n
        joined._length = n
        joined.key_mask = torch.zeros(ra + rb, n, dtype=torch.bool, device=a.device)
        joined.key_pos = torch.zeros(ra + rb, n, dtype=torch.long, device=a.device)
        joined.fill_rows(torch.arange(ra, device=a.device), self)
        joined.fill_rows(torch.arange(ra, ra + rb, device=a.device), other)
        return joined

    def fill_rows(self, slots: Tensor, other: DecoderCache) -> None:
        """Write ``other``'s rows into rows ``slots`` (G,) long of this cache, in place: the rows of sequences that
        left a joined batch, reused by ones that join it (no copy of the other rows). ``other`` must be no longer
        than this cache; its rows are right-aligned, their first positions masked, as :meth:`joined` does."""
        if self.slotted or other.slotted or self.cross_attn or other.cross_attn:
            raise ValueError("only decoder-only caches addressed by position can share rows")
        a, b = self.store.data, other.store.data
        n, length = self._length, other._length
        if a is None or b is None or length > n or b.shape[1] != slots.shape[0]:
            raise ValueError("fill_rows needs stored caches, one row of `other` per slot, and `other` no longer "
                             "than this cache")
        rows = a.shape[1]
        if self.key_pos is None:  # the stored form from here on
            self.key_mask = torch.ones(rows, n, dtype=torch.bool, device=a.device)
            self.key_pos = self.key_positions(rows, a.device)
        a[:n - length].index_fill_(1, slots, 0)  # zeros, not stale values: a masked key's weight 0 times NaN is NaN
        a[n - length:n].index_copy_(1, slots, b[:length])
        g = slots.shape[0]
        mask = other.key_mask if other.key_mask is not None else torch.ones(g, length, dtype=torch.bool,
                                                                                device=a.device)
        front = torch.zeros(g, n - length, dtype=torch.bool, device=a.device)
        self.key_mask = self.key_mask.index_copy(0, slots, torch.cat([front, mask], dim=1))
        self.key_pos = self.key_pos.index_copy(0, slots, torch.cat([front.long(), other.key_positions(g, a.device)],
                                                                   dim=1))
        self.padded = True

    def drop_front(self, k: int) -> None:
        """Forget the first ``k`` cached positions, padding in every row (after the rows that used them left a
        joined batch), so that the cache's length follows its longest row instead of growing with every step."""
        if (self.slotted or self.cross_attn or self.store.data is None or self.key_pos is None
                or not 0 <= k <= self._length):
            raise ValueError("drop_front needs a joined cache (decoder-only, by position, with stored positions) and "
                             "k <= its length")
        if k == 0:
            return
        store, n = self.store, self._length - k
        store.data = store.data[k:].clone()  # a new buffer: the old one's spare and flattened views go with it
        store._spare, store._flats, store._starts = None, [], None
        store.filled = n
        for layer in self.self_attn:
            layer.length = n
        self.key_mask, self.key_pos = self.key_mask[:, k:], self.key_pos[:, k:]
        self._length = n
