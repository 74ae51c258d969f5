"""The training loop shared by every task: a loop of named parts.

A *task* (translation, language modeling, classification, masked LM) supplies batches and a summed loss;
the trainer does everything else the same way for all of them. :func:`_train` builds the parts and runs them:

- the **parallel strategy** (:class:`~aiayn.train.parallel.Parallel`, :mod:`aiayn.train.parallel`): one process,
  DDP or FSDP2 (``train.parallel``); the micro-batch context, the gradient norm over the ranks, sums over the ranks,
  and the whole weights rank 0 evaluates and saves;
- the **precision** (:class:`~aiayn.train.precision.Precision`): autocast and float16 loss scaling (``train.dtype``);
- the **step** (:class:`~aiayn.train.step.TrainStep`): ``accum`` micro-batches accumulated with one divisor (the
  targets of the whole step, so accumulation equals one large batch), a mixture-of-experts model's router loss,
  non-finite steps skipped, clipping, the optimizer, schedule and scaler steps; it returns a
  :class:`~aiayn.train.step.StepRecord`;
- the **checkpoint policy** (:class:`~aiayn.train.checkpoint_policy.CheckpointPolicy`): validation every
  ``eval_every`` steps, ``best/``, ``last/`` with the training state, ``step-N/`` and ``averaged/``, and the save of
  the last whole step on an interrupt; resuming reads ``last/`` back (:mod:`aiayn.train.restore`).

The loop itself draws each step's ``accum x N`` micro-batches (N ranks; the data position is recorded after each),
runs the step, counts skipped steps (``train.max_nonfinite_steps`` in a row end the run), logs, and hands over to
the checkpoint policy, until ``train.max_steps`` or ``train.max_minutes``.

Data-parallel runs (torchrun or ``aiayn train --nproc N``; see :mod:`aiayn.train.distributed`) share the loop: each
rank computes every N-th micro-batch of a step and the engine combines the gradients once per step, so N ranks
make the updates of one process accumulating ``accum x N`` micro-batches.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn
from tqdm import tqdm

from aiayn import accel
from aiayn.checkpoint import STATE_FILE
from aiayn.errors import AiaynError
from aiayn.nn.moe import moe_load_stats
from aiayn.output_folder import check_run_files, check_run_folder
from aiayn.threads import ThreadGovernor, announce_threads, forget_start_choice, rule_for_this_run, threads_option
from aiayn.train.checkpoint_policy import CheckpointPolicy, RunState
from aiayn.train.distributed import Ranks
from aiayn.train.freeze import adapter_checkpoint_entry, add_lora_for_training, freeze_parameters
from aiayn.train.metrics_log import MetricsLogger, drop_rows_after, read_metrics
from aiayn.train.parallel import Parallel, parallelize, resolve_parallel
from aiayn.train.precision import Precision
from aiayn.train.progress import TrainingProgress
from aiayn.train.restore import check_fresh_start, fresh_run, read_last, restore_run, resumed_stream
from aiayn.train.run_lock import RunLock
from aiayn.train.step import StepRecord, TrainStep
from aiayn.train.stop_signals import Stopped, StopSignals, stop_signals
from aiayn.train.train_config import TrainConfig
from aiayn.viz.curves import plot_learning_curves

METRICS_FILE, CURVE_FILE = "metrics.jsonl", "learning_curve.png"  # beside the checkpoints in train.out_dir


class Task(Protocol):
    """What the trainer needs from a task."""

    model: nn.Module

    def batches(self, position: dict[str, Any] | None) -> Iterator[tuple[Any, dict[str, Any]]]:
        """Yield (batch, data position after this batch), starting at ``position`` (None = the beginning)."""

    def count_targets(self, batch: Any) -> int:
        """Number of targets (non-ignored labels) in a batch."""

    def loss(self, batch: Any, label_smoothing: float) -> tuple[torch.Tensor, int, dict[str, float]]:
        """(summed loss, number of targets it sums over, extra summed metrics such as nll)."""

    def evaluate(self) -> dict[str, float]:
        """Validation metrics; must include the key named by ``select_metric``."""

    def checkpoint_config(self) -> dict[str, Any]:
        """JSON dict for config.json (model config, task settings, tokenizer file names)."""

    def write_tokenizers(self, directory: Path) -> None:
        """Write tokenizer file(s) into a checkpoint directory."""

    select_metric: str
    select_mode: str  # "min" or "max"


@dataclass
class TrainResult:
    """What :func:`train` reports at the end."""

    steps: int
    best_metric: float | None
    best_dir: str | None
    last_dir: str
    wall_seconds: float
    history: list[dict[str, Any]] = field(default_factory=list)
    averaged_dir: str | None = None  # averaged/, where train.average_last made one
    trained_seconds: float = 0.0  # steps, validations and saves up to the last step: what train.max_minutes counts
    first_step: int = 0  # the step this process started from (a resumed run's checkpoint), 0 for a new run
    elapsed_before: float = 0.0  # trained_seconds of the processes before this one (a resumed run)


def train(task: Task, cfg: TrainConfig, *, resume: bool = False,
          recipe: dict[str, Any] | None = None) -> TrainResult:
    """Run (or resume) training of ``task.model`` under ``cfg``; checkpoints go to ``cfg.out_dir``.

    Layout of ``out_dir``: ``last/`` (latest, with training state), ``best/`` (best validation metric),
    ``step-N/`` (periodic, the last ``keep_checkpoints`` kept), ``averaged/`` (mean of the last
    ``average_last`` periodic checkpoints, when set), ``metrics.jsonl`` and ``learning_curve.png``.
    In a data-parallel run every rank calls this; rank 0 alone writes ``out_dir``.

    A step whose loss or gradient norm is not finite changes nothing (no optimizer, scheduler or scaler step) and
    is logged; ``train.max_nonfinite_steps`` of them in a row end the run with an error naming the last checkpoint.
    ``recipe``: the recipe's ``model`` / ``tokenizer`` / ``data`` sections, saved with the training state so that
    ``resume`` can refuse a changed model (:mod:`aiayn.train.resume`).

    Rank 0 holds ``out_dir``'s lock (:class:`~aiayn.train.run_lock.RunLock`) for the whole run: a second run into
    the same folder is refused, naming this one.

    SIGINT, SIGTERM, SIGHUP and SIGUSR1 stop the run as Ctrl-C does: the last whole step is saved to ``last/`` and
    :class:`~aiayn.train.stop_signals.Stopped` (a ``KeyboardInterrupt``) is raised; the ranks of a data-parallel run
    stop after the same step and save it together.

    Raises:
        KeyboardInterrupt: Ctrl-C, or :class:`~aiayn.train.stop_signals.Stopped` for a stop signal.
        AiaynError: a refused folder, recipe or checkpoint, or a diverged run.
    """
    ranks = Ranks.current()
    # SIGTERM, SIGHUP, SIGUSR1 and Ctrl-C save the last whole step (aiayn.train.stop_signals); a program that chose
    # no thread count gets the command's choice for the run (aiayn.threads)
    with stop_signals(deferred=ranks.world > 1) as signals, rule_for_this_run(cfg.threads):
        lock = RunLock(cfg.out_dir, say=tqdm.write) if ranks.main else None
        refusal = None
        if lock is not None:
            try:
                lock.acquire()
            except AiaynError as e:
                refusal = str(e)
        refusal = ranks.all_gather(refusal)[0] if ranks.world > 1 else refusal  # every rank stops, not only rank 0
        if refusal is not None:
            raise AiaynError(refusal)
        try:
            return _train(task, cfg, resume, recipe, ranks, signals)
        finally:
            if lock is not None:
                lock.release()


def _train(task: Task, cfg: TrainConfig, resume: bool, recipe: dict[str, Any] | None, ranks: Ranks,
           signals: StopSignals | None) -> TrainResult:
    """:func:`train` once ``out_dir`` is locked: build the parts, run the loop of steps, finish the run."""
    model = task.model
    on_cpu = next(model.parameters()).device.type == "cpu"
    _prepare(model, cfg, ranks, on_cpu)
    kind = resolve_parallel(cfg.parallel, ranks.world)
    out = Path(cfg.out_dir)
    _check_out_dir(out, ranks, resume)
    recipe_sections = {k: dict(v) for k, v in (recipe or {}).items() if k in ("model", "tokenizer", "data")}
    config_json = task.checkpoint_config()
    if cfg.adapter == "lora":  # what a reader needs to rebuild the adapted layers, and the base they adapt
        config_json["adapter"] = adapter_checkpoint_entry(model, recipe)
    resumed = read_last(task, cfg, ranks, kind, config_json, recipe_sections) if resume else None
    if resumed is None:
        check_fresh_start(task, out, kind, ranks)
    par = parallelize(task, kind, ranks, cfg, on_cpu=on_cpu)
    precision = Precision(cfg.dtype, next(model.parameters()).device.type)
    step = TrainStep.build(task, par, precision, cfg)
    run = (restore_run(resumed, model, step.optimizer, step.scheduler, precision, cfg, ranks) if resumed
           else fresh_run(cfg, ranks))
    log = _open_log(out, ranks, resume, run.step)
    policy = CheckpointPolicy(task, cfg, par, step.optimizer, step.scheduler, precision, run, log,
                              config_json=config_json, recipe_sections=recipe_sections, resumed=resume)
    run.started, first_step = time.time(), run.step
    stream = task.batches(run.position)
    if resumed is not None:
        stream = resumed_stream(stream, resumed.last / STATE_FILE)
    bar = TrainingProgress(cfg.max_steps, cfg.max_minutes, run.step, run.elapsed_before, cfg.progress and ranks.main)
    window = _Window()
    model.train()
    # threads from the cores other processes leave free and the step's size, re-checked (aiayn.threads)
    governor = ThreadGovernor(model, enabled=on_cpu and not cfg.threads and ranks.local_world == 1, say=tqdm.write)
    stop = cfg.max_minutes is not None and run.elapsed_before / 60 >= cfg.max_minutes  # the same on every rank
    run.mark_done()
    stops = signals.pending if signals is not None and signals.deferred else list  # the ranks' stop signals
    held = signals.held if signals is not None else contextlib.nullcontext
    try:
        while run.step < cfg.max_steps and not stop:
            micro = _draw(stream, cfg.accum * ranks.world, run)
            record = step(micro, late=lambda: _out_of_time(cfg, run), stops=stops)
            stop = record.late
            if record.problem is not None:
                _skipped(record, run, cfg, policy)
            else:
                with held():  # a stop signal waits: the update and its count happen together or not at all
                    step.update()
                    run.step, run.in_a_row = run.step + 1, 0
                    run.mark_done()
                governor.after_step(record.targets)
                window.add(record)
                bar.update(run.step)
                if ranks.main and (run.step % cfg.log_every == 0 or run.step == cfg.max_steps):
                    window.log(record, run, step, par, log, bar)
                policy.after_step(bar)
            if record.stop is not None:  # every rank received or learned of a stop signal with this step's sums
                bar.close()
                policy.save_for_stop(record.stop)
                raise Stopped(record.stop)
    except KeyboardInterrupt as e:
        bar.close()
        policy.interrupted(e)
        raise
    except AiaynError:
        bar.close()
        raise
    bar.close()
    return _finish(cfg, par, policy, run, log, first_step)


def _prepare(model: nn.Module, cfg: TrainConfig, ranks: Ranks, on_cpu: bool) -> None:
    """Before anything is built: the thread count, the frozen parameters and the accelerator."""
    if cfg.threads and threads_option() is None:  # aiayn --threads N wins over train.threads
        torch.set_num_threads(cfg.threads)
        forget_start_choice()
    elif ranks.local_world > 1 and on_cpu:  # share the cores instead of oversubscribing them
        torch.set_num_threads(max(1, torch.get_num_threads() // ranks.local_world))
    if ranks.main:
        announce_threads()  # the command's start-up choice, said now that the recipe is known to be good
    if cfg.adapter == "lora":  # before the optimizer, which then takes the adapters' parameters only
        adapters = add_lora_for_training(model, cfg)
        if ranks.main:
            total = sum(p.numel() for p in model.parameters())
            trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
            tqdm.write(f"LoRA: rank {cfg.lora_rank} adapters on {len(adapters)} layers; {trained:,} of {total:,} "
                       f"parameters train ({100 * trained / total:.2f}%)")
    if cfg.freeze:  # before the optimizer, which then leaves the frozen parameters out
        frozen = freeze_parameters(model, cfg.freeze)
        if ranks.main:
            tqdm.write(f"frozen: {len(frozen)} parameter tensors ({', '.join(cfg.freeze)})")
    # the one place training applies an accelerator; compiled layers are the reference modules, fused by inductor
    accel.accelerate(model, "train", "none" if cfg.compile else cfg.accel)


def _check_out_dir(out: Path, ranks: Ranks, resume: bool) -> None:
    """Refuse, before any work, a folder of the user's and folders where the run writes its files."""
    if ranks.main:  # a folder of the user's, not a run's, is never written into
        check_run_files(out) if resume else check_run_folder(out)


def _open_log(out: Path, ranks: Ranks, resume: bool, step: int) -> MetricsLogger | None:
    """Rank 0's metrics log (None on the other ranks); a resumed run drops the rows of the steps it makes again."""
    if not ranks.main:
        return None
    out.mkdir(parents=True, exist_ok=True)
    if resume:
        drop_rows_after(out / METRICS_FILE, step)
    return MetricsLogger(out / METRICS_FILE)


def _draw(stream: Iterator[tuple[Any, dict[str, Any]]], n: int, run: RunState) -> list[Any]:
    """The next ``n`` micro-batches of the stream; ``run.position`` follows each."""
    micro = []
    for _ in range(n):
        batch, run.position = next(stream)
        micro.append(batch)
    return micro


def _out_of_time(cfg: TrainConfig, run: RunState) -> bool:
    """Whether ``train.max_minutes`` is spent."""
    return cfg.max_minutes is not None and run.elapsed() / 60 >= cfg.max_minutes


def _skipped(record: StepRecord, run: RunState, cfg: TrainConfig, policy: CheckpointPolicy) -> None:
    """Count and log a step whose update was skipped; end the run after ``train.max_nonfinite_steps`` in a row.

    Raises:
        AiaynError: the run diverged (naming the last checkpoint).
    """
    run.skipped, run.in_a_row = run.skipped + 1, run.in_a_row + 1
    if policy.log is not None:
        tqdm.write(f"step {run.step + 1}: {record.problem}; update skipped ({run.in_a_row} in a row, {run.skipped} "
                   "in this run's history)")
        policy.log.log({"step": run.step + 1, "skipped_update": record.problem, "nonfinite_skipped": run.skipped})
    if run.in_a_row >= cfg.max_nonfinite_steps:
        raise AiaynError(_diverged_message(cfg, run.step + 1, run.in_a_row, policy.out, policy.saved_step))
    run.mark_done()


class _Window:
    """Rank 0's running sums of the steps since the last ``train_*`` row of the metrics log."""

    def __init__(self) -> None:
        self._start(time.time())

    def _start(self, now: float) -> None:
        self.loss, self.nll, self.moe, self.tokens, self.time = 0.0, 0.0, 0.0, 0, now

    def add(self, record: StepRecord) -> None:
        self.loss += record.loss
        self.nll += record.nll
        self.moe += record.moe
        self.tokens += record.targets

    def log(self, record: StepRecord, run: RunState, step: TrainStep, par: Parallel, log: MetricsLogger,
            bar: TrainingProgress) -> None:
        """Write the window's row (per-target means, learning rate, speed, the last step's gradient norm) and
        start a new window."""
        now, tokens = time.time(), max(self.tokens, 1)
        row = {"step": run.step, "train_loss": self.loss / tokens, "train_nll": self.nll / tokens,
               "lr": step.optimizer.param_groups[0]["lr"], "tokens_per_s": self.tokens / (now - self.time),
               "grad_norm": record.grad_norm, "elapsed_s": run.elapsed_before + now - run.started}
        if par.moe_weights is not None:  # the weighted router losses per target, the last forward pass's loads
            row["moe_loss"] = self.moe / tokens
            row.update(moe_load_stats(par.model))
        if step.precision.scaling:
            row["loss_scale"] = step.precision.loss_scale()
        if run.skipped:
            row["nonfinite_skipped"] = run.skipped
        log.log(row)
        smoothing = step.cfg.label_smoothing  # val_loss has none: the nll is the number to set beside it
        loss, nll = f"{row['train_loss']:.3f}", f"{row['train_nll']:.3f}"
        losses = {f"loss (label smoothing {smoothing:g})": loss, "nll": nll} if smoothing else {"loss": loss}
        bar.set_postfix(**losses, lr=f"{row['lr']:.2e}", tok_s=f"{row['tokens_per_s']:.0f}")
        self._start(now)


def _finish(cfg: TrainConfig, par: Parallel, policy: CheckpointPolicy, run: RunState,
            log: MetricsLogger | None, first_step: int) -> TrainResult:
    """The end of the run: say what stopped it early, the checkpoint policy's last saves, the learning curve."""
    ranks, out = par.ranks, policy.out
    trained_seconds = run.elapsed()  # what train.max_minutes counts
    if ranks.main and run.step < cfg.max_steps:
        tqdm.write(f"stopped by train.max_minutes={cfg.max_minutes:g} at step {run.step} of max_steps "
                   f"{cfg.max_steps} ({trained_seconds / 60:.1f} min of steps, validations and saves; start-up "
                   "before them and the last validation and save after them are not counted); to go on, raise "
                   "train.max_minutes and pass --resume")
    accel.release_workspace()  # the accelerator's training buffers, no longer needed
    averaged_dir = policy.finish()
    if log is not None:
        log.close()
    ranks.barrier()
    history = read_metrics(out / METRICS_FILE) if ranks.main else []
    if ranks.main:
        _plot(history, out)
    best = run.best
    return TrainResult(run.step, None if best is None else best["value"], str(out / "best") if best else None,
                       str(out / "last"), run.elapsed(), history, averaged_dir, trained_seconds, first_step,
                       run.elapsed_before)


def _diverged_message(cfg: TrainConfig, step: int, count: int, out: Path, saved_step: int | None) -> str:
    """The error that ends a run after ``count`` non-finite steps in a row."""
    where = ("no checkpoint was written" if saved_step is None
             else f"the last checkpoint, with finite weights, is {out / 'last'} (step {saved_step})")
    return (f"training diverged: {count} tries in a row at step {step}, each on new batches, had a non-finite loss "
            f"or gradient norm and were skipped (train.max_nonfinite_steps={cfg.max_nonfinite_steps}); {where}. "
            f"Lower train.lr (now {cfg.lr:g}), "
            "raise train.warmup or set train.clip_norm, then continue with --resume or start again")


def _plot(history: list[dict[str, Any]], out: Path) -> None:
    try:
        plot_learning_curves(history, out / CURVE_FILE, ys=("train_nll", "val_loss"),
                             title="per-token NLL (train: running mean, no label smoothing)")
    except AiaynError as e:  # matplotlib missing: training results still stand
        tqdm.write(f"note: {e}")
