"""The CPU accelerator's functions that its substitute modules and its flat decoding step share: the attention kernel
and the feed-forward network at inference."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from aiayn.accel.cpu import decode_attention, short_attention
from aiayn.accel.cpu.packed import ACTIVATION_FNS, FUSED_ACTIVATIONS, PackedLinear
from aiayn.nn.attention import fused_attention
from aiayn.nn.feedforward import FeedForward


def cpu_attention_kernel(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None,
                         dropout_p: float, is_causal: bool, scale: float) -> Tensor:
    """The "sdpa" backend's kernel on the CPU (:data:`aiayn.nn.attention.AttentionKernel`; same shapes).

    A decoding step's few queries take :mod:`~aiayn.accel.cpu.decode_attention`; training over at most 64 keys takes
    :mod:`~aiayn.accel.cpu.short_attention`; low-precision training attends in fp32 (torch's bf16 CPU flash backward
    is slow); everything else is :func:`aiayn.nn.attention.fused_attention`.
    """
    if q.device.type != "cpu":
        return fused_attention(q, k, v, mask, bias, dropout_p, is_causal, scale)
    if bias is None and decode_attention.applies(q, k, dropout_p, is_causal):
        return decode_attention.few_query_attention(q, k, v, mask, scale)
    low = q.dtype in (torch.bfloat16, torch.float16) and short_attention.cpu_training(q, k, v)
    if low:
        with torch.autocast("cpu", enabled=False):
            qf, kf, vf = q.float(), k.float(), v.float()
            kernel = short_attention.attention if short_attention.applies(qf, kf, vf) else fused_attention
            return kernel(qf, kf, vf, mask, bias, dropout_p, is_causal, scale).to(q.dtype)
    if short_attention.applies(q, k, v):
        return short_attention.attention(q, k, v, mask, bias, dropout_p, is_causal, scale)
    return fused_attention(q, k, v, mask, bias, dropout_p, is_causal, scale)


def fused_activation(ffn: FeedForward) -> str | None:
    """The name in ``FUSED_ACTIVATIONS`` of ``ffn``'s activation, or None where a product cannot apply it: a gated
    network, or a function the fused kernels do not compute (SiLU, GELU's tanh approximation)."""
    name = ffn.activation
    if ffn.gated or name not in FUSED_ACTIVATIONS or ffn.act is not ACTIVATION_FNS[name]:
        return None
    return name


def feed_forward(ffn: FeedForward, x: Tensor, w_in: Callable[..., Tensor], w_out: Callable[[Tensor], Tensor]) -> Tensor:
    """``ffn`` at inference with its two products given as callables (its own layers, or a decoding step's planned
    products); the activation goes into ``w_in``'s product where the layer is a :class:`PackedLinear`.

    Args:
        x: (..., D).
    Returns:
        (..., D).
    """
    fused = fused_activation(ffn)
    if isinstance(ffn.w_in, PackedLinear) and fused is not None:
        h = w_in(x, activation=fused)  # (..., d_ff)
    else:
        h = w_in(x)  # (..., d_ff) or (..., 2*d_ff)
        if ffn.gated:
            gate, up = h.chunk(2, dim=-1)
            h = ffn.act(gate) * up
        else:
            h = ffn.act(h)
    return w_out(h)
