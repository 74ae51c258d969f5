"""Attention through torch's FlexAttention: masks as index predicates, biases as score functions.

FlexAttention (``torch.nn.attention.flex_attention``) takes a mask as a ``mask_mod(b, h, q_idx, kv_idx) -> bool``
and a bias as a ``score_mod(score, b, h, q_idx, kv_idx) -> score``. ``create_block_mask`` evaluates the mask once per
(128 x 128) block, and the compiled kernel skips every block in which nothing is allowed, so a sliding window, a
block-sparse or a local+global pattern costs the work of the blocks it keeps, not of the whole (T, S) square.

:func:`flex_attention` is the ``"flex"`` backend of :func:`aiayn.nn.attention.scaled_dot_product_attention`: the
mask and bias it is given (dense tensors, as the stack makes them) are read by index inside the mod functions
(:func:`tensor_mod`, :func:`tensor_score_mod`), and the block mask of a mask tensor is made once and reused by every
layer that gets the same tensor. Fewer queries than one block (a decoding step) have nothing to skip: compiled, they
take torch's fused kernel instead, which spares a compilation per key length. :func:`attend` with a mask mod of one's
own (:func:`causal_mod`, :func:`and_mods`) and :func:`block_mask` never make a (T, S) tensor.

Queries are the last T of the S key positions (as with a KV cache): query row i is at position ``S - T + i``.

Where the installed torch lacks something: without ``torch.compile`` support (no C compiler on a CPU host),
FlexAttention runs eagerly, which is exact but computes every block (:data:`SETTINGS`); and torch 2.13 has no
FlexAttention backward on the CPU, so on a CPU with gradients required :func:`flex_attention` computes the same
attention through :func:`aiayn.nn.tiled_attention.tiled_attention`.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from aiayn.errors import AiaynError
from aiayn.nn.attention import scaled_dot_product_attention
from aiayn.nn.tiled_attention import tiled_attention

try:
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask
    from torch.nn.attention.flex_attention import flex_attention as _flex_attention
except ImportError:  # pragma: no cover - torch before 2.5
    raise AiaynError(f"attention_backend='flex' needs FlexAttention (torch 2.5 or later), and torch "
                     f"{torch.__version__} is installed; choose attention_backend='tiled' or 'auto', or upgrade "
                     "torch") from None

#: (b, h, q_idx, kv_idx) -> bool, True = may attend (index tensors, as FlexAttention passes them)
MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
#: (score, b, h, q_idx, kv_idx) -> score
ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


@dataclass
class FlexSettings:
    """compile: run FlexAttention through ``torch.compile`` (its fast, block-skipping form; the first call per shape
    compiles). Default: on CUDA, or where a C compiler exists for the CPU."""

    compile: bool = shutil.which("cc") is not None or shutil.which("gcc") is not None


SETTINGS = FlexSettings()
_BLOCK = 128  # FlexAttention's block of queries and keys
_compiled: Callable[..., Tensor] | None = None


def _kernel(device: torch.device) -> Callable[..., Tensor]:
    """FlexAttention, compiled where :data:`SETTINGS` says so (once per process), else eager."""
    global _compiled
    if not (SETTINGS.compile or device.type == "cuda"):
        return _flex_attention
    if _compiled is None:
        _compiled = torch.compile(_flex_attention, dynamic=False)
    return _compiled


# ---------------------------------------------------------------------------------------------------- mask mods
def and_mods(*mods: MaskMod | None) -> MaskMod | None:
    """The logical AND of mask mods (None entries impose nothing); None if all are None."""
    kept = [m for m in mods if m is not None]
    if not kept:
        return None

    def mod(b: Tensor, h: Tensor, q: Tensor, k: Tensor) -> Tensor:
        out = kept[0](b, h, q, k)
        for m in kept[1:]:
            out = out & m(b, h, q, k)
        return out

    return mod


def causal_mod(offset: int = 0) -> MaskMod:
    """Key j visible to query row i when j <= i + offset (offset = S - T: queries at the end of the keys)."""
    return lambda b, h, q, k: k <= q + offset


def tensor_mod(mask: Tensor) -> MaskMod:
    """A bool mask broadcastable to (B, H, T, S), read by index."""
    m = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    bb, hh, tt, ss = (n > 1 for n in m.shape)
    zero = 0
    return lambda b, h, q, k: m[b if bb else zero, h if hh else zero, q if tt else zero, k if ss else zero]


# ---------------------------------------------------------------------------------------------------- score mods
def tensor_score_mod(bias: Tensor) -> ScoreMod:
    """A float bias broadcastable to (B, H, T, S), read by index and added."""
    x = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))
    bb, hh, tt, ss = (n > 1 for n in x.shape)
    zero = 0
    return lambda score, b, h, q, k: score + x[b if bb else zero, h if hh else zero, q if tt else zero,
                                               k if ss else zero]


def softcap_score_mod(cap: float, inner: ScoreMod | None = None) -> ScoreMod:
    """cap * tanh(s / cap) of the score after ``inner`` (Gemma 2's logit soft-capping)."""
    def mod(score: Tensor, b: Tensor, h: Tensor, q: Tensor, k: Tensor) -> Tensor:
        s = inner(score, b, h, q, k) if inner is not None else score
        return cap * torch.tanh(s / cap)

    return mod


# ---------------------------------------------------------------------------------------------------- attention
def block_mask(mask_mod: MaskMod, b: int | None, h: int | None, t: int, s: int,
               device: torch.device | str) -> BlockMask:
    """``create_block_mask`` of ``mask_mod`` for (B, H, T, S) (None: the same for every batch row / head).

    Eager, it evaluates the mask at all T x S points at once; from 4096 x 4096 points on, where :data:`SETTINGS`
    compiles, the evaluation is compiled too and never holds them all."""
    large = SETTINGS.compile and t * s >= 1 << 24
    return create_block_mask(mask_mod, b, h, t, s, device=device, _compile=large)


def attend(q: Tensor, k: Tensor, v: Tensor, *, mask_mod: MaskMod | None = None, score_mod: ScoreMod | None = None,
           blocks: BlockMask | None = None, scale: float | None = None) -> Tensor:
    """FlexAttention of q (B, H, T, Dh) over k, v (B, H, S, Dh) -> (B, H, T, Dh); ``blocks`` (a :func:`block_mask`)
    is made from ``mask_mod`` when not given. A row with no allowed key gives zeros."""
    if blocks is None and mask_mod is not None:
        blocks = block_mask(mask_mod, None, None, q.shape[2], k.shape[2], q.device)
    return _kernel(q.device)(q, k, v, score_mod=score_mod, block_mask=blocks, scale=scale)


class _LastBlockMask:
    """The block mask of the last mask tensor seen (held, so that its memory is not reused by another while
    cached): the layers of one forward pass share their mask, and the blocks are found once for all of them."""

    key: tuple | None = None
    mask: Tensor | None = None
    blocks: BlockMask | None = None

    def get(self, mask: Tensor | None, is_causal: bool, b: int, h: int, t: int, s: int,
            device: torch.device) -> BlockMask | None:
        if mask is None and not is_causal:
            return None
        version = None if mask is None or mask.is_inference() else mask._version  # inference tensors have none
        key = (None if mask is None else (version, tuple(mask.shape)), is_causal, b, h, t, s, str(device))
        if self.key != key or self.mask is not mask:
            mods = and_mods(tensor_mod(mask) if mask is not None else None,
                            causal_mod(s - t) if is_causal else None)
            mb = None if mask is None or mask.dim() < 4 or mask.shape[0] == 1 else b
            mh = None if mask is None or mask.dim() < 3 or mask.shape[-3] == 1 else h
            self.blocks = block_mask(mods, mb, mh, t, s, device)
            self.key, self.mask = key, mask
        return self.blocks


_LAST = _LastBlockMask()


def flex_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, bias: Tensor | None = None, *,
                   is_causal: bool = False, scale: float | None = None, softcap: float | None = None) -> Tensor:
    """The "flex" backend: softmax(cap(q k^T * scale + bias), masked) v with dense mask and bias read by index.

    Args:
        q: (B, H, T, Dh); k, v: (B, H, S, Dh) (heads expanded).
        mask: bool broadcastable to (B, H, T, S), True = may attend; blocks with nothing allowed are skipped.
        bias: float broadcastable to (B, H, T, S).
        is_causal: query i (position S - T + i) sees keys j <= S - T + i, in addition to ``mask``.
        scale: default 1/sqrt(Dh).
        softcap: cap * tanh(score / cap) after the bias, or None.
    Returns:
        (B, H, T, Dh); a row with no allowed key gives zeros.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    grad = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v) + ((bias,) if bias is not None else ()))
    if grad and q.device.type == "cpu":  # torch has no FlexAttention backward on the CPU
        return tiled_attention(q, k, v, mask, bias, is_causal=is_causal, scale=scale, softcap=softcap)
    b, h, t, _ = q.shape
    if t < _BLOCK and SETTINGS.compile:  # a decoding step: nothing to skip, and no compilation per key length
        return scaled_dot_product_attention(q, k, v, mask, bias, is_causal=is_causal, scale=scale, softcap=softcap)[0]
    blocks = _LAST.get(mask, is_causal, b, h, t, k.shape[2], q.device)
    score_mod = tensor_score_mod(bias) if bias is not None else None
    if softcap is not None:
        score_mod = softcap_score_mod(softcap, score_mod)
    return _kernel(q.device)(q, k, v, score_mod=score_mod, block_mask=blocks, scale=scale)
