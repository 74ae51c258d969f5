"""Pieces shared by every search: hypotheses, the length penalty, next-token log-probabilities."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Hypothesis:
    """One decoded output.

    Attributes:
        tokens: the output ids, without BOS and without the final EOS.
        score: ``logprob / length_penalty(len(tokens) + 1, alpha)`` (EOS counts in the length).
        logprob: sum of the model's log-probabilities of the tokens and of the final EOS.
    """

    tokens: list[int]
    score: float
    logprob: float


def length_penalty(length: int, alpha: float) -> float:
    """GNMT's length penalty lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al. 2016); 1 when alpha = 0.

    Args:
        length: |Y|, the number of output tokens including EOS.
        alpha: strength; the paper uses 0.6.
    """
    return ((5.0 + length) / 6.0) ** alpha


def next_log_probs(logits: Tensor, banned_ids: Sequence[int] = ()) -> Tensor:
    """Log-softmax in float32, with ``banned_ids`` (e.g. PAD, BOS) set to -inf afterwards (no renormalizing).

    Args:
        logits: (N, V).
    Returns:
        (N, V) float32 log-probabilities.
    """
    logp = torch.log_softmax(logits.float(), dim=-1)
    if banned_ids:
        logp[:, list(banned_ids)] = float("-inf")
    return logp


def next_scores(logits: Tensor, banned_ids: Sequence[int] = ()) -> Tensor:
    """The logits in float32 with ``banned_ids`` set to -inf (a new tensor when any are banned): what a search
    that ignores a per-row shift (greedy, sampling) needs from :func:`next_log_probs`, without its log-softmax.

    Args:
        logits: (N, V).
    Returns:
        (N, V) float32 scores.
    """
    scores = logits.float()
    if banned_ids:
        banned = torch.tensor(list(banned_ids), dtype=torch.long, device=scores.device)
        scores = scores.index_fill(1, banned, float("-inf"))
    return scores


def force_token(logp: Tensor, rows: Tensor, token_id: int) -> Tensor:
    """Rows where ``rows`` (N,) bool is True may only produce ``token_id`` (e.g. EOS at the length limit).

    Args:
        logp: (N, V) log-probabilities.
    Returns:
        (N, V): other tokens of those rows set to -inf; ``token_id`` keeps its log-probability.
    """
    only = torch.full_like(logp, float("-inf"))
    only[:, token_id] = logp[:, token_id]
    return torch.where(rows[:, None], only, logp)
