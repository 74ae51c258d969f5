"""Lesson 10: looking inside: two of the explorer's per-head statistics.

Reference: :func:`aiayn.inspect.stats.head_statistics` (``entropy`` in bits and ``distance``, each averaged over
the query rows that attend to something).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch
from torch import Tensor

from aiayn.inspect.stats import head_statistics
from aiayn.learn.checking import Case, Exercise, Mistake
from aiayn.learn.exercises.common import generator
from aiayn.nn.masks import causal_mask


def head_entropy_reference(weights: Tensor) -> Tensor:
    """weights (H, T, S) -> (H,): each head's mean over live query rows of -sum_j w log2 w, in bits."""
    stats = head_statistics(weights, ["x"] * weights.shape[-1], self_attention=False)
    return torch.tensor([s["entropy"] for s in stats], dtype=torch.float64)


def mean_distance_reference(weights: Tensor) -> Tensor:
    """weights (H, T, S) of self-attention, queries the last T of S positions -> (H,): each head's mean over live
    query rows of sum_j w_ij |pos_i - j|."""
    stats = head_statistics(weights, ["x"] * weights.shape[-1], self_attention=True)
    return torch.tensor([s["distance"] for s in stats], dtype=torch.float64)


def head_entropy_variant(log: str = "log2", rows: str = "live", zeros: str = "safe", axis: int = -1
                         ) -> Callable[..., Tensor]:
    """Entropy per head, or a wrong one: ``log`` "ln" (nats); ``rows`` "all" (rows with no allowed key averaged in
    as 0); ``zeros`` "nan" (0 * log 0 left as NaN); ``axis`` -2 (summed over the queries)."""
    def head_entropy(weights: Tensor) -> Tensor:
        w = weights.double()
        logw = torch.log2(w) if log == "log2" else torch.log(w)
        terms = -(w * logw)
        if zeros == "safe":
            terms = terms.nan_to_num(0.0)
        if axis == -2:
            per_row = terms.sum(-2)  # (H, S)
            return per_row.mean(-1)
        per_row = terms.sum(-1)  # (H, T)
        if rows == "all":
            return per_row.mean(-1)
        live = w.sum(-1) > 0
        return (per_row * live).sum(-1) / live.sum(-1).clamp(min=1)

    return head_entropy


def mean_distance_variant(align: str = "end", rows: str = "live", signed: bool = False) -> Callable[..., Tensor]:
    """Mean attention distance per head, or a wrong one: ``align`` "start" (query i at position i even when T < S);
    ``rows`` "all"; ``signed`` True (i - j without the absolute value)."""
    def mean_distance(weights: Tensor) -> Tensor:
        w = weights.double()
        h, t, s = w.shape
        q = torch.arange(s - t, s) if align == "end" else torch.arange(t)
        gap = q[:, None].double() - torch.arange(s)[None].double()  # (T, S)
        per_row = (w * (gap if signed else gap.abs())).sum(-1)  # (H, T)
        if rows == "all":
            return per_row.mean(-1)
        live = w.sum(-1) > 0
        return (per_row * live).sum(-1) / live.sum(-1).clamp(min=1)

    return mean_distance


def _weights(g: torch.Generator, h: int, t: int, s: int, mask: Tensor | None = None, sharp: float = 1.5) -> Tensor:
    """Random attention weights (H, T, S), zero where ``mask`` is False (a row with no allowed key all zero)."""
    scores = torch.randn(h, t, s, generator=g) * sharp
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1).nan_to_num(0.0)


def _cases(rng: random.Random) -> list[Case]:
    g = generator(rng)
    empty = torch.ones(4, 4, dtype=torch.bool)
    empty[1] = False  # query 1 attends to nothing (left padding)
    t = rng.randint(1, 5)
    s = t + rng.randint(0, 4)
    return [Case("causal self-attention, 2 heads over 5 tokens", (_weights(g, 2, 5, 5, causal_mask(5)),)),
            Case("3 heads, 4 tokens, query 1 with no allowed key (its row all 0)", (_weights(g, 3, 4, 4, empty),)),
            Case("a decoding step: 1 query at the end of 6 keys", (_weights(g, 2, 1, 6),)),
            Case("3 queries at the end of 7 keys, causal", (_weights(g, 1, 3, 7, causal_mask(3, 7)),)),
            Case(f"random: {t} queries at the end of {s} keys", (_weights(g, 2, t, s, causal_mask(t, s)),))]


HEAD_ENTROPY = Exercise(
    name="head_entropy",
    signature="head_entropy(weights): weights (H, T, S) -> (H,): per head, the mean over query rows that attend "
              "to something (row sum > 0) of -sum_j w log2 w (bits; 0 log 0 = 0)",
    reference=head_entropy_reference,
    variant=head_entropy_variant,
    mistakes=(
        Mistake("log", "ln", "entropy in nats", "the explorer reports bits: use torch.log2, not torch.log"),
        Mistake("rows", "all", "empty rows averaged in",
                "a query with no allowed key has all-zero weights and no entropy to speak of; average only over "
                "the rows whose weights sum to more than 0"),
        Mistake("zeros", "nan", "NaN from 0 log 0",
                "masked keys have weight 0 and log 0 = -inf, so 0 * log 0 is NaN; count those terms as 0 "
                "(w * log2(w.clamp(min=1e-30)), or nan_to_num)"),
        Mistake("axis", -2, "entropy over the wrong axis",
                "each query's weights over the keys form a distribution: sum over the last axis (keys)"),
    ),
    cases=_cases,
    lesson="10",
)

MEAN_DISTANCE = Exercise(
    name="mean_distance",
    signature="mean_distance(weights): self-attention weights (H, T, S), the T queries the last T of S positions -> "
              "(H,): per head, the mean over query rows that attend to something of sum_j w_ij |pos_i - j|",
    reference=mean_distance_reference,
    variant=mean_distance_variant,
    mistakes=(
        Mistake("align", "start", "queries not aligned to the end of the keys",
                "with T < S (a decoding step) query i is at position S - T + i, not i"),
        Mistake("rows", "all", "empty rows averaged in",
                "average only over the query rows whose weights sum to more than 0"),
        Mistake("signed", True, "signed distance", "the distance is |pos_i - j|: take the absolute value"),
    ),
    cases=_cases,
    lesson="10",
)
