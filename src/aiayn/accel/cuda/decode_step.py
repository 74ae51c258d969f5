"""A one-token decoding step of fixed shapes over a :class:`~aiayn.accel.cuda.static_cache.StaticDecoderCache`,
compiled with ``torch.compile(mode="reduce-overhead")`` on CUDA, so that each step is one CUDA graph replay.

A step through the modules launches a few hundred small kernels from Python, and at decoding's batch sizes the GPU
waits on that Python. :class:`StaticDecodeStep` runs the same operations, in the same order, as the stack's modules
with one new token per row (:class:`~aiayn.nn.layers.TransformerLayer`, :class:`~aiayn.nn.attention.MultiHeadAttention`
with a cache), with every shape fixed by the static cache: the new keys and values are written in place at the
position tensor ``slot``, and attention runs over all M positions of the buffers under the mask of the filled ones,
through the core's :func:`~aiayn.nn.attention.scaled_dot_product_attention`. Fixed shapes and in-place writes are what
lets ``torch.compile`` record the step once as a CUDA graph and replay it at every later step.

Compilation (``compile``): "auto" is "reduce-overhead" (CUDA graphs) on CUDA and "eager" elsewhere; "default" (the
inductor's kernels, no graphs) and "eager" (no compilation) run anywhere, which is how the CPU tests hold the step
equal to the reference. The step returns None, and the caller runs the modules, where it does not apply:
:func:`~aiayn.accel.cuda.support.modules_must_run`, a cache that cannot be adopted or is full, positions past an
absolute position table.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from aiayn.accel.cuda.static_cache import BufferPool, StaticDecoderCache
from aiayn.accel.cuda.support import modules_must_run
from aiayn.models.stack import TransformerStack
from aiayn.nn.attention import MultiHeadAttention, fold_queries, scaled_dot_product_attention, unfold_queries
from aiayn.nn.positions import SinusoidalPositions, apply_rotary

COMPILE_MODES = ("auto", "eager", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
#: the modes whose compiled step replays CUDA graphs on CUDA
GRAPH_MODES = ("reduce-overhead", "max-autotune")


def resolve_mode(mode: str, device: torch.device) -> str:
    """The compilation mode on ``device``: "auto" is "reduce-overhead" on CUDA, "eager" elsewhere."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile={mode!r}: choose one of {COMPILE_MODES}")
    if mode == "auto":
        return "reduce-overhead" if device.type == "cuda" else "eager"
    return mode


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, module: MultiHeadAttention) -> Tensor:
    """``module``'s attention of q (B, H, T, Dh) over k, v (B, Hkv, S, Dh) under ``mask`` (B, 1, 1, S) bool ->
    (B, H, T, Dh), through the core's function. The H / Hkv query heads of each key/value head are folded into its
    query rows (B, Hkv, H/Hkv * T, Dh), so GQA and MQA read the keys as they are instead of copies per query head."""
    b, h, t, dh = q.shape
    hkv = k.shape[1]
    folded = q.reshape(b, hkv, (h // hkv) * t, dh)  # head h = kv * (H/Hkv) + j, as the core's expansion orders them
    out, _ = scaled_dot_product_attention(folded, k, v, mask=mask, backend=module.backend, scale=module.scale)
    return out.reshape(b, h, t, dh)  # a fused kernel may return it transposed (not viewable)


class StaticDecodeStep:
    """One new token per row through a causal stack over a static cache (see the module docstring).

    Args:
        stack: the decoder stack (supported: :func:`~aiayn.accel.cuda.support.step_supports`).
        compile: one of :data:`COMPILE_MODES`.
    """

    def __init__(self, stack: TransformerStack, compile: str = "auto") -> None:
        resolve_mode(compile, torch.device("cpu"))  # validates
        self.stack, self.mode = stack, compile
        self.modules: list[nn.Module] = list(stack.modules())
        self.pools: dict[str, BufferPool] = {}  # by compilation mode in force
        self.functions: dict[str, Callable[..., Tensor]] = {}  # by compilation mode in force

    def __call__(self, cache: StaticDecoderCache, ids: Tensor, positions: Tensor | None,
                 memory_is_token: Tensor | None) -> Tensor | None:
        """The stack's output (N, 1, D) for ids (N, 1), at ``positions`` (N|1, 1) long (None: the cache's length),
        with the source padding flags ``memory_is_token`` (Bm, S) bool of an encoder-decoder; the step's keys and
        values go into ``cache``. None where the step does not apply (nothing run, nothing changed but the cache's
        adoption)."""
        if modules_must_run(self.modules) or not self._positions_fit(cache, positions):
            return None
        mode = resolve_mode(self.mode, ids.device)
        if cache.static is None:
            pool = self.pools.setdefault(mode, BufferPool(static_addresses=mode in GRAPH_MODES))
            if not cache.adopt(ids.shape[0], pool):
                return None
        if not cache.begin_step(ids, positions, memory_is_token):
            return None
        s = cache.static
        fn = self.functions.get(mode)
        if fn is None:
            fn = self.functions[mode] = self.run if mode == "eager" else torch.compile(self.run, mode=mode,
                                                                                     dynamic=False)
        if mode in GRAPH_MODES and ids.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()  # the previous step's outputs are consumed
        out = fn(s.ids, s.positions, s.slot, s.kv, s.valid, s.pos, s.cross, s.memory_valid, cache.group)
        cache.end_step()
        return out[:ids.shape[0]].clone()  # a graph's output is overwritten by its next replay

    def _positions_fit(self, cache: StaticDecoderCache, positions: Tensor | None) -> bool:
        """Whether the step's positions are inside an absolute position table (the reference raises otherwise): the
        cache's length, or the given ones (read back: a host sync, before the step is queued)."""
        abs_pos = self.stack.abs_pos
        if abs_pos is None:
            return True
        limit = self.stack.config.max_len
        if positions is None:
            return cache.length < limit
        return int(positions.max()) < limit

    def embed(self, ids: Tensor, positions: Tensor) -> Tensor:
        """ids, positions (R, 1) long -> the layers' input (R, 1, D), as
        :meth:`~aiayn.models.stack.TransformerStack.prepare` makes it at inference (the table lookups without its
        host-side range check, which :meth:`_positions_fit` made)."""
        st = self.stack
        x = st.embed(ids) * st.embed_scale  # (R, 1, D)
        if st.token_type_embed is not None:
            tte = st.token_type_embed.weight[0]  # (D,): every token of type 0
            x = x + (tte if tte.dtype == x.dtype else tte.to(x.dtype))
        if st.abs_pos is not None:
            at = positions + st.abs_pos.offset if st.abs_pos.offset else positions
            pe = st.abs_pos.table[at] if isinstance(st.abs_pos, SinusoidalPositions) else st.abs_pos.weight(at)
            x = x + (pe if pe.dtype == x.dtype else pe.to(x.dtype))
        if st.embed_norm is not None:
            x = st.embed_norm(x)
        return x  # the embeddings' dropout is the identity in eval mode

    def run(self, ids: Tensor, positions: Tensor, slot: Tensor, kv: Tensor, valid: Tensor, pos: Tensor,
            cross: Tensor | None, memory_valid: Tensor | None, group: int) -> Tensor:
        """The step itself, on the static cache's buffers (shapes in :mod:`aiayn.accel.cuda.static_cache`); what
        ``torch.compile`` compiles. Writes position ``slot`` of ``kv``, ``valid`` and ``pos`` in place.

        Returns:
            hidden (R, 1, D), the final norm applied.
        """
        st = self.stack
        x = self.embed(ids, positions)  # (R, 1, D)
        r = x.shape[0]
        rotary = st.rotary(positions, x.dtype) if st.rotary is not None else None  # (R, 1, Dh) each
        valid.index_fill_(1, slot, True)
        pos.index_copy_(1, slot, positions)
        mask = valid[:, None, None, :]  # (R, 1, 1, M): the filled, real positions
        memory_mask = memory_valid[:, None, None, :] if memory_valid is not None else None  # (Rm, 1, 1, S)
        for i, layer in enumerate(st.layers):
            sa = layer.self_attn
            hq, hkv, dh = sa.n_heads, sa.n_kv_heads, sa.head_dim
            q, k, v = sa.qkv_proj(layer.self_res.enter(x)).split([hq * dh, hkv * dh, hkv * dh], dim=-1)
            # (R, 1, h*Dh) -> (R, h, 1, Dh): one position per row, a view
            q, k, v = q.view(r, hq, 1, dh), k.view(r, hkv, 1, dh), v.view(r, hkv, 1, dh)
            if sa.q_norm is not None:
                q, k = sa.q_norm(q), sa.k_norm(k)
            if rotary is not None:
                q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
            keys, values = kv[i, 0], kv[i, 1]  # (R, Hkv, M, Dh) each
            keys.index_copy_(2, slot, k)
            values.index_copy_(2, slot, v)
            a = attend(q, keys, values, mask, sa)  # (R, H, 1, Dh)
            x = layer.self_res.exit(x, sa.out_proj(a.reshape(r, 1, hq * dh)))
            ca = layer.cross_attn
            if ca is not None:  # rows i*g .. i*g+g-1 share memory row i: (R, H, 1, Dh) -> (Rm, H, g, Dh) and back
                q = ca.q_proj(layer.cross_res.enter(x)).view(r, hq, 1, dh)
                if ca.q_norm is not None:
                    q = ca.q_norm(q)
                a = attend(fold_queries(q, group), cross[i, 0], cross[i, 1], memory_mask, ca)
                a = unfold_queries(a, group, 1)  # (R, H, 1, Dh)
                x = layer.cross_res.exit(x, ca.out_proj(a.reshape(r, 1, hq * dh)))
            x = layer.ffn_res.exit(x, layer.ffn(layer.ffn_res.enter(x)))
        return st.final_norm(x)
