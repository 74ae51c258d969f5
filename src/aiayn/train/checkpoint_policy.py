"""The checkpoint policy of a training run: what is saved when, and what an interrupted run keeps.

In ``train.out_dir``:

- ``best/``: the weights of the best validation score so far (``task.select_metric``, lower or higher as
  ``task.select_mode`` says), written when a validation improves on it.
- ``last/``: the latest weights with the training state (step, data position, best score, optimizer, schedule,
  float16 loss scale, every rank's RNG state, time trained, the ``[train]`` settings and the recipe's
  ``model`` / ``tokenizer`` / ``data`` sections), written after every validation (``train.eval_every``, and the last
  step) and every periodic checkpoint, and at the end. A sharded (FSDP) run's ``last/`` holds its model and
  optimizer shards in ``dcp/`` (:mod:`aiayn.train.dcp_checkpoint`).
- ``step-N/``: the weights every ``train.save_every`` steps and, with ``train.save_every_minutes``, after the first
  step that ends that many minutes after the last ``step-N/`` (the paper's checkpoints every 10 minutes); the last
  ``max(keep_checkpoints, average_last)`` kept.
- ``averaged/``: at the end, the mean of the last ``train.average_last`` periodic checkpoints, evaluated and
  logged (``avg_*``), with a note where it is worse than ``best/``.

An interrupt (Ctrl-C, or SIGTERM, SIGHUP, SIGUSR1: :mod:`aiayn.train.stop_signals`) of a single-process run first
saves its last whole step to ``last/``, with the data position and RNG state as they were after that step, so that
``--resume`` continues as if nothing had happened; a second Ctrl-C skips the save, and a save cut short leaves
``last/`` as it was. The ranks of a data-parallel run learn of a stop signal after the same step
(:meth:`CheckpointPolicy.save_for_stop`) and save that step together.

Rank 0 evaluates and writes; the gathers before a save (every rank's RNG state, FSDP's whole weights) are
collectives that every rank makes at the same steps. Reading ``last/`` back is :mod:`aiayn.train.restore`.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from aiayn.checkpoint import (
    capture_rng,
    keep_last,
    periodic_checkpoints,
    read_state_dict,
    restore_rng,
    save_checkpoint,
    write_average,
)
from aiayn.nn.lora import trainable_state
from aiayn.train.dcp_checkpoint import save_sharded
from aiayn.train.distributed import all_sum
from aiayn.train.metrics_log import MetricsLogger
from aiayn.train.parallel import Parallel
from aiayn.train.precision import Precision
from aiayn.train.progress import TrainingProgress
from aiayn.train.resume import SHARDED_FORMAT
from aiayn.train.stop_signals import Stopped, signal_name
from aiayn.train.train_config import TrainConfig


@dataclass
class RunState:
    """Where a run is: what ``last/``'s training state records, and what an interrupt saves.

    Attributes:
        step: optimizer steps done (skipped steps do not count).
        position: the data position after the last micro-batch drawn (None: the beginning).
        best: ``{"value": metric, "step": step}`` of ``best/``, or None.
        elapsed_before: seconds the run had trained before this process resumed it.
        skipped: steps skipped for a non-finite loss or gradient norm in the run's whole history.
        in_a_row: such steps skipped in a row, up to now.
        started: when this process started its steps (``time.time()``).
        done: the data position and RNG state after the last whole step (what an interrupt saves).
    """

    step: int = 0
    position: dict[str, Any] | None = None
    best: dict[str, Any] | None = None
    elapsed_before: float = 0.0
    skipped: int = 0
    in_a_row: int = 0
    started: float = field(default_factory=time.time)
    done: dict[str, Any] = field(default_factory=dict)

    def elapsed(self) -> float:
        """Seconds of steps, validations and saves, this process's and before: what ``train.max_minutes`` counts."""
        return self.elapsed_before + time.time() - self.started

    def mark_done(self) -> None:
        """Record the data position and RNG state now, after a whole step (or before the first)."""
        self.done = {"position": self.position, "rng": capture_rng()}


class CheckpointPolicy:
    """Writes ``best/``, ``last/``, ``step-N/`` and ``averaged/`` of one run (see the module's docstring).

    Args:
        task: evaluates (``evaluate``, ``select_metric``, ``select_mode``, ``metric_notes``) and writes its
            tokenizers into each checkpoint.
        cfg: the run's settings (cadences, counts, out_dir).
        parallel: the parallel strategy (what rank 0 saves, the gathers before a save).
        optimizer, scheduler, precision: the state saved in ``last/``.
        run: where the run is (read when saving, ``best`` updated by validations).
        log: rank 0's metrics log (None on the other ranks).
        config_json: the task's ``config.json`` entries.
        recipe_sections: the recipe's ``model`` / ``tokenizer`` / ``data`` sections, saved with the training state.
        resumed: the run continues ``last/`` (whose step is then already saved).
    """

    def __init__(self, task: Any, cfg: TrainConfig, parallel: Parallel, optimizer: torch.optim.Optimizer,
                 scheduler: torch.optim.lr_scheduler.LambdaLR, precision: Precision, run: RunState,
                 log: MetricsLogger | None, *, config_json: dict[str, Any], recipe_sections: dict[str, Any],
                 resumed: bool) -> None:
        self.task, self.cfg, self.parallel, self.run, self.log = task, cfg, parallel, run, log
        self.optimizer, self.scheduler, self.precision = optimizer, scheduler, precision
        self.config_json, self.recipe_sections = config_json, recipe_sections
        self.out = Path(cfg.out_dir)
        self.last = self.out / "last"
        self.saved_step: int | None = run.step if resumed else None  # the step of the training state in last/
        self.rng_by_rank: list | None = None  # every rank's RNG state, gathered just before rank 0 writes last/
        # an adapter run on a base checkpoint saves what trains alone (aiayn.checkpoint.adapter)
        self.saved_names = (set(trainable_state(task.model)) if "base" in config_json.get("adapter", {}) else None)
        self.periodic_at = time.time()  # when the last step-N/ was written (or this process started)

    def after_step(self, bar: TrainingProgress) -> None:
        """After step ``run.step`` (every rank): validate every ``eval_every`` steps and at ``max_steps`` (keeping
        ``best/``), write ``step-N/`` every ``save_every`` steps, and after either, ``last/``."""
        step, cfg, par = self.run.step, self.cfg, self.parallel
        evaluate = step % cfg.eval_every == 0 or step == cfg.max_steps
        periodic = (bool(cfg.save_every) and step % cfg.save_every == 0) or self._minutes_due()
        if not (evaluate or periodic):
            return
        self.rng_by_rank = par.gather_rng()
        par.refresh_weights()
        if par.ranks.main:
            with par.alone():
                if evaluate:
                    with par.evaluating(self.task), bar.validating(step):
                        self.validate(step)
                    par.model.train()
                if periodic:
                    self.save(self.out / f"step-{step}", with_state=False)
                    keep_last(self.out, "step-*", max(cfg.keep_checkpoints, cfg.average_last))
        if periodic:
            self.periodic_at = time.time()
        with par.alone():
            self.save(self.last, with_state=True)
        par.ranks.barrier()

    def _minutes_due(self) -> bool:
        """Whether ``train.save_every_minutes`` have passed since the last ``step-N/`` on some rank (one all-reduce
        in a data-parallel run, so that every rank takes part in the same saves)."""
        minutes = self.cfg.save_every_minutes
        if minutes is None:
            return False
        due = float(time.time() - self.periodic_at >= 60 * minutes)
        return all_sum([due], self.parallel.ranks)[0] > 0

    def finish(self) -> str | None:
        """The end of the run (every rank): validate a run that ``train.max_minutes`` stopped between validations,
        write ``last/``, then on rank 0 ``averaged/``. Returns ``averaged/``'s path when one was made."""
        par, run, cfg = self.parallel, self.run, self.cfg
        self.rng_by_rank = par.gather_rng()
        par.refresh_weights()
        if par.ranks.main and run.step < cfg.max_steps and run.step % cfg.eval_every != 0:  # stopped by max_minutes
            tqdm.write(f"step {run.step}: validating and saving before stopping")
            with par.alone(), par.evaluating(self.task):
                self.validate(run.step)
        with par.alone():
            self.save(self.last, with_state=True)
        if not par.ranks.main:
            return None
        with par.alone(), par.evaluating(self.task):
            return self._average()

    def interrupted(self, error: KeyboardInterrupt) -> None:
        """On an interrupt or a stop signal: a single-process run saves its last whole step unless ``last/`` holds
        it; rank 0 says what was saved."""
        run, ranks = self.run, self.parallel.ranks
        if ranks.world == 1 and run.step > 0 and self.saved_step != run.step:  # save the last whole step, resumable
            run.position = run.done["position"]
            restore_rng(run.done["rng"])
            tqdm.write(f"saving step {run.step} to {self.last} before stopping (Ctrl-C again to skip)")
            with contextlib.suppress(KeyboardInterrupt):  # a save cut short is rolled back: last/ stays as it was
                self.save(self.last, with_state=True)
        if ranks.main:
            saved = (f"last saved: step {self.saved_step} in {self.last}" if self.saved_step is not None
                     else "nothing saved")
            what = f"stopped by {signal_name(error.signum)}" if isinstance(error, Stopped) else "interrupted"
            tqdm.write(f"{what} at step {run.step}; {saved}")

    def save_for_stop(self, signum: int) -> None:
        """A stop signal every rank learned of after step ``run.step`` (a data-parallel run): every rank takes part
        in saving that step to ``last/``, unless ``last/`` holds it already."""
        par, run = self.parallel, self.run
        if self.saved_step == run.step:  # the same on every rank
            return
        if par.ranks.main:
            tqdm.write(f"{signal_name(signum)}: saving step {run.step} to {self.last} before stopping")
        self.rng_by_rank = par.gather_rng()
        par.refresh_weights()
        with par.alone():
            self.save(self.last, with_state=True)
        par.ranks.barrier()

    def validate(self, step: int) -> None:
        """Evaluate (rank 0, ``task.model`` being the weights to score), log the metrics, and write ``best/`` when
        the selected metric is finite and better than the best so far."""
        task, started = self.task, time.time()
        metrics = task.evaluate()
        self.log.log({"step": step, **{f"val_{k}": v for k, v in metrics.items()},
                      **getattr(task, "metric_notes", {})})
        tqdm.write("step {}: {} ({:.1f} s)".format(step, ", ".join(f"val_{k}={v:.4g}" for k, v in metrics.items()),
                                                 time.time() - started))
        value = metrics[task.select_metric]
        if (self.run.best is None or better(task, value, self.run.best["value"])) and math.isfinite(value):
            self.save(self.out / "best", with_state=False)  # then the record: a save cut short leaves both as they were
            self.run.best = {"value": value, "step": step}

    def save(self, path: Path, with_state: bool) -> None:
        """Write the checkpoint ``path`` (rank 0; every rank writes its shards into ``last/`` of a sharded run).
        ``with_state``: add the training state (``last/``)."""
        par, ranks = self.parallel, self.parallel.ranks
        sharded = with_state and par.sharded
        if not ranks.main:
            if sharded:
                save_sharded(path, par.model, self.optimizer, ranks.rank, None)
            if with_state:  # every rank knows the step of last/
                self.saved_step = self.run.step
            return
        state = self._training_state(sharded) if with_state else None
        notes = getattr(self.task, "metric_notes", None)  # how validation scores were computed (BLEU's signature)

        weights = par.weights if self.saved_names is None else {
            k: v for k, v in par.weights.state_dict().items() if k in self.saved_names}

        def files(shard_writer: Any = None) -> Path:
            return save_checkpoint(path, weights, {**self.config_json, **({"metrics": notes} if notes else {})},
                                   optimizer=self.optimizer if with_state and not sharded else None,
                                   scheduler=self.scheduler if with_state else None, train_state=state,
                                   tokenizer_writer=self.task.write_tokenizers, shard_writer=shard_writer)

        if sharded:
            save_sharded(path, par.model, self.optimizer, ranks.rank, files)
        else:
            files()
        if with_state:
            self.saved_step = self.run.step

    def _training_state(self, sharded: bool) -> dict[str, Any]:
        """What ``last/``'s ``training_state.pt`` records beside the optimizer and schedule."""
        run, ranks = self.run, self.parallel.ranks
        state: dict[str, Any] = {"step": run.step, "position": run.position, "best": run.best,
                                 "world_size": ranks.world, "parallel": self.parallel.kind, "elapsed": run.elapsed(),
                                 "train_config": self.cfg.to_dict(), "nonfinite_skipped": run.skipped}
        if sharded:
            state["sharded"] = SHARDED_FORMAT  # model and optimizer state in dcp/
        if self.recipe_sections:
            state["recipe"] = self.recipe_sections
        if self.precision.scaling:
            state["grad_scaler"] = self.precision.state_dict()
        if ranks.world > 1:
            state["rng_by_rank"] = self.rng_by_rank
        return state

    def _average(self) -> str | None:
        """``averaged/`` from the last ``train.average_last`` periodic checkpoints, evaluated and logged (rank 0,
        ``task.model`` being :attr:`Parallel.weights`, which then holds the average)."""
        cfg = self.cfg
        if not cfg.average_last:
            return None
        timed = cfg.save_every or cfg.save_every_minutes
        dirs = periodic_checkpoints(self.out)[-cfg.average_last:] if timed else []
        if len(dirs) < 2:
            tqdm.write(f"note: no averaged/: train.average_last={cfg.average_last} needs at least 2 periodic "
                       f"checkpoints, this run has {len(dirs)}"
                       + ("" if timed else " (set train.save_every or train.save_every_minutes)"))
            return None
        self.parallel.weights.load_state_dict(read_state_dict(write_average(dirs, self.out / "averaged")))
        metrics = self.task.evaluate()
        self.log.log({"step": self.run.step, "averaged_of": len(dirs), **{f"avg_{k}": v for k, v in metrics.items()}})
        report_average(self.task, dirs, metrics, self.run.best)
        return str(self.out / "averaged")


def better(task: Any, value: float, than: float) -> bool:
    """Whether validation metric ``value`` beats ``than`` (lower for a "min" task, higher for a "max" one)."""
    return value < than if task.select_mode == "min" else value > than


def report_average(task: Any, dirs: list[Path], metrics: dict[str, float], best: dict | None) -> None:
    """Print the averaged checkpoint's validation metrics, and a note where they are worse than ``best/``'s: in a
    short run the last ``average_last`` periodic checkpoints reach back to its first minutes, whose weights drag the
    average down."""
    name = task.select_metric
    tqdm.write(f"averaged {len(dirs)} checkpoints ({dirs[0].name} .. {dirs[-1].name}): "
               + ", ".join(f"val_{k}={v:.4g}" for k, v in metrics.items()))
    value = metrics[name]
    if best is not None and math.isfinite(value) and better(task, best["value"], value):
        tqdm.write(f"note: averaged/ is worse than best/ on val_{name} ({value:.4g} against {best['value']:.4g} at "
                   f"step {best['step']}): the average reaches back to {dirs[0].name}. Use best/, or average later "
                   "checkpoints: fewer (train.average_last), or `aiayn average --run RUN_DIR --last N --out DIR`")
