"""One attention function and one multi-head attention module for every family.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k) + bias, masked) V          (paper eq. 1)

Encoder self-attention, decoder causal self-attention and encoder-decoder cross-attention all call
:func:`scaled_dot_product_attention`; what differs is the mask and where K and V come from.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.config import ATTENTION_BACKENDS
from aiayn.nn.cache import CrossAttnCache, SelfAttnCache
from aiayn.nn.linear_attention import LinearAttnState, attend_linear, linear_attention_weights
from aiayn.nn.masks import causal_mask
from aiayn.nn.norms import RMSNorm
from aiayn.nn.positions import apply_rotary

#: (q, k, v, mask, bias, dropout_p, is_causal, scale) -> out: a fused attention kernel, see :func:`fused_attention`;
#: k and v come with their Hkv heads (H a multiple of Hkv: the kernel serves grouped queries)
AttentionKernel = Callable[[Tensor, Tensor, Tensor, Tensor | None, Tensor | None, float, bool, float], Tensor]


def _expand_kv(x: Tensor, n_heads: int) -> Tensor:
    """(B, Hkv, S, Dh) -> (B, H, S, Dh): each key/value head serves H/Hkv query heads (GQA/MQA)."""
    b, hkv, s, dh = x.shape
    if hkv == n_heads:
        return x
    return x[:, :, None].expand(b, hkv, n_heads // hkv, s, dh).reshape(b, n_heads, s, dh)


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    dropout_p: float = 0.0,
    backend: str = "auto",
    return_weights: bool = False,
    is_causal: bool = False,
    scale: float | None = None,
    kernel: AttentionKernel | None = None,
    softcap: float | None = None,
) -> tuple[Tensor, Tensor | None]:
    """softmax(q k^T * scale + bias, masked) v.

    Args:
        q: (B, H, T, Dh) queries.
        k, v: (B, Hkv, S, Dh) keys and values; H must be a multiple of Hkv (GQA/MQA).
        mask: bool, broadcastable to (B, H, T, S); True = may attend. A query row with no allowed key
            yields zeros (and zero weights), never NaN.
        bias: float, broadcastable to (B, H, T, S), added to the scores (ALiBi, T5).
        dropout_p: dropout on the attention weights (pass 0.0 at evaluation).
        backend: "reference" (explicit softmax; can return weights), "sdpa" (torch's fused kernel), "auto"
            (sdpa unless weights are requested or the scores are capped), "tiled" (online softmax by key blocks,
            :mod:`aiayn.nn.tiled_attention`) or "flex" (torch's FlexAttention, :mod:`aiayn.nn.flex`).
        return_weights: also return the (B, H, T, S) attention weights (forces the reference backend).
        is_causal: apply a causal mask with queries aligned to the end of the keys (T <= S), in addition
            to ``mask``; lets sdpa use its fast causal path when there is no other mask.
        scale: score scale, default 1/sqrt(Dh).
        kernel: the fused kernel for the "sdpa" backend (default :func:`fused_attention`); an accelerator passes
            its own (:attr:`MultiHeadAttention.attention_kernel`). It gets k and v with their Hkv heads and masks with
            no empty row.
        softcap: ``cap * tanh(scores / cap)`` on the scaled, biased scores before masking (Gemma 2); None is off.
    Returns:
        out (B, H, T, Dh) and weights (B, H, T, S) or None.
    """
    if backend not in ATTENTION_BACKENDS:
        raise ValueError(f"backend={backend!r}: choose one of {ATTENTION_BACKENDS}")
    n_heads, t, s = q.shape[1], q.shape[2], k.shape[2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if return_weights or backend == "reference" or (softcap is not None and backend in ("auto", "sdpa")):
        backend = "reference"  # torch's fused kernel neither returns weights nor caps scores
    blockwise = backend in ("tiled", "flex")  # these mask causally by index, without a (T, S) mask
    if is_causal and not blockwise and (mask is not None or bias is not None or t != s or backend == "reference"):
        mask, is_causal = _with_causal(mask, True, t, s, q.device), False
    empty_rows = None
    if mask is not None:
        # (B|1, H|1, T, 1): rows with no allowed key. They attend everywhere (finite math, no NaN) and
        # their output is zeroed below. Applied unconditionally: asking whether any row is empty would
        # cost a host sync per call on a GPU, and both ops are tiny next to the attention itself.
        empty_rows = ~mask.any(dim=-1, keepdim=True)
        mask = mask | empty_rows
    if backend not in ("auto", "sdpa"):  # a fused kernel takes grouped keys as they are
        k, v = _expand_kv(k, n_heads), _expand_kv(v, n_heads)

    if backend == "reference":
        weights = _softmax_weights(q, k, mask, bias, scale, softcap, empty_rows)  # (B, H, T, S)
        dropped = F.dropout(weights, dropout_p) if dropout_p > 0 else weights
        out = torch.matmul(dropped, v)  # (B, H, T, Dh)
        return out, (weights if return_weights else None)

    if blockwise:
        if dropout_p > 0:
            raise ValueError(f"backend={backend!r} has no attention dropout: pass dropout_p=0.0")
        if backend == "tiled":
            from aiayn.nn.tiled_attention import tiled_attention  # lazy: loaded only when chosen
            out = tiled_attention(q, k, v, mask, bias, is_causal=is_causal, scale=scale, softcap=softcap)
        else:
            from aiayn.nn.flex import flex_attention  # cycle: aiayn.nn.flex imports attention; lazy: when chosen
            out = flex_attention(q, k, v, mask, bias, is_causal=is_causal, scale=scale, softcap=softcap)
    else:
        out = (kernel or fused_attention)(q, k, v, mask, bias, dropout_p, is_causal, scale)
    if empty_rows is not None:
        out = out.masked_fill(empty_rows, 0.0)
    return out, None


def _softmax_weights(q: Tensor, k: Tensor, mask: Tensor | None, bias: Tensor | None, scale: float,
                     softcap: float | None, empty_rows: Tensor | None) -> Tensor:
    """The reference's weights: q (B, H, T, Dh), k (B, H, S, Dh) with heads expanded, ``mask`` with no empty row
    (``empty_rows`` marks the rows that had none) -> (B, H, T, S)."""
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale  # (B, H, T, S)
    if bias is not None:
        scores = scores + bias
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(q.dtype)
    if mask is not None:
        weights = weights * mask  # masked weights are exactly 0
    if empty_rows is not None:
        weights = weights.masked_fill(empty_rows, 0.0)
    return weights


def _with_causal(mask: Tensor | None, is_causal: bool, t: int, s: int, device: torch.device) -> Tensor | None:
    """``mask`` and, if ``is_causal``, the causal mask of T queries at the end of S keys (None: no mask at all)."""
    if not is_causal:
        return mask
    causal = causal_mask(t, s, device=device)
    return causal if mask is None else mask & causal


def attention_weights(q: Tensor, k: Tensor, mask: Tensor | None = None, bias: Tensor | None = None, *,
                      is_causal: bool = False, scale: float | None = None,
                      softcap: float | None = None) -> tuple[Tensor, Tensor | None]:
    """softmax(q k^T * scale + bias, masked) alone: the weights :func:`scaled_dot_product_attention`'s reference
    backend computes from the same arguments, bit for bit. What an output computed by a fused kernel attended to.

    Args:
        q: (B, H, T, Dh); k: (B, Hkv, S, Dh); mask, bias, is_causal, scale, softcap: as there.
    Returns:
        weights (B, H, T, S) (a row with no allowed key is all 0), and the mask applied (bool broadcastable to
        (B, H, T, S), causality included; None where every key was allowed).
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    mask = _with_causal(mask, is_causal, q.shape[2], k.shape[2], q.device)
    empty_rows = None if mask is None else ~mask.any(dim=-1, keepdim=True)
    full = None if mask is None else mask | empty_rows
    return _softmax_weights(q, _expand_kv(k, q.shape[1]), full, bias, scale, softcap, empty_rows), mask


def fused_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None, dropout_p: float,
                    is_causal: bool, scale: float) -> Tensor:
    """torch's fused kernel, ``F.scaled_dot_product_attention``, with the bias and the mask as one additive mask.

    Args:
        q, k, v: (B, H, T, Dh), (B, Hkv, S, Dh), (B, Hkv, S, Dh), H a multiple of Hkv.
        mask: bool broadcastable to (B, H, T, S), True = may attend, no row without an allowed key.
        bias: float additive bias broadcastable to (B, H, T, S).
    Returns:
        (B, H, T, Dh).
    """
    k, v = _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1])
    attn_mask: Tensor | None = mask
    if bias is not None:
        attn_mask = bias.to(q.dtype)
        if mask is not None:
            attn_mask = attn_mask.masked_fill(~mask, torch.finfo(q.dtype).min)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                                          scale=scale)


def fold_queries(q: Tensor, group: int) -> Tensor:
    """(B, H, T, Dh) -> (B/g, H, g*T, Dh): fold the queries of g consecutive rows into one memory row's block."""
    b, h, t, d = q.shape
    if t == 1:  # a decoding step: a strided view, row i*g + j as query j of block i, no copy
        s_b, s_h, _, s_d = q.stride()
        return q.as_strided((b // group, h, group, d), (group * s_b, s_h, s_b, s_d))
    return q.view(b // group, group, h, t, d).transpose(1, 2).reshape(b // group, h, group * t, d)


def unfold_queries(x: Tensor, group: int, t: int) -> Tensor:
    """(B/g, H, g*T, X) -> (B, H, T, X): undo the folding of g rows' queries into one memory row's block."""
    bm, h, _, d = x.shape
    return x.view(bm, h, group, t, d).transpose(1, 2).reshape(bm * group, h, t, d)


class MultiHeadAttention(nn.Module):
    """Multi-head attention for self- and cross-attention; ``n_kv_heads`` gives MHA, GQA or MQA.

    MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    Self-attention projects Q, K and V with one fused matmul (``qkv_proj``); cross-attention projects Q
    from the decoder (``q_proj``) and K, V from the encoder memory with one fused matmul (``kv_proj``).

    Args:
        d_model: model width D.
        n_heads: query heads H; head width Dh = D / H unless ``head_dim`` is given.
        n_kv_heads: key/value heads Hkv (default H).
        cross: build for cross-attention.
        bias: biases on the projections.
        qkv_bias: biases on the query/key/value projections only (default ``bias``; Qwen2 has them without an output
            bias).
        dropout: dropout on attention weights.
        scale: score scale (default 1/sqrt(Dh); T5 uses 1.0).
        kind: "softmax" or "linear" (:mod:`aiayn.nn.linear_attention`; it has no dropout, bias or soft-capping).
        qk_norm: an RMSNorm (eps ``norm_eps``) over each head's queries and keys, before RoPE.
        softcap: ``cap * tanh(scores / cap)`` on the attention scores (Gemma 2), or None.
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None, *, cross: bool = False,
                 bias: bool = True, dropout: float = 0.0, head_dim: int | None = None,
                 scale: float | None = None, qkv_bias: bool | None = None, kind: str = "softmax",
                 qk_norm: bool = False, norm_eps: float = 1e-6, softcap: float | None = None) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads or n_heads
        self.head_dim = head_dim or d_model // n_heads
        self.cross, self.dropout, self.scale = cross, dropout, scale
        self.backend = "auto"
        #: the kernel seam of the "sdpa"/"auto" backend: None is torch's (:func:`fused_attention`); an accelerator
        #: sets its own (an :data:`AttentionKernel`), which ``print(model)`` names
        self.attention_kernel: AttentionKernel | None = None
        #: while set (aiayn.inspect.capture_attention), each forward pass calls recorder(weights, mask, bias) with its
        #: attention weights (B, H, T, S), recomputed by :func:`attention_weights` from the pass's own q and k
        self.recorder: Callable[[Tensor, Tensor | None, Tensor | None], None] | None = None
        self.kind, self.softcap = kind, softcap
        self.q_norm = RMSNorm(self.head_dim, norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, norm_eps) if qk_norm else None
        q_width, kv_width = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        in_bias = bias if qkv_bias is None else qkv_bias
        if cross:
            self.q_proj = nn.Linear(d_model, q_width, bias=in_bias)
            self.kv_proj = nn.Linear(d_model, 2 * kv_width, bias=in_bias)
        else:
            self.qkv_proj = nn.Linear(d_model, q_width + 2 * kv_width, bias=in_bias)
        self.out_proj = nn.Linear(q_width, d_model, bias=bias)

    def _heads(self, x: Tensor, n: int) -> Tensor:
        b, t, _ = x.shape
        if t == 1:  # a decoding step: (B, 1, n*Dh) -> (B, n, 1, Dh) is a single view, no transpose needed
            return x.view(b, n, 1, self.head_dim)
        return x.view(b, t, n, self.head_dim).transpose(1, 2)  # (B, T, n*Dh) -> (B, n, T, Dh)

    def project_memory(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Cross-attention keys and values of encoder memory (B, S, D): each (B, Hkv, S, Dh), one fused product."""
        k, v = self.kv_proj(memory).split(self.n_kv_heads * self.head_dim, dim=-1)  # (B, S, Hkv*Dh) each
        k = self._heads(k, self.n_kv_heads)
        return (self.k_norm(k) if self.k_norm is not None else k), self._heads(v, self.n_kv_heads)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None, bias: Tensor | None, is_causal: bool,
               return_weights: bool) -> tuple[Tensor, Tensor | None]:
        """The attention of projected heads: :func:`scaled_dot_product_attention` with this module's dropout (in
        training), backend and scale. Shapes as there: q (B, H, T, Dh), k and v (B, Hkv, S, Dh) -> (B, H, T, Dh)."""
        return scaled_dot_product_attention(
            q, k, v, mask=mask, bias=bias, dropout_p=self.dropout if self.training else 0.0, backend=self.backend,
            return_weights=return_weights, is_causal=is_causal, scale=self.scale, softcap=self.softcap,
            kernel=self.attention_kernel)

    def _cross_heads(self, x: Tensor, memory: Tensor | None,
                     cache: CrossAttnCache | None) -> tuple[Tensor, Tensor, Tensor]:
        """Cross-attention's q (B, H, T, Dh) from ``x``, and k, v (Bm, Hkv, S, Dh) from ``memory``, projected once
        into a :class:`CrossAttnCache` and read from it afterwards."""
        q = self._heads(self.q_proj(x), self.n_heads)
        q = self.q_norm(q) if self.q_norm is not None else q
        if isinstance(cache, CrossAttnCache) and cache.k is not None:
            return q, cache.k, cache.v
        if memory is None:
            raise ValueError("cross-attention needs `memory` (or a filled CrossAttnCache)")
        k, v = self.project_memory(memory)
        if isinstance(cache, CrossAttnCache):
            cache.k, cache.v = k, v
        return q, k, v

    def _self_heads(self, x: Tensor, rotary: tuple[Tensor, Tensor] | None,
                    cache: SelfAttnCache | None) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention's q (B, H, T, Dh) and the k, v (B, Hkv, S, Dh) it attends over (with a cache, all the
        positions cached so far, the new ones appended), from one fused projection of ``x`` (B, T, D)."""
        b, t, _ = x.shape
        hq, hkv, dh = self.n_heads, self.n_kv_heads, self.head_dim
        qkv = self.qkv_proj(x)  # (B, T, (H + 2 Hkv) Dh)
        if (t == 1 and rotary is None and self.q_norm is None and isinstance(cache, SelfAttnCache)
                and cache.store.data is not None):  # a decoding step: keys and values into the cache in one copy
            heads = qkv.view(b, hq + 2 * hkv, 1, dh)  # (B, H + 2 Hkv, 1, Dh): with T = 1, no transpose
            k, v = cache.append_step(heads[:, hq:])  # (B, Hkv, S, Dh): everything cached so far
            return heads[:, :hq], k, v
        q, k, v = qkv.split([hq * dh, hkv * dh, hkv * dh], dim=-1)
        q, k, v = self._heads(q, hq), self._heads(k, hkv), self._heads(v, hkv)  # (B, h, T, Dh)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rotary is not None:
            q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        if isinstance(cache, SelfAttnCache):
            k, v = cache.append(k, v)  # (B, Hkv, S, Dh): the keys this step attends over
        return q, k, v

    def _record(self, q: Tensor, k: Tensor, mask: Tensor | None, bias: Tensor | None, is_causal: bool,
                weights: Tensor | None, group: int, t: int, state: LinearAttnState | None) -> None:
        """Hand :attr:`recorder` this pass's attention weights (B, H, T, S) and the mask applied: the ones the
        reference computed, else recomputed from the pass's own q and k (the kernel that made the output is
        unchanged); nothing for a linear-attention decoding state, which keeps no keys. q, k as attended (folded by
        ``group`` rows)."""
        if self.kind == "linear":
            if state is not None:
                return
            recorded = weights if weights is not None else linear_attention_weights(q, k, mask, is_causal)
            applied = _with_causal(mask, is_causal, q.shape[2], k.shape[2], q.device)
        elif weights is not None:
            recorded, applied = weights, _with_causal(mask, is_causal, q.shape[2], k.shape[2], q.device)
        else:
            recorded, applied = attention_weights(q, k, mask, bias, is_causal=is_causal, scale=self.scale,
                                                  softcap=self.softcap)
        if group > 1:  # (B/g, H, g*T, S) -> (B, H, T, S), the mask expanded to that shape first
            applied = None if applied is None else unfold_queries(applied.expand(recorded.shape), group, t)
            recorded = unfold_queries(recorded, group, t)
        self.recorder(recorded, applied, bias)

    def extra_repr(self) -> str:
        kernel = self.attention_kernel
        return "" if kernel is None else f"attention_kernel={getattr(kernel, '__name__', type(kernel).__name__)}"

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        bias: Tensor | None = None,
        rotary: tuple[Tensor, Tensor] | None = None,
        cache: SelfAttnCache | CrossAttnCache | None = None,
        is_causal: bool = False,
        return_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``x`` to itself (self) or to ``memory`` (cross).

        Args:
            x: (B, T, D) query source (and key/value source for self-attention).
            memory: (B, S, D) key/value source for cross-attention; may be None when ``cache`` already holds
                the projected memory.
            mask: bool broadcastable to (B, H, T, S), True = may attend. With a self-attention cache, S is the
                cached length including the T new positions; with a cross-attention cache whose ``group`` g > 1,
                broadcastable to (B/g, H, g*T, S), over its memory rows.
            bias: float additive bias broadcastable to (B, H, T, S).
            rotary: (cos, sin) each (B|1, T, Dh) for the positions of ``x``; rotates q and k (self only).
            cache: a :class:`SelfAttnCache` (new k/v appended, attention over all cached keys) or a
                :class:`CrossAttnCache` (memory projected once, reused at every step; its ``group`` consecutive
                rows of ``x`` share one memory row).
            is_causal: causal masking with queries aligned to the end of the keys.
            return_weights: also return the attention weights (B, H, T, S).
        Returns:
            (B, T, D) output and the weights or None.
        """
        b, t, _ = x.shape
        hq, dh = self.n_heads, self.head_dim
        q, k, v = self._cross_heads(x, memory, cache) if self.cross else self._self_heads(x, rotary, cache)
        group = cache.group if isinstance(cache, CrossAttnCache) else 1
        if group > 1:  # rows i*g .. i*g+g-1 share memory row i
            q = fold_queries(q, group)
        state = cache if self.kind == "linear" and isinstance(cache, LinearAttnState) else None
        if self.kind == "linear":
            out, weights = attend_linear(q, k, v, mask=mask, is_causal=is_causal, state=state,
                                         return_weights=return_weights)
        else:
            out, weights = self.attend(q, k, v, mask=mask, bias=bias, is_causal=is_causal,
                                       return_weights=return_weights)
        if self.recorder is not None:
            self._record(q, k, mask, bias, is_causal, weights, group, t, state)
        if group > 1:  # and back: (B/g, H, g*T, X) -> (B, H, T, X) (a step's output: by the transpose below)
            out = unfold_queries(out, group, t) if t > 1 else out
            weights = unfold_queries(weights, group, t) if weights is not None else None
        # (B, H, T, Dh) -> (B, T, H*Dh), and a step's folded (B/g, H, g, Dh) -> (B/g, g, H, Dh) -> (B, 1, H*Dh); with
        # T = 1 and no folding both orders are the same, so no transpose
        out = out.reshape(b, 1, hq * dh) if t == 1 and group == 1 else out.transpose(1, 2).reshape(b, t, hq * dh)
        return self.out_proj(out), weights
