"""Decoding-step attention on the CPU: torch's flash kernel or two matmuls around a softmax, chosen by shape.

A decoding step attends from a few queries (one per row, or a sentence's beams folded into one block over its
source) to a cache of keys. Over many (batch x head) blocks two matmuls cost less than the flash kernel's per-block
work; over few, the flash kernel wins. The rule depends on the shape only, never on timing, so a run's numerics are
the same in every process and on every host. Only CPU inference in fp32 with few queries comes here
(:func:`applies`); everything else keeps torch's kernel. ``SETTINGS.decode_attention`` pins a kernel for tests.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.accel.cpu.settings import SETTINGS

MAX_QUERIES = 8  # queries per (batch, head) block that count as a decoding step (4 beams folded: 4)
MATMUL_BLOCKS = 64  # (batch x head) blocks from which two matmuls replace the flash kernel


def applies(q: Tensor, k: Tensor, dropout_p: float, is_causal: bool) -> bool:
    """Whether this attention call is a decoding step :func:`few_query_attention` may serve: fp32 CPU tensors, no
    autograd, no dropout, no causal flag, at most ``MAX_QUERIES`` queries per block."""
    return (q.device.type == "cpu" and q.dtype == torch.float32 and k.dtype == torch.float32
            and q.shape[-2] <= MAX_QUERIES and dropout_p == 0.0 and not is_causal
            and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)))


def matmul_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    """softmax(q k^T * scale, masked) v as two matmuls and a softmax.

    Args:
        q: (B, H, T, Dh); k, v: (B, H, S, Dh), any strides.
        mask: bool broadcastable to (B, H, T, S), True = may attend; every row must allow at least one key.
        scale: the score scale.
    Returns:
        (B, H, T, Dh).
    """
    scores = torch.matmul(q, k.transpose(-2, -1)).mul_(scale)  # (B, H, T, S)
    if mask is not None:
        scores.masked_fill_(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def _flash(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


_KERNELS = {"flash": _flash, "matmul": matmul_attention}


def chosen_kernel(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> str:
    """"flash" or "matmul" for this call: ``SETTINGS.decode_attention`` if it pins one, else ("auto", "shape")
    "matmul" from ``MATMUL_BLOCKS`` (batch x head) blocks up."""
    setting = SETTINGS.decode_attention
    if setting in _KERNELS:
        return setting
    return "matmul" if q.shape[0] * q.shape[1] >= MATMUL_BLOCKS else "flash"


def few_query_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    """A decoding step's attention through the kernel :func:`chosen_kernel` picks; shapes as
    :func:`matmul_attention`. Call only where :func:`applies`."""
    return _KERNELS[chosen_kernel(q, k, v, mask, scale)](q, k, v, mask, scale)
