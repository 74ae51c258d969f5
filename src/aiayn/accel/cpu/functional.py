"""The CPU accelerator's kernels at the core's named seams, and the one function that puts them in place.

Every seam is an attribute of a core module that the core reads (None: the core's own code runs); nothing here
re-implements a layer, a stack or a step, and no module but a linear layer is replaced (by an ``nn.Linear`` subclass
sharing its parameters):

- ``MultiHeadAttention.attention_kernel`` = :func:`cpu_attention_kernel`: a decoding step's few queries through the
  native kernel (each cached key and value read once, grouped queries served as they are), short training sequences
  through :mod:`~aiayn.accel.cpu.short_attention`, everything else torch's fused kernel;
- ``LMHead.loss_kernel`` = :func:`fused_loss`: the output projection and the label-smoothed loss in chunks;
- ``LMHead.greedy_kernel`` = :class:`ScreenedGreedy`: greedy search reads the output layer in int8 first and
  rescores the few candidates exactly (:mod:`~aiayn.accel.cpu.screened_argmax`);
- ``LMHead.row_top_kernel`` = :func:`native_row_top`: beam search's best tokens per row in two native passes;
- linear layers become :class:`~aiayn.accel.cpu.packed.PackedLinear` modules (prepacked weights; a feed-forward
  network's activation applied in the product, through ``fused_activations``) where the layout asks for it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from aiayn.accel.cpu import decode_attention, native, short_attention
from aiayn.accel.cpu.fused_loss import linear_label_smoothed_nll
from aiayn.accel.cpu.screened_argmax import GreedyHead
from aiayn.accel.cpu.settings import SETTINGS
from aiayn.models.heads import LMHead, RowTop
from aiayn.nn.attention import MultiHeadAttention, _expand_kv, fused_attention


def attention_supports(module: MultiHeadAttention) -> bool:
    """Whether :func:`cpu_attention_kernel` may compute ``module``'s attention: softmax attention without score
    soft-capping, through the reference or the fused backend (the tiled and FlexAttention backends run as they are;
    the reference backend calls no kernel)."""
    return module.kind == "softmax" and module.softcap is None and module.backend in ("auto", "reference", "sdpa")


def _key_mask(mask: Tensor | None) -> Tensor | None | bool:
    """An attention mask as the native decode kernel takes it, (B|1, S) bool or None (no mask), or False where it
    varies over heads or queries."""
    if mask is None:
        return None
    if mask.dtype != torch.bool:
        return False
    if mask.dim() == 4 and mask.shape[1:3] == (1, 1):
        return mask[:, 0, 0, :]
    if mask.dim() == 2 and mask.shape[0] == 1:  # (T=1, S): the same for every row
        return mask
    return False


def cpu_attention_kernel(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None,
                         dropout_p: float, is_causal: bool, scale: float) -> Tensor:
    """The "sdpa" backend's kernel on the CPU (:data:`aiayn.nn.attention.AttentionKernel`: q (B, H, T, Dh), k and v
    (B, Hkv, S, Dh) -> (B, H, T, Dh)).

    A decoding step's few queries take the native kernel where it is built (fp32, a key mask per row, no position
    bias), else :mod:`~aiayn.accel.cpu.decode_attention`; training over at most 64 keys takes
    :mod:`~aiayn.accel.cpu.short_attention`; low-precision training attends in fp32 (torch's bf16 CPU flash backward
    is slow); everything else is :func:`aiayn.nn.attention.fused_attention`.
    """
    if q.device.type != "cpu":
        return fused_attention(q, k, v, mask, bias, dropout_p, is_causal, scale)
    if bias is None and decode_attention.applies(q, k, dropout_p, is_causal):
        key_mask = _key_mask(mask)
        if (key_mask is not False and SETTINGS.decode_attention == "auto" and native.library() is not None
                and native.cpu_fp32(q, k, v) and k.stride() == v.stride() and k.stride(-1) == 1
                and q.stride(-1) == 1):
            return native.few_query_attention(q, k, v, key_mask, scale)
        h = q.shape[1]
        return decode_attention.few_query_attention(q, _expand_kv(k, h), _expand_kv(v, h), mask, scale)
    k, v = _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1])
    low = q.dtype in (torch.bfloat16, torch.float16) and short_attention.cpu_training(q, k, v)
    if low:
        with torch.autocast("cpu", enabled=False):
            qf, kf, vf = q.float(), k.float(), v.float()
            kernel = short_attention.attention if short_attention.applies(qf, kf, vf) else fused_attention
            return kernel(qf, kf, vf, mask, bias, dropout_p, is_causal, scale).to(q.dtype)
    if short_attention.applies(q, k, v):
        return short_attention.attention(q, k, v, mask, bias, dropout_p, is_causal, scale)
    return fused_attention(q, k, v, mask, bias, dropout_p, is_causal, scale)


def fused_loss(h: Tensor, proj: nn.Module, labels: Tensor,
               label_smoothing: float) -> tuple[Tensor, Tensor, Tensor] | None:
    """``LMHead.loss_kernel``: the label-smoothed loss of ``proj(h)`` projected and scored in chunks
    (:func:`~aiayn.accel.cpu.fused_loss.linear_label_smoothed_nll`); None (the reference runs) off the CPU or for an
    output layer with a bias.

    Args:
        h: (..., D) hidden states, the head's scale applied; labels (...) long.
    """
    weight = getattr(proj, "weight", None)
    if not isinstance(weight, Tensor) or h.device.type != "cpu" or getattr(proj, "bias", None) is not None:
        return None
    return linear_label_smoothed_nll(h, weight, labels, label_smoothing)


class ScreenedGreedy:
    """``LMHead.greedy_kernel`` of one head: ``self(banned_ids)`` gives a chooser h (N, D) -> ids (N,) through
    :class:`~aiayn.accel.cpu.screened_argmax.GreedyHead`, the head's scale applied as the reference does."""

    def __init__(self, head: LMHead) -> None:
        self.head = head

    def __call__(self, banned_ids: Sequence[int] = ()) -> Callable[[Tensor], Tensor] | None:
        if not SETTINGS.screened_argmax:
            return None
        chooser = GreedyHead(self.head.proj, banned_ids)
        head, scale = self.head, self.head.scale
        if scale == 1.0:
            return chooser

        def choose(h: Tensor) -> Tensor:  # h (N, D) -> (N,): in the weight's dtype, then scaled, as the reference
            return chooser(head.in_weight_dtype(h) * scale)

        return choose


def native_row_top(logits: Tensor, banned_ids: Sequence[int], n: int) -> RowTop | None:
    """``LMHead.row_top_kernel``: each row's best tokens in two native passes (:func:`aiayn.accel.cpu.native.row_top`);
    None (the reference runs) where the kernels are not built or the logits are not fp32 on the CPU."""
    if native.library() is None or not native.cpu_fp32(logits):
        return None
    n = min(n, logits.shape[-1])
    banned_mask = None  # (V,) bool
    if banned_ids:
        banned_mask = torch.zeros(logits.shape[-1], dtype=torch.bool)
        banned_mask[list(banned_ids)] = True

    def top(logits: Tensor, eos_id: int | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
        top_lp, top_tok, lse = native.row_top(logits, n, banned_mask)
        return top_lp, top_tok, None if eos_id is None else logits[:, eos_id:eos_id + 1] - lse[:, None]

    return top


def set_kernels(model: nn.Module, decoding: bool) -> nn.Module:
    """Put the CPU kernels in the seams of ``model``'s core modules (exactly those classes: a user's subclass is left
    as it is), in place; returns ``model``. ``decoding`` adds the greedy and beam-search choosers."""
    for m in model.modules():
        if type(m) is MultiHeadAttention and attention_supports(m):
            m.attention_kernel = cpu_attention_kernel
        elif type(m) is LMHead:
            m.loss_kernel = fused_loss
            if decoding:
                m.greedy_kernel = ScreenedGreedy(m)
                m.row_top_kernel = native_row_top
    return model
