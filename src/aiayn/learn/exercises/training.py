"""Lesson 9: training: the paper's learning-rate schedule and the label-smoothed loss.

References: :class:`aiayn.train.schedules.InverseSqrtWarmup` (paper eq. 3) and
:func:`aiayn.models.losses.label_smoothed_nll`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.learn.checking import Case, Exercise, Mistake
from aiayn.learn.exercises.common import generator, randn
from aiayn.models.losses import label_smoothed_nll
from aiayn.train.schedules import InverseSqrtWarmup


# ---------------------------------------------------------------------------------------------- noam_lr
def noam_lr_reference(step: int, d_model: int, warmup: int) -> float:
    """lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), step >= 1 (paper eq. 3)."""
    return InverseSqrtWarmup(warmup, d_model).multiplier(step)


def noam_lr_variant(warmup_power: float = -1.5, combine: str = "min", front: str = "inverse_sqrt",
                    step_from: int = 1) -> Callable[..., float]:
    """The schedule, or a wrong one: ``warmup_power`` -0.5; ``combine`` "max"; ``front`` "none" (no d_model^-0.5)
    or "sqrt" (d_model^0.5); ``step_from`` 0 (step - 1 used)."""
    def noam_lr(step: int, d_model: int, warmup: int) -> float:
        s = step - 1 if step_from == 0 else step  # from 0: step 1 divides by zero, as the mistake does
        pick = min if combine == "min" else max
        scale = {"inverse_sqrt": d_model**-0.5, "none": 1.0, "sqrt": d_model**0.5}[front]
        return scale * pick(s**-0.5, s * warmup**warmup_power)

    return noam_lr


def _noam_invoke(fn: Callable[..., Any], case: Case) -> Tensor:
    """The schedule at every step of the case, as one float64 tensor."""
    d_model, warmup, steps = case.args
    return torch.tensor([float(fn(s, d_model, warmup)) for s in steps], dtype=torch.float64)


def _noam_cases(rng: random.Random) -> list[Case]:
    w = rng.randint(2, 50)
    return [Case("d_model 512, warmup 4000 (the paper), steps 1, 100, 3999, 4000, 4001, 20000, 100000",
                 (512, 4000, [1, 100, 3999, 4000, 4001, 20_000, 100_000])),
            Case("d_model 64, warmup 10, steps 1 to 30", (64, 10, list(range(1, 31)))),
            Case("d_model 256, warmup 100, steps 2, 50, 100, 5000", (256, 100, [2, 50, 100, 5000])),
            Case(f"random: d_model 128, warmup {w}, steps 1 to {3 * w}", (128, w, list(range(1, 3 * w + 1))))]


NOAM_LR = Exercise(
    name="noam_lr",
    signature="noam_lr(step, d_model, warmup): step >= 1 -> float: d_model^-0.5 * min(step^-0.5, "
              "step * warmup^-1.5)",
    reference=noam_lr_reference,
    variant=noam_lr_variant,
    mistakes=(
        Mistake("warmup_power", -0.5, "warmup exponent -0.5",
                "during warmup the rate grows as step * warmup^-1.5 (it meets step^-0.5 exactly at step = warmup); "
                "with warmup^-0.5 it is far too large"),
        Mistake("combine", "max", "max instead of min",
                "the rate is the SMALLER of the two: it grows linearly during warmup, then decays as step^-0.5"),
        Mistake("front", "none", "no d_model^-0.5", "multiply by d_model ** -0.5"),
        Mistake("front", "sqrt", "d_model^0.5 instead of d_model^-0.5",
                "the factor is d_model ** -0.5: wider models take smaller steps"),
        Mistake("step_from", 0, "steps counted from 0",
                "the paper counts steps from 1: use step itself, not step - 1"),
    ),
    cases=_noam_cases,
    invoke=_noam_invoke,
    rtol=1e-6,
    atol=1e-12,
    lesson="09",
)


# ---------------------------------------------------------------------------------------------- label_smoothed_loss
def label_smoothed_loss_reference(logits: Tensor, labels: Tensor, epsilon: float) -> Tensor:
    """The mean over positions whose label is not -100 of (1 - eps) * NLL + eps * (mean over V of -log p)."""
    loss, _, n = label_smoothed_nll(logits, labels, epsilon)
    return loss / n


def label_smoothed_loss_variant(smooth_over: str = "all", average: str = "counted", log: str = "log_softmax",
                                uses_epsilon: bool = True) -> Callable[..., Tensor]:
    """The loss, or a wrong one: ``smooth_over`` "others" (eps spread over the V - 1 other classes); ``average``
    "all" (divided by every position, padding included) or "sum"; ``log`` "probs" (-p instead of -log p);
    ``uses_epsilon`` False (no smoothing)."""
    def label_smoothed_loss(logits: Tensor, labels: Tensor, epsilon: float) -> Tensor:
        eps = epsilon if uses_epsilon else 0.0
        logp = F.log_softmax(logits, dim=-1) if log == "log_softmax" else F.softmax(logits, dim=-1)  # (N, V)
        keep = labels != -100
        safe = labels.masked_fill(~keep, 0)
        nll = -logp.gather(-1, safe[:, None]).squeeze(-1)  # (N,)
        v = logits.shape[-1]
        if smooth_over == "others":
            smooth = -(logp.sum(-1) + nll) / (v - 1)
        else:
            smooth = -logp.sum(-1) / v
        loss = ((1 - eps) * nll + eps * smooth) * keep
        if average == "sum":
            return loss.sum()
        return loss.sum() / (keep.sum() if average == "counted" else labels.numel())

    return label_smoothed_loss


def _loss_cases(rng: random.Random) -> list[Case]:
    g = generator(rng)
    n, v = rng.randint(3, 12), rng.randint(3, 20)
    labels = torch.randint(0, v, (n,), generator=g)
    labels[rng.randrange(n)] = -100
    return [Case("6 positions over 5 classes, eps 0.1, two positions ignored (-100)",
                 (randn(g, 6, 5, scale=2.0), torch.tensor([0, 3, -100, 4, 1, -100]), 0.1)),
            Case("eps 0 (plain cross-entropy), 4 positions over 7 classes",
                 (randn(g, 4, 7, scale=2.0), torch.tensor([6, 0, 2, 2]), 0.0)),
            Case("eps 0.3, 3 positions over 4 classes", (randn(g, 3, 4, scale=2.0), torch.tensor([1, 1, 3]), 0.3)),
            Case(f"random: {n} positions over {v} classes, eps 0.1, one ignored", (randn(g, n, v, scale=2.0), labels,
                                                                                   0.1))]


LABEL_SMOOTHED_LOSS = Exercise(
    name="label_smoothed_loss",
    signature="label_smoothed_loss(logits, labels, epsilon): logits (N, V), labels (N,) with -100 at ignored "
              "positions -> 0-d tensor: the mean over counted positions of (1 - eps) * (-log p[label]) + "
              "eps * mean over all V classes of (-log p)",
    reference=label_smoothed_loss_reference,
    variant=label_smoothed_loss_variant,
    mistakes=(
        Mistake("smooth_over", "others", "smoothing spread over the other classes",
                "you spread eps over the V - 1 classes that are not the label (fairseq's convention); aiayn and "
                "PyTorch's label_smoothing spread eps / V over all V classes, the label included"),
        Mistake("average", "all", "ignored positions counted",
                "divide by the number of positions that count (labels != -100), not by every position: padding "
                "would dilute the loss of short batches"),
        Mistake("average", "sum", "summed, not averaged", "divide the sum by the number of counted positions"),
        Mistake("log", "probs", "probabilities instead of log-probabilities",
                "the loss is built from -log p: use torch.log_softmax(logits, dim=-1)"),
        Mistake("uses_epsilon", False, "no smoothing",
                "mix (1 - eps) of the NLL with eps of the mean -log p over the vocabulary"),
    ),
    cases=_loss_cases,
    lesson="09",
)
