"""Pieces shared by every search: hypotheses, the length penalty, forcing a token, and the next-token scores and
log-probabilities (:func:`next_scores`, :func:`next_log_probs`, defined beside the output head in
:mod:`aiayn.models.heads`, which chooses greedy tokens with them)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from aiayn.models.heads import next_log_probs, next_scores

__all__ = ["Hypothesis", "LaggedFlag", "force_token", "length_penalty", "next_log_probs", "next_scores"]


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
        alpha: strength; the paper uses 0.6. A huge one gives inf (every score then rounds to 0), not an overflow.
    """
    try:
        return ((5.0 + length) / 6.0) ** alpha
    except OverflowError:
        return math.inf


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


class LaggedFlag:
    """A loop's "every row has stopped" flag read on the host without waiting for the step that set it.

    On the CPU :meth:`seen` is ``bool(flag)``. On an accelerator it starts the flag's copy to pinned host memory and
    returns the copy started one call earlier, so the host queues step t+1 while step t runs instead of waiting
    for it: a loop stops one step late, a step in which every row has already stopped and changes nothing.
    """

    def __init__(self, device: torch.device, lagged: bool | None = None) -> None:
        """``lagged``: read one call late (default: off the CPU)."""
        self.lagged = device.type != "cpu" if lagged is None else lagged
        self._pending: tuple[Tensor, torch.Event | None] | None = None

    def seen(self, flag: Tensor) -> bool:
        """flag () bool -> whether it was true (this call's on the CPU, the previous call's when lagged)."""
        if not self.lagged:
            return bool(flag)
        pinned = flag.device.type != "cpu"
        host = torch.empty((), dtype=torch.bool, pin_memory=pinned)
        host.copy_(flag, non_blocking=pinned)
        event = torch.Event(flag.device) if pinned else None
        if event is not None:
            event.record()
        previous, self._pending = self._pending, (host, event)
        if previous is None:
            return False
        if previous[1] is not None:
            previous[1].synchronize()
        return bool(previous[0])
