"""Learning-rate schedules as resumable ``LambdaLR`` multipliers.

Each schedule is a small callable class mapping the scheduler's step counter to a multiplier of the
optimizer's base learning rate. Being objects (not closures), their parameters land in
``LambdaLR.state_dict()`` as plain numbers, so a scheduler saved with ``torch.save`` loads back with
``torch.load(weights_only=True)`` and resumes exactly.

Step counting: ``LambdaLR`` evaluates the multiplier at ``last_epoch = 0`` on construction and adds one
on every ``scheduler.step()``. The schedules count steps from 1, so the learning rate of the k-th
optimizer step (k = 1, 2, ...) is ``multiplier(k)``, provided the loop calls ``optimizer.step()`` then
``scheduler.step()``.
"""

from __future__ import annotations

import inspect
import math

import torch
from torch.optim.lr_scheduler import LambdaLR

from aiayn.errors import AiaynError


class _Schedule:
    """Base: ``__call__(epoch)`` gives the multiplier for 1-based step ``epoch + 1``."""

    def multiplier(self, step: int) -> float:
        """The learning-rate multiplier at 1-based optimizer step ``step``."""
        raise NotImplementedError

    def __call__(self, epoch: int) -> float:
        return self.multiplier(epoch + 1)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class InverseSqrtWarmup(_Schedule):
    """The paper's schedule (section 5.3): linear warmup, then decay with the inverse square root.

    ``lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)``, highest at
    ``step == warmup`` where it equals ``scale * (d_model * warmup)^-0.5``. Use it with optimizer
    ``lr=1.0`` to get the paper's absolute learning rates.

    With ``d_model=None`` the factor ``d_model^-0.5`` is replaced by ``warmup^0.5``, so the peak
    multiplier is exactly ``scale`` and the optimizer's ``lr`` is the peak learning rate.

    Args:
        warmup: warmup steps (the paper: 4000). Must be >= 1.
        d_model: model width, or None for the peak-normalized form.
        scale: constant factor (the paper: 1.0).
    """

    def __init__(self, warmup: int = 4000, d_model: int | None = None, scale: float = 1.0) -> None:
        if warmup < 1:
            raise AiaynError(f"inverse_sqrt_warmup: warmup must be >= 1, got {warmup} (a recipe's train.warmup); "
                             "raise it, or use the constant_warmup schedule for no warmup")
        if d_model is not None and d_model < 1:
            raise AiaynError(f"inverse_sqrt_warmup: d_model must be >= 1, got {d_model}")
        self.warmup = int(warmup)
        self.d_model = None if d_model is None else int(d_model)
        self.scale = float(scale)

    def multiplier(self, step: int) -> float:
        step = max(step, 1)
        front = self.d_model**-0.5 if self.d_model is not None else self.warmup**0.5
        return self.scale * front * min(step**-0.5, step * self.warmup**-1.5)


class WarmupCosine(_Schedule):
    """Linear warmup to 1, then half a cosine down to ``min_ratio`` at step ``total``, flat after.

    Multiplier ``step / warmup`` for ``step <= warmup``; then
    ``min_ratio + (1 - min_ratio) * (1 + cos(pi * p)) / 2`` with
    ``p = (step - warmup) / (total - warmup)`` clipped to [0, 1].

    Args:
        warmup: warmup steps (0 for none).
        total: the step at which the minimum is reached; must exceed ``warmup``.
        min_ratio: final multiplier in [0, 1].
    """

    def __init__(self, warmup: int, total: int, min_ratio: float = 0.0) -> None:
        if warmup < 0 or total <= warmup:
            raise AiaynError(
                f"warmup_cosine: need 0 <= warmup < total, got warmup={warmup}, total={total} (total is the step "
                "where the cosine ends; in a recipe: train.warmup and train.max_steps); lower train.warmup or "
                "raise train.max_steps"
            )
        if not 0.0 <= min_ratio <= 1.0:
            raise AiaynError(f"warmup_cosine: min_ratio={min_ratio} must be in [0, 1] (a recipe's train.min_lr_ratio)")
        self.warmup = int(warmup)
        self.total = int(total)
        self.min_ratio = float(min_ratio)

    def multiplier(self, step: int) -> float:
        if self.warmup > 0 and step <= self.warmup:
            return step / self.warmup
        p = min(1.0, max(0.0, (step - self.warmup) / (self.total - self.warmup)))
        return self.min_ratio + (1.0 - self.min_ratio) * 0.5 * (1.0 + math.cos(math.pi * p))


class ConstantWarmup(_Schedule):
    """Linear warmup to 1 over ``warmup`` steps, then constant 1.

    Args:
        warmup: warmup steps (0 for a constant schedule).
    """

    def __init__(self, warmup: int = 0) -> None:
        if warmup < 0:
            raise AiaynError(f"constant_warmup: warmup={warmup} must be >= 0 (a recipe's train.warmup)")
        self.warmup = int(warmup)

    def multiplier(self, step: int) -> float:
        if self.warmup == 0:
            return 1.0
        return min(1.0, step / self.warmup)


def inverse_sqrt_warmup(
    warmup: int = 4000, d_model: int | None = None, scale: float = 1.0
) -> InverseSqrtWarmup:
    """The paper's schedule; see :class:`InverseSqrtWarmup`."""
    return InverseSqrtWarmup(warmup, d_model, scale)


def warmup_cosine(warmup: int, total: int, min_ratio: float = 0.0) -> WarmupCosine:
    """Linear warmup then cosine decay; see :class:`WarmupCosine`."""
    return WarmupCosine(warmup, total, min_ratio)


def constant_warmup(warmup: int = 0) -> ConstantWarmup:
    """Linear warmup then constant; see :class:`ConstantWarmup`."""
    return ConstantWarmup(warmup)


SCHEDULES: dict[str, type[_Schedule]] = {
    "inverse_sqrt_warmup": InverseSqrtWarmup,
    "warmup_cosine": WarmupCosine,
    "constant_warmup": ConstantWarmup,
}


def build_schedule(name: str, **kw: object) -> _Schedule:
    """Build a schedule multiplier by name, validating its keyword arguments.

    Args:
        name: one of ``SCHEDULES``.
        **kw: the schedule's parameters.

    Raises:
        AiaynError: unknown name (lists the valid ones) or unknown/missing parameters.
    """
    cls = SCHEDULES.get(name)
    if cls is None:
        raise AiaynError(f"unknown learning-rate schedule {name!r}; valid schedules: {', '.join(SCHEDULES)}")
    params = [p for p in inspect.signature(cls.__init__).parameters.values() if p.name != "self"]
    accepted = {p.name for p in params}
    unknown = sorted(set(kw) - accepted)
    missing = [p.name for p in params if p.default is inspect.Parameter.empty and p.name not in kw]
    if unknown or missing:
        raise AiaynError(
            f"schedule {name!r}: "
            + (f"unknown parameter(s) {', '.join(unknown)}; " if unknown else "")
            + (f"missing parameter(s) {', '.join(missing)}; " if missing else "")
            + f"accepted parameters: {', '.join(p.name for p in params)}"
        )
    return cls(**kw)  # type: ignore[arg-type]


def build_scheduler(optimizer: torch.optim.Optimizer, name: str, **kw: object) -> LambdaLR:
    """Wrap ``optimizer`` in a resumable ``LambdaLR`` running the named schedule.

    Call ``scheduler.step()`` once after each ``optimizer.step()``. To resume, build the scheduler the
    same way and call ``scheduler.load_state_dict(saved)``; the step counter and the schedule's
    parameters are restored.

    Args:
        optimizer: the optimizer; its ``lr`` is the base the multiplier scales.
        name: ``"inverse_sqrt_warmup"``, ``"warmup_cosine"`` or ``"constant_warmup"``.
        **kw: schedule parameters (see each schedule class).

    Raises:
        AiaynError: unknown name or parameters.
    """
    return LambdaLR(optimizer, build_schedule(name, **kw))
