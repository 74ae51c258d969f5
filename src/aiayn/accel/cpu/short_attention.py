"""Training attention over few keys, on the CPU, by two matmuls instead of torch's flash kernel.

torch's CPU flash kernel walks queries and keys in blocks; over a few dozen keys its per-block work outweighs the
arithmetic, so up to :data:`MAX_KEYS` keys forward + backward run faster as two matmuls, an additive mask and a
softmax, causal or with padding; at 128 keys neither wins clearly (measured: docs/performance.md,
``bench/cpu_train_kernels.py``). Sentences in translation corpora are mostly shorter than 64 tokens, so this is the
common case of seq2seq training on a CPU.

The scores (B, H, T, S) are materialized, which is what bounds the key count: at S <= :data:`MAX_KEYS` they take at
most S / Dh times the memory of the queries.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.nn.masks import causal_mask

#: key counts up to this train through :func:`attention` on the CPU
MAX_KEYS = 64


def cpu_training(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether attention of these CPU tensors is about to run with a backward pass (autograd on, an input needing
    a gradient)."""
    return (q.device.type == "cpu" and torch.is_grad_enabled()
            and (q.requires_grad or k.requires_grad or v.requires_grad))


def applies(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether :func:`attention` should serve this call: at most :data:`MAX_KEYS` keys, CPU training
    (:func:`cpu_training`; inference keeps torch's kernels, see :mod:`aiayn.accel.cpu.decode_attention`)."""
    return k.shape[-2] <= MAX_KEYS and cpu_training(q, k, v)


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None, dropout_p: float,
              is_causal: bool, scale: float) -> Tensor:
    """softmax(q k^T * scale + bias, masked) v, differentiable.

    Args:
        q: (B, H, T, Dh) queries.
        k, v: (B, H, S, Dh) keys and values (heads already expanded for GQA/MQA).
        mask: bool, broadcastable to (B, H, T, S), True = may attend; no query row may be all False (the caller
            lets such rows attend everywhere and zeroes their output, as
            :func:`aiayn.nn.attention.scaled_dot_product_attention` does).
        bias: float, broadcastable to (B, H, T, S), added to the scores (may require grad: T5's learned bias).
        dropout_p: dropout on the attention weights.
        is_causal: a causal mask with queries aligned to the end of the keys (T <= S), besides ``mask``.
        scale: the score scale.
    Returns:
        (B, H, T, Dh).
    """
    t, s = q.shape[-2], k.shape[-2]
    scores = torch.matmul(q, k.transpose(-2, -1)).mul_(scale)  # (B, H, T, S)
    if bias is not None:
        scores = scores.add_(bias)
    if mask is not None:
        scores = scores.add_(additive_mask(mask, scores.dtype))
    if is_causal:
        scores = scores.add_(_causal_additive(t, s, scores.dtype, scores.device))
    weights = torch.softmax(scores, dim=-1)
    if dropout_p > 0:
        weights = F.dropout(weights, dropout_p)
    return torch.matmul(weights, v)


def additive_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A bool mask (True = may attend) as 0 / -inf in ``dtype``, the same shape. Adding it to the scores costs
    nothing in the backward pass, unlike ``masked_fill``, whose gradient is masked again."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


@functools.lru_cache(maxsize=32)
def _causal_additive(t: int, s: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """(T, S) 0 / -inf: query i sees keys up to i + S - T (queries aligned to the end of the keys)."""
    return additive_mask(causal_mask(t, s, device=device), dtype)
