"""Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs").

Softmax attention weighs value j by exp(q_i . k_j). Linear attention replaces the exponential by a product of
positive features, phi(x) = elu(x) + 1, so that the sums factor:

    out_i = sum_j phi(q_i) . phi(k_j) v_j / sum_j phi(q_i) . phi(k_j)
          = phi(q_i) S / phi(q_i) . z,       S = sum_j phi(k_j) v_j^T  (Dh x Dv),   z = sum_j phi(k_j)  (Dh)

Non-causal attention computes S and z once: O(T Dh Dv) instead of O(T S Dh). Causal attention is a recurrence:
position i adds phi(k_i) v_i^T to S and phi(k_i) to z, then reads them, so decoding keeps a state of constant size
(:class:`LinearAttnState`) instead of a growing KV cache. Training computes the causal form by chunks
(:func:`causal_linear_attention`): within a chunk the small quadratic form, across chunks the state.

:func:`quadratic_linear_attention` is the same attention written as a (T, S) matrix; it takes any mask, and the
tests hold the other forms equal to it. A key at padding is left out of the sums; a row with no allowed key gives
zeros.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.nn.cache import DecoderCache

DEFAULT_CHUNK = 64


def feature_map(x: Tensor) -> Tensor:
    """phi(x) = elu(x) + 1 > 0, elementwise; (..., Dh) -> (..., Dh)."""
    return F.elu(x) + 1.0


def _expand(x: Tensor, n_heads: int) -> Tensor:
    """(B, Hkv, S, Dh) -> (B, H, S, Dh): each key/value head serves H/Hkv consecutive query heads (GQA/MQA)."""
    return x if x.shape[1] == n_heads else x.repeat_interleave(n_heads // x.shape[1], dim=1)


def _normalise(num: Tensor, den: Tensor) -> Tensor:
    """num (..., Dv) / den (..., 1), with 0 where den is 0 (no allowed key: num is 0 there too)."""
    return num / den.masked_fill(den == 0, 1.0)


def linear_attention_weights(q: Tensor, k: Tensor, mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
    """The weights of linear attention as an explicit matrix: A = phi(q) phi(k)^T, masked and row-normalised.

    Args:
        q: (B, H, T, Dh); k: (B, Hkv, S, Dh).
        mask: bool broadcastable to (B, H, T, S), True = may attend.
        is_causal: queries at the last T of the S positions see keys up to their own.
    Returns:
        (B, H, T, S), rows summing to 1 (0 for a row with no allowed key).
    """
    t, s = q.shape[2], k.shape[2]
    a = torch.matmul(feature_map(q), feature_map(_expand(k, q.shape[1])).transpose(-2, -1))  # (B, H, T, S)
    if mask is not None:
        a = a * mask
    if is_causal:
        causal = torch.arange(s, device=q.device)[None, :] <= torch.arange(s - t, s, device=q.device)[:, None]
        a = a * causal
    return _normalise(a, a.sum(-1, keepdim=True))


def quadratic_linear_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                               is_causal: bool = False) -> Tensor:
    """Linear attention through its (T, S) weights (:func:`linear_attention_weights`): any mask, O(T S) memory.

    Args:
        q: (B, H, T, Dh); k, v: (B, Hkv, S, Dh); mask and is_causal as there.
    Returns:
        (B, H, T, Dh).
    """
    return torch.matmul(linear_attention_weights(q, k, mask, is_causal), _expand(v, q.shape[1]))


def key_mask_of(mask: Tensor | None, b: int) -> tuple[bool, Tensor | None]:
    """Whether ``mask`` (broadcastable to (B, H, T, S)) only leaves out keys, the same for every query and head; and
    if so, that key mask (B, S) bool (None: no key left out)."""
    if mask is None:
        return True, None
    if mask.dim() == 4 and mask.shape[1] == 1 and mask.shape[2] == 1:
        return True, mask[:, 0, 0, :].expand(b, -1)
    return False, None


def attend_linear(q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None, is_causal: bool,
                  state: LinearAttnState | None = None,
                  return_weights: bool = False) -> tuple[Tensor, Tensor | None]:
    """Linear attention of projected heads in the form that fits: the recurrence with a decoding ``state``, the
    chunked causal form or the non-causal form under a key mask (padding), the quadratic form under any other mask
    or when the weights are asked for.

    Args:
        q: (B, H, T, Dh); k, v: (B, Hkv, S, Dh) (with a ``state``: the T new positions' keys and values).
        mask: bool broadcastable to (B, H, T, S), True = may attend; with a ``state``, S counts every position so far
            and the mask may only leave out keys (padding).
        is_causal: causal attention, queries at the end of the keys.
        state: the layer's :class:`LinearAttnState` when decoding.
        return_weights: also return the (B, H, T, S) weights (not with a ``state``, which keeps no keys).
    Returns:
        (B, H, T, Dh) and the weights or None.
    """
    keys_only, key_mask = key_mask_of(mask, q.shape[0])
    if state is not None:
        if not keys_only:
            raise ValueError("linear attention decodes under causal masks and key padding only; run a prefix-LM or "
                             "packed-document prompt without a cache")
        t = q.shape[2]
        return state.attend(q, k, v, key_mask[:, -t:] if key_mask is not None else None), None
    if return_weights or not keys_only:
        weights = linear_attention_weights(q, k, mask, is_causal)
        return torch.matmul(weights, _expand(v, q.shape[1])), (weights if return_weights else None)
    if is_causal:
        return causal_linear_attention(q, k, v, key_mask)[0], None
    return linear_attention(q, k, v, key_mask), None


def linear_attention(q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None = None) -> Tensor:
    """Non-causal linear attention in O(T Dh Dv): every query reads the same S and z.

    Args:
        q: (B, H, T, Dh); k, v: (B, Hkv, S, Dh).
        key_mask: (B, S) bool, False at keys to leave out (padding).
    Returns:
        (B, H, T, Dh).
    """
    fk, v = feature_map(_expand(k, q.shape[1])), _expand(v, q.shape[1])
    if key_mask is not None:
        fk = fk * key_mask[:, None, :, None]
    state = torch.matmul(fk.transpose(-2, -1), v)  # (B, H, Dh, Dv)
    z = fk.sum(-2)  # (B, H, Dh)
    fq = feature_map(q)
    return _normalise(torch.matmul(fq, state), (fq * z[:, :, None]).sum(-1, keepdim=True))


def causal_linear_attention(q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None = None,
                            state: tuple[Tensor, Tensor] | None = None,
                            chunk: int = DEFAULT_CHUNK) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """Causal linear attention by chunks, continuing from ``state``; returns the output and the state after it.

    Args:
        q: (B, H, T, Dh); k, v: (B, Hkv, T, Dh), the keys and values of the same T positions.
        key_mask: (B, T) bool, False at keys to leave out (padding).
        state: (S (B, H, Dh, Dv), z (B, H, Dh)) of all earlier positions, or None (none).
        chunk: positions per chunk (1 is the pure recurrence).
    Returns:
        (B, H, T, Dv) and the new (S, z).
    """
    b, h, t, dh = q.shape
    fq, fk, v = feature_map(q), feature_map(_expand(k, h)), _expand(v, h)
    if key_mask is not None:
        fk = fk * key_mask[:, None, :, None]
    if state is None:
        state = (q.new_zeros(b, h, dh, v.shape[-1]), q.new_zeros(b, h, dh))
    s_state, z = state
    outs = []
    for c0 in range(0, t, chunk):
        c1 = min(c0 + chunk, t)
        fq_c, fk_c, v_c = fq[:, :, c0:c1], fk[:, :, c0:c1], v[:, :, c0:c1]
        a = torch.matmul(fq_c, fk_c.transpose(-2, -1)).tril()  # (B, H, C, C): within the chunk, causal
        num = torch.matmul(fq_c, s_state) + torch.matmul(a, v_c)  # earlier chunks + this one
        den = (fq_c * z[:, :, None]).sum(-1, keepdim=True) + a.sum(-1, keepdim=True)
        outs.append(_normalise(num, den))
        s_state = s_state + torch.matmul(fk_c.transpose(-2, -1), v_c)
        z = z + fk_c.sum(-2)
    return torch.cat(outs, dim=2), (s_state, z)


class LinearAttnState:
    """One layer's decoding state for causal linear attention: S (B, H, Dh, Dv) and z (B, H, Dh), the same size
    at every step (it replaces the :class:`~aiayn.nn.cache.SelfAttnCache` of softmax attention)."""

    def __init__(self) -> None:
        self.state: tuple[Tensor, Tensor] | None = None
        self.length = 0

    def attend(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None = None) -> Tensor:
        """The output of T new positions, q (B, H, T, Dh), k and v (B, Hkv, T, Dh), key_mask (B, T) bool or None;
        the state moves past them."""
        out, self.state = causal_linear_attention(q, k, v, key_mask, self.state)
        self.length += q.shape[2]
        return out

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (B',) long (beam search)."""
        if self.state is not None:
            self.state = (self.state[0].index_select(0, index), self.state[1].index_select(0, index))


class LinearDecoderCache(DecoderCache):
    """A :class:`~aiayn.nn.cache.DecoderCache` whose self-attention layers keep a :class:`LinearAttnState` each (a
    constant-size state, no keys or values); the padding flags and the cross-attention caches as there."""

    def __init__(self, n_layers: int, cross: bool = False) -> None:
        super().__init__(n_layers, capacity=0, cross=cross)
        self.self_attn = [LinearAttnState() for _ in range(n_layers)]  # type: ignore[misc]

    def reorder(self, index: Tensor, memory_index: Tensor | None = None, group: int = 1) -> None:
        """Keep decoder rows ``index`` (N',) long in every layer (as :meth:`DecoderCache.reorder`)."""
        super().reorder(index, memory_index, group)
        for layer in self.self_attn:
            layer.reorder(index)
