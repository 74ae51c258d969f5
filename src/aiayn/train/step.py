"""One optimizer step: micro-batches accumulated, non-finite steps skipped, gradients clipped, parameters updated.

    loss = sum over micro-batches of loss_sum / (target tokens in ALL micro-batches)
           (a mixture-of-experts model adds its weighted router losses, a mean over each micro-batch's tokens, times
           the micro-batch's target count, to its loss_sum)
    backward, clip, optimizer step, schedule step (float16: with dynamic loss scaling)

Dividing every micro-batch's summed loss by the token count of the whole accumulated batch makes k accumulated
batches give exactly the update of one batch of their union, whatever their lengths. In a data-parallel run each
rank computes every N-th micro-batch of the step and the engine (:class:`~aiayn.train.parallel.Parallel`) combines
the gradients once, after the last.

A step whose loss, router loss or gradient norm is not finite changes nothing: no optimizer, scheduler or scaler
step (under float16 an overflowing gradient is the scaler's to skip, and it lowers the scale). The step reports it
in its :class:`StepRecord`; counting such steps and ending a diverged run is the loop's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from aiayn.train.optim import build_optimizer
from aiayn.train.parallel import Parallel
from aiayn.train.precision import Precision
from aiayn.train.schedules import build_scheduler
from aiayn.train.stop_signals import agreed
from aiayn.train.train_config import TrainConfig


@dataclass
class StepRecord:
    """The numbers of one step, summed over its micro-batches and over the ranks.

    Attributes:
        loss: the summed (label-smoothed) task loss over the step's targets.
        nll: the summed negative log-likelihood (the loss without label smoothing).
        moe: the summed weighted router loss of a mixture-of-experts model (0.0 for other models).
        targets: the targets of the step's micro-batches (the divisor of every micro-batch's loss).
        grad_norm: the gradients' total 2-norm before clipping; None when it is not finite or was not computed.
        problem: why the update was skipped (a non-finite loss, router loss or gradient norm), else None.
        late: some rank found the run out of time (``train.max_minutes``) after this step's backward passes.
        stop: the signal some rank received before this step's sums (a deferred stop,
            :mod:`aiayn.train.stop_signals`), else None: every rank stops after this step.
    """

    loss: float
    nll: float
    moe: float
    targets: int
    grad_norm: float | None
    problem: str | None
    late: bool
    stop: int | None = None


def optimizer_for(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """The optimizer ``train.optimizer`` names over ``model``'s trainable parameters (fused where supported)."""
    return build_optimizer(model, cfg.optimizer, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                           weight_decay=cfg.weight_decay)


def scheduler_for(optimizer: torch.optim.Optimizer, model: nn.Module,
                  cfg: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """The learning-rate schedule ``train.schedule`` names (``inverse_sqrt_warmup`` reads ``model``'s d_model)."""
    kwargs: dict[str, Any] = {"warmup": cfg.warmup}
    if cfg.schedule == "inverse_sqrt_warmup":
        kwargs["d_model"] = model.config.d_model
    elif cfg.schedule == "warmup_cosine":
        kwargs.update(total=cfg.max_steps, min_ratio=cfg.min_lr_ratio)
    return build_scheduler(optimizer, cfg.schedule, **kwargs)


def _grad_norm(par: Parallel, model: nn.Module, clip_norm: float | None) -> float:
    """The gradients' total 2-norm over every rank, clipped to ``clip_norm`` when set (inf or nan when a gradient is
    not finite)."""
    return par.grad_norm(list(model.parameters()), clip_norm)


class TrainStep:
    """Runs optimizer steps of ``task``'s model: ``step(micro_batches, late)`` -> :class:`StepRecord`.

    Args:
        task: supplies ``count_targets(batch)``; its loss runs through ``parallel.loss_module``.
        parallel: the parallel strategy (micro-batch context, loss scale, gradient norm, sums over ranks).
        precision: autocast and float16 loss scaling.
        cfg: the run's settings (label smoothing, clip norm; optimizer and schedule for :meth:`build`).
        optimizer, scheduler: what each step updates.
    """

    def __init__(self, task: Any, parallel: Parallel, precision: Precision, cfg: TrainConfig,
                 optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR) -> None:
        self.task, self.parallel, self.precision, self.cfg = task, parallel, precision, cfg
        self.optimizer, self.scheduler = optimizer, scheduler

    @classmethod
    def build(cls, task: Any, parallel: Parallel, precision: Precision, cfg: TrainConfig) -> TrainStep:
        """A step with the optimizer and schedule ``cfg`` names, over ``task.model``'s (wrapped) parameters."""
        optimizer = optimizer_for(task.model, cfg)
        return cls(task, parallel, precision, cfg, optimizer, scheduler_for(optimizer, task.model, cfg))

    def __call__(self, micro: list[Any], late: Callable[[], bool],
                 stops: Callable[[], list[float]] = list) -> StepRecord:
        """One step's gradients over ``micro``, every micro-batch of the step (this rank computes every N-th of
        them), clipped; the parameters change only in :meth:`update`.

        ``late()`` and ``stops()`` (the stop signals received, :meth:`~aiayn.train.stop_signals.StopSignals.pending`)
        are asked after the backward passes; their answers travel with the step's sums (one collective), so that
        every rank stops after the same step.
        """
        par, precision = self.parallel, self.precision
        self.optimizer.zero_grad(set_to_none=True)
        total_targets = sum(self.task.count_targets(b) for b in micro)  # the divisor for every micro-batch
        loss, nll, moe = self._accumulate(micro[par.ranks.rank::par.ranks.world], total_targets)
        loss, nll, moe, late_ranks, *signals = par.sum_over_ranks([loss, nll, moe, float(late()), *stops()])
        grad_norm = None
        problem = None if math.isfinite(loss) else f"non-finite loss ({loss})"
        if problem is None and not math.isfinite(moe):
            problem = f"non-finite router loss ({moe})"
        if problem is None:
            precision.unscale(self.optimizer)  # a no-op unless float16 loss scaling is on
            grad_norm = _grad_norm(par, par.model, self.cfg.clip_norm)
            if not math.isfinite(grad_norm):
                grad_norm = None
                if not precision.scaling:  # float16: an overflow, which the scaler skips and scales down
                    problem = "non-finite gradient norm"
        if problem is not None:  # nothing changes: no optimizer, scheduler or scaler step
            self.optimizer.zero_grad(set_to_none=True)
        return StepRecord(loss, nll, moe, total_targets, grad_norm, problem, late_ranks > 0,
                          agreed(signals) if signals else None)

    def update(self) -> None:
        """Apply the step :meth:`__call__` computed (a record with no problem): the optimizer's update (float16:
        the scaler's, which may skip an overflow), then the schedule's."""
        self.precision.step(self.optimizer)
        self.scheduler.step()

    def _accumulate(self, mine: list[Any], total_targets: int) -> tuple[float, float, float]:
        """Forward and backward passes of this rank's micro-batches: (summed loss, summed nll, summed router loss)."""
        par, precision = self.parallel, self.precision
        loss_total, nll_total, moe_total = 0.0, 0.0, 0.0
        # each rank's share of the step's mean; the engines average over ranks (loss_scale undoes it)
        divisor = max(total_targets, 1) / par.loss_scale
        for i, batch in enumerate(mine):
            with par.micro_batch(last=i == len(mine) - 1):  # DDP/FSDP: gradients synchronized after the last
                with precision.autocast():
                    loss_sum, n_targets, extra, router = par.loss_module(batch, self.cfg.label_smoothing)
                if router is not None:  # a mean over the micro-batch's tokens, weighted as its targets are
                    router_sum = router.float() * n_targets
                    precision.scale((loss_sum + router_sum) / divisor).backward()
                    moe_total += float(router_sum.detach())  # read after backward is queued: no extra wait
                else:
                    precision.scale(loss_sum / divisor).backward()
            value = float(loss_sum.detach())
            loss_total += value
            nll_total += extra.get("nll", value)
        return loss_total, nll_total, moe_total
