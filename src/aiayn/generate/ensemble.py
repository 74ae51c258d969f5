"""Ensemble decoding: several models with one target vocabulary decode as one, step by step.

At every step each model gives its next-token distribution and the ensemble uses their mean,
``p(y | ...) = (1/M) sum_m p_m(y | ...)``, returned in log space (``logsumexp_m log p_m - log M``). These are
normalized log-probabilities, so the searches, which log-normalize whatever a stepper returns, use them
unchanged. Each member keeps its own KV cache; ``reorder`` moves every member's rows alike. This is the
ensembling of fairseq's ``EnsembleModel`` (mean of probabilities, not of log-probabilities).

An ensemble of M models costs M times the decoding work (what it gains in BLEU: docs/results.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from aiayn.errors import AiaynError
from aiayn.generate.steppers import Stepper


class EnsembleStepper:
    """A :class:`~aiayn.generate.steppers.Stepper` whose distribution is the mean of its members'.

    Args:
        members: steppers over the same rows and the same vocabulary (V), e.g. one
            :class:`~aiayn.generate.steppers.Seq2SeqStepper` per model on the same source batch.
    """

    def __init__(self, members: Sequence[Stepper]) -> None:
        if not members:
            raise AiaynError("an ensemble needs at least one model")
        self.members = list(members)
        self.head = None  # the mixture has no single output layer: beam search chooses with the reference
        self._log_m = math.log(len(self.members))

    def _mix(self, logits: list[Tensor]) -> Tensor:
        """Per-member logits, each (N, V) -> log of the mean probability (N, V) float32."""
        if len(logits) == 1:
            return logits[0]
        logp = torch.stack([torch.log_softmax(x.float(), dim=-1) for x in logits])  # (M, N, V)
        return torch.logsumexp(logp, dim=0) - self._log_m

    def first(self) -> Tensor:
        """Log mean probabilities (N0, V) of the first generated token."""
        logits = [m.first() for m in self.members]
        shapes = {tuple(x.shape) for x in logits}  # fixed from here on: checked once, not at every step
        if len(shapes) != 1:
            raise AiaynError(f"ensemble members disagree on the output shape {sorted(shapes)}; "
                             "all models need the same target vocabulary")
        return self._mix(logits)

    def step(self, tokens: Tensor) -> Tensor:
        """tokens (N,) long -> log mean probabilities (N, V) of the next token."""
        return self._mix([m.step(tokens) for m in self.members])

    def reorder(self, index: Tensor, same_sources: bool | None = None, group: int | None = None) -> None:
        """Keep rows ``index`` (N',) long in every member (see :meth:`Stepper.reorder`)."""
        for m in self.members:
            m.reorder(index, same_sources=same_sources, group=group)
