"""Logit filters for sampling: top-k (Fan et al. 2018) and nucleus / top-p (Holtzman et al. 2020).

Filtered-out tokens get ``-inf`` so that softmax gives them probability exactly 0.
"""

from __future__ import annotations

import torch
from torch import Tensor


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Keep the ``k`` largest logits of each row (ties at the k-th value are kept too).

    Args:
        logits: (N, V) float.
        k: number of tokens to keep, >= 1 (values >= V keep everything).
    Returns:
        (N, V) logits with the rest set to -inf.
    """
    if k < 1:
        raise ValueError(f"top_k={k} must be >= 1")
    if k >= logits.shape[-1]:
        return logits
    kth = logits.topk(k, dim=-1).values[..., -1:]  # (N, 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Nucleus filtering: keep the smallest set of most likely tokens whose probability mass is >= ``p``.

    Args:
        logits: (N, V) float.
        p: mass in (0, 1]; the most likely token is always kept.
    Returns:
        (N, V) logits with the rest set to -inf.
    """
    if not 0.0 < p <= 1.0:
        raise ValueError(f"top_p={p} must be in (0, 1]")
    sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)  # (N, V)
    probs = sorted_logits.float().softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # mass of the strictly more likely tokens
    drop_sorted = mass_before >= p  # enough mass already without this token
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # back to vocabulary order
    return logits.masked_fill(drop, float("-inf"))


def filter_logits(logits: Tensor, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """Apply top-k, then top-p (each only when given). logits (N, V) -> (N, V)."""
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None and top_p < 1.0:
        logits = top_p_filter(logits, top_p)
    return logits
