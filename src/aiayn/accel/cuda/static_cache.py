"""A KV cache of fixed shapes for decoding with CUDA graphs (gpt-fast's static cache).

The core's :class:`~aiayn.nn.cache.DecoderCache` grows: each step's attention reads the filled positions
``[:length]``, so every step has other shapes, and beam search's reorder makes new tensors. A CUDA graph replays
one recorded sequence of kernels on fixed addresses, so here every tensor a step reads or writes is preallocated once
per decoding call and changed in place:

- ``kv`` (L, 2, R, Hkv, M, Dh): every layer's keys and values, R rows, M positions; a step writes its position with
  ``index_copy_`` at the position tensor ``slot`` and attends over all M positions under
- ``valid`` (R, M) bool: True at the filled positions that are real tokens (prompt padding stays False; the
  positions after ``slot`` are not filled yet, which makes the step causal);
- ``cross`` (L, 2, Rm, Hkv, S, Dh) and ``memory_valid`` (Rm, S): an encoder-decoder's projected memory and its padding
  flags, one row per source sentence, shared by ``group`` consecutive decoder rows (a sentence's beams: R = Rm g);
- ``ids``, ``positions`` (R, 1) and ``slot`` (1,): the step's inputs, copied in before each step.

R, Rm, M and S are the call's sizes rounded up to powers of two (:func:`bucket`), so that calls of nearby sizes reuse
one compiled step. Rows past the active ones (the rounding, or beam search's finished sentences) are computed and
ignored, and source positions past a sentence's are masked, so the shapes never change.

:class:`StaticDecoderCache` is a :class:`~aiayn.nn.cache.DecoderCache` that the reference fills as usual (the prompt,
an encoder-decoder's first step) and that moves into these buffers on the first static step
(:meth:`~StaticDecoderCache.adopt`); a step that cannot take the static path moves it back first
(:meth:`~StaticDecoderCache.release`), so the reference always finds an ordinary cache.
"""

from __future__ import annotations

import weakref
from typing import NamedTuple

import torch
from torch import Tensor

from aiayn.nn.cache import DecoderCache


class BufferSpec(NamedTuple):
    """The shapes, dtype and device of a set of :class:`StaticBuffers`."""

    n_layers: int
    rows: int  # R: decoder rows
    kv_heads: int  # Hkv
    max_len: int  # M: positions
    head_dim: int  # Dh
    memory_rows: int  # Rm: source sentences (0: decoder-only)
    src_len: int  # S: source positions (0: decoder-only)
    dtype: torch.dtype
    device: torch.device


class StaticBuffers:
    """The preallocated tensors of one static cache (see the module docstring for their shapes and meaning)."""

    def __init__(self, spec: BufferSpec, static_addresses: bool = False) -> None:
        s = spec
        self.spec = s
        opts = dict(device=s.device)
        self.kv = torch.zeros(s.n_layers, 2, s.rows, s.kv_heads, s.max_len, s.head_dim, dtype=s.dtype, **opts)
        self.valid = torch.zeros(s.rows, s.max_len, dtype=torch.bool, **opts)
        self.pos = torch.zeros(s.rows, s.max_len, dtype=torch.long, **opts)  # each filled position's id
        self.cross: Tensor | None = None
        self.memory_valid: Tensor | None = None
        if s.memory_rows:
            self.cross = torch.zeros(s.n_layers, 2, s.memory_rows, s.kv_heads, s.src_len, s.head_dim, dtype=s.dtype,
                                     **opts)
            self.memory_valid = torch.zeros(s.memory_rows, s.src_len, dtype=torch.bool, **opts)
        self.ids = torch.zeros(s.rows, 1, dtype=torch.long, **opts)
        self.positions = torch.zeros(s.rows, 1, dtype=torch.long, **opts)
        self.slot = torch.zeros(1, dtype=torch.long, **opts)
        if static_addresses:  # CUDA graphs read and write them in place, without copying them in
            for t in self.tensors():
                torch._dynamo.mark_static_address(t)

    def tensors(self) -> list[Tensor]:
        """Every buffer."""
        return [t for t in (self.kv, self.valid, self.pos, self.cross, self.memory_valid, self.ids, self.positions,
                            self.slot) if t is not None]

    def reset(self) -> None:
        """Back to the freshly made state (zeros, nothing valid), in place."""
        for t in self.tensors():
            t.zero_()


class BufferPool:
    """Keeps the buffers of the last finished decoding call for the next one of the same shapes, so that their
    addresses, and a CUDA graph recorded on them, stay valid from call to call. Holds at most one idle set."""

    def __init__(self, static_addresses: bool = False) -> None:
        self.static_addresses = static_addresses
        self.idle: StaticBuffers | None = None

    def take(self, spec: BufferSpec) -> StaticBuffers:
        """A set of buffers of ``spec``, reset: the idle set if it matches, else a new one."""
        idle, self.idle = self.idle, None  # an idle set of other shapes is let go before the new one is made
        if idle is not None and idle.spec == spec:
            idle.reset()
            return idle
        return StaticBuffers(spec, self.static_addresses)

    def put(self, buffers: StaticBuffers) -> None:
        """Take back a set no cache uses any more."""
        self.idle = buffers


def bucket(n: int) -> int:
    """The least power of two >= n (n >= 1): the buffers' sizes."""
    return 1 << max(n - 1, 0).bit_length()


def _padded(index: Tensor, rows: int) -> Tensor:
    """index (N,) long -> (rows,): padded with row 0 (padding rows are computed and ignored)."""
    n = index.shape[0]
    return index if n == rows else torch.cat([index, index.new_zeros(rows - n)])


class StaticDecoderCache(DecoderCache):
    """A :class:`~aiayn.nn.cache.DecoderCache` that moves into :class:`StaticBuffers` for the static decoding step.

    Until :meth:`adopt` (and after :meth:`release`) it is the core's cache, held in its ``store``. While adopted
    (``static`` is set) the buffers hold every position; ``store``, ``key_mask``, ``key_pos`` and the
    cross-attention caches are stale until :meth:`release` writes them back. :meth:`reorder` follows beams in place
    in either state.

    Make one with :meth:`convert` (``new_cache`` of the accelerator's stack does).
    """

    static: StaticBuffers | None
    rows: int  # active decoder rows N <= R
    memory_rows: int  # active memory rows Bm <= Rm
    src_len: int  # source positions S_src <= S
    group: int  # decoder rows per memory row

    @classmethod
    def convert(cls, cache: DecoderCache) -> StaticDecoderCache:
        """Make ``cache`` (an empty core cache) a static one, in place; returns it."""
        cache.__class__ = cls
        cache.static, cache.rows, cache.memory_rows, cache.src_len, cache.group = None, 0, 0, 0, 1
        cache._give_back = None
        return cache

    def adopt(self, rows: int, pool: BufferPool) -> bool:
        """Move the cached positions into buffers from ``pool`` for ``rows`` decoder rows; False (nothing changed)
        where the cache has no keys yet, holds another number of rows, or an encoder-decoder's memory is not
        projected yet."""
        store = self.store
        store.settle()
        data = store.data  # (capacity, B, L, 2, Hkv, Dh)
        length = self.length
        if data is None or data.shape[1] != rows or length == 0:
            return False
        memory_rows, src_len, group = 0, 0, 1
        if self.cross_attn:
            first = self.cross_attn[0]
            if first.k is None or first.k.shape[0] * first.group != rows:
                return False
            memory_rows, src_len, group = first.k.shape[0], first.k.shape[2], first.group
        _, _, n_layers, _, hkv, dh = data.shape
        # sizes rounded up to powers of two, so that calls of nearby sizes share buffers and a compiled step
        max_len = bucket(max(store.capacity, data.shape[0], length + 1))
        buffer_rows = bucket(memory_rows) * group if memory_rows else bucket(rows)
        s = pool.take(BufferSpec(n_layers, buffer_rows, hkv, max_len, dh, buffer_rows // group if memory_rows else 0,
                                 bucket(src_len) if memory_rows else 0, data.dtype, data.device))
        # (T, B, L, 2, Hkv, Dh) -> (L, 2, B, Hkv, T, Dh)
        s.kv[:, :, :rows, :, :length] = data[:length].permute(2, 3, 1, 4, 0, 5)
        s.valid[:rows, :length] = self.key_mask if self.key_pos is not None else True
        s.pos[:rows, :length] = self.key_positions(rows, data.device)
        for i, c in enumerate(self.cross_attn):
            s.cross[i, 0, :memory_rows, :, :src_len], s.cross[i, 1, :memory_rows, :, :src_len] = c.k, c.v
        self.static, self.rows, self.memory_rows, self.src_len, self.group = s, rows, memory_rows, src_len, group
        self._give_back = weakref.finalize(self, pool.put, s)  # at release, or when the cache is dropped
        return True

    def begin_step(self, ids: Tensor, positions: Tensor | None, memory_is_token: Tensor | None) -> bool:
        """Copy a step's inputs into the buffers: ids (N, 1); positions (N|1, 1) long, or None for the cache's length;
        the source padding flags (Bm, S) bool. False (nothing written) where they do not fit: other row counts, or no
        position left."""
        s = self.static
        n, length = ids.shape[0], self.length
        if s is None or n != self.rows or length + 1 > s.spec.max_len:
            return False
        if s.memory_valid is not None and (memory_is_token is None
                                           or memory_is_token.shape != (self.memory_rows, self.src_len)):
            return False
        s.ids[:n].copy_(ids)
        if positions is None:
            s.positions.fill_(length)
        else:
            s.positions[:n].copy_(positions.expand(n, 1))
        s.slot.fill_(length)
        if s.memory_valid is not None:
            s.memory_valid[:self.memory_rows, :self.src_len].copy_(memory_is_token)
        return True

    def end_step(self) -> None:
        """Count the position the step wrote."""
        self._length += 1

    def reorder(self, index: Tensor, memory_index: Tensor | None = None, group: int = 1) -> None:
        """Keep decoder rows ``index`` (N',) long (and memory rows ``memory_index``, each shared by ``group`` rows), as
        :meth:`DecoderCache.reorder <aiayn.nn.cache.DecoderCache.reorder>`: in the buffers, in place, while
        adopted; where they cannot hold the new rows (more rows, another group), the cache is released first."""
        s = self.static
        if s is not None and (index.shape[0] > s.spec.rows or (memory_index is not None and group != self.group)):
            self.release()
            s = None
        if s is None:
            super().reorder(index, memory_index, group)
            return
        rows = _padded(index, s.spec.rows)
        kv = s.kv[:, :, :, :, :self.length]  # (L, 2, R, Hkv, length, Dh): only the filled positions move
        kv.copy_(kv.index_select(2, rows))
        s.valid.copy_(s.valid.index_select(0, rows))
        s.pos.copy_(s.pos.index_select(0, rows))
        self.rows = index.shape[0]
        if memory_index is not None:
            s.cross.copy_(s.cross.index_select(2, _padded(memory_index, s.spec.memory_rows)))
            self.memory_rows = memory_index.shape[0]
            self.memory_mask_ready = False

    def release(self) -> None:
        """Write the buffers back into the core's form (store, key flags and ids, cross-attention caches) and give them
        back to their pool; nothing while not adopted."""
        s = self.static
        if s is None:
            return
        n, length = self.rows, self.length
        store = self.store
        data = s.kv.new_empty(s.spec.max_len, n, *s.kv.shape[:2], s.kv.shape[3], s.kv.shape[5])
        data[:length] = s.kv[:, :, :n, :, :length].permute(4, 2, 0, 1, 3, 5)  # -> (T, N, L, 2, Hkv, Dh)
        store.data, store._spare, store.rows, store.filled = data, None, None, length
        for c in self.self_attn:
            c.length = length
        self.key_mask = s.valid[:n, :length].clone()
        self.key_pos = s.pos[:n, :length].clone()
        for i, c in enumerate(self.cross_attn):
            c.k = s.cross[i, 0, :self.memory_rows, :, :self.src_len].clone()
            c.v = s.cross[i, 1, :self.memory_rows, :, :self.src_len].clone()
            c.group = self.group
        self.memory_mask_ready = False
        self.static = None
        self._give_back()
