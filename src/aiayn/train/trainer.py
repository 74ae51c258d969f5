"""The training loop shared by every task: accumulation, clipping, schedules, evaluation, checkpoints, resume.

A *task* (translation, language modeling, classification, masked LM) supplies batches and a summed loss;
the trainer does everything else the same way for all of them:

    for each optimizer step:
        draw `accum` micro-batches (the data position is recorded after each)
        loss = sum over micro-batches of loss_sum / (target tokens in ALL micro-batches)
               (a mixture-of-experts model adds its weighted router losses, a mean over each micro-batch's
               tokens, times the micro-batch's target count, to its loss_sum)
        backward, clip, optimizer step, schedule step (float16: with dynamic loss scaling)
        log; every `eval_every` steps evaluate, keep best and last checkpoints

Dividing every micro-batch's summed loss by the token count of the whole accumulated batch makes k
accumulated batches give exactly the update of one batch of their union, whatever their lengths.

Data-parallel runs (torchrun or ``aiayn train --nproc N``; see :mod:`aiayn.train.distributed`) share the loop:
each step draws ``accum x N`` micro-batches, each rank computes every N-th, and DDP or FSDP2
(:mod:`aiayn.train.parallel`, ``train.parallel``) combines the gradients once per step, so N ranks make the
updates of one process accumulating ``accum x N`` micro-batches. A sharded run's ``last/`` holds its model and
optimizer shards in ``dcp/`` (:mod:`aiayn.train.dcp_checkpoint`), and resumes on any number of ranks.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn
from tqdm import tqdm

from aiayn import accel
from aiayn.errors import AiaynError
from aiayn.nn.moe import moe_load_stats
from aiayn.output_folder import check_run_folder
from aiayn.threads import ThreadGovernor, announce_threads, forget_start_choice, threads_option
from aiayn.train.checkpoint import (
    STATE_FILE,
    capture_rng,
    keep_last,
    load_config,
    load_model_state,
    load_training_state,
    periodic_checkpoints,
    read_state_dict,
    recover_checkpoint,
    restore_rng,
    save_checkpoint,
    write_average,
)
from aiayn.train.dcp_checkpoint import (
    full_model_state,
    load_sharded,
    optimizer_state_by_name,
    save_sharded,
    set_full_optimizer_state,
)
from aiayn.train.distributed import Ranks, all_sum, broadcast_parameters, check_same_files
from aiayn.train.freeze import freeze_parameters
from aiayn.train.metrics_log import MetricsLogger, drop_rows_after, read_metrics
from aiayn.train.optim import build_optimizer
from aiayn.train.parallel import Parallel, prepare_model, resolve_parallel, wrap
from aiayn.train.progress import TrainingProgress
from aiayn.train.resume import SHARDED_FORMAT, check_same_run, restore_rank_rng, validate_training_state
from aiayn.train.run_lock import RunLock
from aiayn.train.schedules import build_scheduler
from aiayn.train.train_config import TrainConfig

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


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    """``auto`` -> CUDA when available, else CPU. A CUDA device without an index becomes ``cuda:local_rank``, so
    each rank of a data-parallel run on one machine gets its own GPU."""
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank)
    return device


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
    """
    ranks = Ranks.current()
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
        return _train(task, cfg, resume, recipe, ranks)
    finally:
        if lock is not None:
            lock.release()


def _train(task: Task, cfg: TrainConfig, resume: bool, recipe: dict[str, Any] | None, ranks: Ranks) -> TrainResult:
    """:func:`train` once ``out_dir`` is locked."""
    model = task.model
    on_cpu = next(model.parameters()).device.type == "cpu"
    if cfg.threads and threads_option() is None:  # aiayn --threads N wins over train.threads
        torch.set_num_threads(cfg.threads)
        forget_start_choice()
    elif ranks.local_world > 1 and on_cpu:  # share the cores instead of oversubscribing them
        torch.set_num_threads(max(1, torch.get_num_threads() // ranks.local_world))
    if ranks.main:
        announce_threads()  # the command's start-up choice, said now that the recipe is known to be good
    if cfg.freeze:  # before the optimizer, which then leaves the frozen parameters out
        frozen = freeze_parameters(model, cfg.freeze)
        if ranks.main:
            tqdm.write(f"frozen: {len(frozen)} parameter tensors ({', '.join(cfg.freeze)})")
    kind = resolve_parallel(cfg.parallel, ranks.world)
    # the one place training applies an accelerator; compiled layers are the reference modules, fused by inductor
    accel.accelerate(model, "train", "none" if cfg.compile else cfg.accel)
    out = Path(cfg.out_dir)
    last = out / "last"
    if ranks.main and not resume:
        check_run_folder(out)  # a folder of the user's, not a run's, is never written into
    for name in (METRICS_FILE, CURVE_FILE):  # files the run writes, refused now rather than after training
        if ranks.main and (out / name).is_dir():
            raise AiaynError(f"{out / name}: is a folder, where training writes its {name} file; remove or rename "
                             "the folder, or choose another train.out_dir")
    recipe_sections = {k: dict(v) for k, v in (recipe or {}).items() if k in ("model", "tokenizer", "data")}
    config_json = task.checkpoint_config()
    state, changes, by_name = None, [], None
    if resume:
        if ranks.main:
            recover_checkpoint(last, say=tqdm.write)  # a save killed between its renames left last.old only
        ranks.barrier()
        state = _resume_state(last, cfg)
        probe = _optimizer(model, cfg)  # an optimizer as this run builds it, for the checks and the conversion
        validate_training_state(state, last / STATE_FILE, probe)
        changes = check_same_run(last, load_config(last), config_json, state.get("recipe"),
                                 recipe_sections or None, state.get("train_config"), _plain(asdict(cfg)))
        load_model_state(last, model)  # the full weights, before any sharding
        if kind == "fsdp" and state.get("sharded") != SHARDED_FORMAT:  # a replicated run's optimizer, by name
            by_name = optimizer_state_by_name(model, probe, state["optimizer"])
    else:
        if last.exists() or (out / "last.old").exists():
            raise AiaynError(f"{out}: already holds a training run; pass --resume to continue it, "
                             "or choose another train.out_dir")
        check_same_files(task.write_tokenizers, ranks, "tokenizers")
        if kind == "fsdp":  # every rank shards the same weights (DDP copies rank 0's itself)
            broadcast_parameters(model, ranks)
    # what rank 0 evaluates and saves: the model, or under FSDP a whole copy refreshed from the shards
    weights = copy.deepcopy(model) if kind == "fsdp" and ranks.main else model
    prepare_model(model, cfg.activation_checkpointing, cfg.compile)
    moe_weights = _moe_weights(model)  # (load-balancing, z-loss) weights of a mixture-of-experts model, else None
    par = wrap(task, kind, ranks, dtype=cfg.dtype, cpu_offload=cfg.fsdp_cpu_offload, moe_weights=moe_weights)
    optimizer = _optimizer(model, cfg)
    sched_kw: dict[str, Any] = {"warmup": cfg.warmup}
    if cfg.schedule == "inverse_sqrt_warmup":
        sched_kw["d_model"] = model.config.d_model
    elif cfg.schedule == "warmup_cosine":
        sched_kw.update(total=cfg.max_steps, min_ratio=cfg.min_lr_ratio)
    scheduler = build_scheduler(optimizer, cfg.schedule, **sched_kw)
    # float16 gradients underflow without loss scaling; bfloat16 has float32's range and needs none
    scaler = torch.amp.GradScaler(next(model.parameters()).device.type, enabled=cfg.dtype == "float16")

    step, position, best, elapsed_before, skipped = 0, None, None, 0.0, 0
    if state is not None:
        settings = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
        if state.get("sharded") == SHARDED_FORMAT:
            load_sharded(last, model, optimizer)  # resharded to this run's ranks
        elif by_name is not None:
            set_full_optimizer_state(model, optimizer, by_name)
        else:
            optimizer.load_state_dict(state["optimizer"])
        _continue_schedule(optimizer, scheduler, settings, state["scheduler"])
        step, position, best = state["step"], state["position"], state["best"]
        skipped = state.get("nonfinite_skipped", 0)
        if scaler.is_enabled() and "grad_scaler" in state:
            scaler.load_state_dict(state["grad_scaler"])
        elapsed_before = state.get("elapsed", 0.0)
        if step >= cfg.max_steps:
            raise AiaynError(f"{last}: the run is at step {step}, and train.max_steps is {cfg.max_steps}: nothing to "
                             f"train; raise train.max_steps (e.g. train.max_steps={step + cfg.max_steps}) to go on")
        try:
            changes += restore_rank_rng(state, ranks, cfg.seed, cfg.accum)
        except (RuntimeError, ValueError, TypeError, KeyError, IndexError) as e:
            raise AiaynError(f"{last / STATE_FILE}: its random-number generator state is damaged ({e}); restore "
                             "the file, or start a new run in another train.out_dir") from None
        if ranks.main:
            epoch = f", epoch {position['epoch'] + 1}" if isinstance(position.get("epoch"), int) else ""
            tqdm.write(f"resuming from step {step}{epoch} ({last}, {elapsed_before / 60:.1f} min trained)"
                       + "".join(f"\n  changed: {c}" for c in changes))
    else:
        torch.manual_seed(cfg.seed + ranks.rank)  # each rank its own dropout masks; rank 0 as a single process
    if ranks.main:
        out.mkdir(parents=True, exist_ok=True)
    if ranks.main and resume:
        drop_rows_after(out / METRICS_FILE, step)  # rows of steps this run makes again
    log = MetricsLogger(out / METRICS_FILE) if ranks.main else None
    rng_by_rank: list | None = None  # every rank's RNG state, gathered just before rank 0 writes last/

    def gather_rng() -> list | None:  # a collective: every rank calls it at the same steps
        return ranks.all_gather(capture_rng()) if ranks.world > 1 else None

    def refresh_weights() -> None:  # a collective under FSDP: the shards, gathered into rank 0's whole copy
        if par.sharded:
            full = full_model_state(model)
            if ranks.main:
                weights.load_state_dict(full)

    def save(path: Path, with_state: bool) -> None:  # rank 0 (and, for last/ of a sharded run, every rank)
        if not ranks.main:
            if with_state and par.sharded:
                save_sharded(path, model, optimizer, ranks.rank, None)
            return
        state = None
        sharded = with_state and par.sharded
        if with_state:
            state = {"step": step, "position": position, "best": best, "world_size": ranks.world,
                     "parallel": kind, "elapsed": elapsed_before + time.time() - t0,
                     "train_config": _plain(asdict(cfg)), "nonfinite_skipped": skipped}
            if sharded:
                state["sharded"] = SHARDED_FORMAT  # model and optimizer state in dcp/
            if recipe_sections:
                state["recipe"] = recipe_sections
            if scaler.is_enabled():
                state["grad_scaler"] = scaler.state_dict()
            if ranks.world > 1:
                state["rng_by_rank"] = rng_by_rank
        notes = getattr(task, "metric_notes", None)  # how validation scores were computed (BLEU's signature)

        def files(shard_writer=None) -> Path:
            return save_checkpoint(path, weights, {**config_json, **({"metrics": notes} if notes else {})},
                                   optimizer=optimizer if with_state and not sharded else None,
                                   scheduler=scheduler if with_state else None, train_state=state,
                                   tokenizer_writer=task.write_tokenizers, shard_writer=shard_writer)

        if sharded:
            save_sharded(path, model, optimizer, ranks.rank, files)
        else:
            files()
        if with_state:
            saved_at["step"] = step

    def out_of_time() -> bool:
        return cfg.max_minutes is not None and (elapsed_before + time.time() - t0) / 60 >= cfg.max_minutes

    saved_at = {"step": step if resume else None}  # the step of the training state in last/
    t0 = time.time()
    stream = _resumed(task.batches(position), last / STATE_FILE) if resume else task.batches(position)
    bar = TrainingProgress(cfg.max_steps, cfg.max_minutes, step, elapsed_before, cfg.progress and ranks.main)
    window = {"loss": 0.0, "nll": 0.0, "moe": 0.0, "tokens": 0, "time": time.time()}
    model.train()
    # threads from the cores other processes leave free and the step's size, re-checked (aiayn.threads)
    governor = ThreadGovernor(model, enabled=on_cpu and not cfg.threads and ranks.local_world == 1, say=tqdm.write)
    stop = cfg.max_minutes is not None and elapsed_before / 60 >= cfg.max_minutes  # the same on every rank
    bad_in_row = 0  # consecutive steps with a non-finite loss or gradient norm
    done = {"position": position, "rng": capture_rng()}  # after the last whole step: what an interrupt saves
    try:
        while step < cfg.max_steps and not stop:
            micro = []
            for _ in range(cfg.accum * ranks.world):
                batch, position = next(stream)
                micro.append(batch)
            optimizer.zero_grad(set_to_none=True)
            loss_total, nll_total, moe_total = 0.0, 0.0, 0.0
            total_targets = sum(task.count_targets(b) for b in micro)  # the divisor for every micro-batch
            mine = micro[ranks.rank::ranks.world]
            for i, batch in enumerate(mine):
                with par.micro_batch(last=i == len(mine) - 1):  # DDP/FSDP: gradients synchronized after the last
                    with _autocast(cfg.dtype, model):
                        loss_sum, n_targets, extra, router = par.loss_module(batch, cfg.label_smoothing)
                    # each rank's share of the step's mean; the engines average over ranks (loss_scale undoes it)
                    divisor = max(total_targets, 1) / par.loss_scale
                    if router is not None:  # a mean over the micro-batch's tokens, weighted as its targets are
                        router_sum = router.float() * n_targets
                        scaler.scale((loss_sum + router_sum) / divisor).backward()
                        moe_total += float(router_sum.detach())  # read after backward is queued: no extra wait
                    else:
                        scaler.scale(loss_sum / divisor).backward()
                value = float(loss_sum.detach())
                loss_total += value
                nll_total += extra.get("nll", value)
            stop = out_of_time()
            if ranks.world > 1:  # the ranks' losses summed; stop when any rank is out of time
                loss_total, nll_total, moe_total, late = all_sum([loss_total, nll_total, moe_total, float(stop)],
                                                                 ranks)
                stop = late > 0
            grad_norm = None
            problem = None if math.isfinite(loss_total) else f"non-finite loss ({loss_total})"
            if problem is None and not math.isfinite(moe_total):
                problem = f"non-finite router loss ({moe_total})"
            if problem is None:
                scaler.unscale_(optimizer)  # a no-op unless float16 loss scaling is on
                grad_norm = _grad_norm(par, model, cfg.clip_norm)
                if not math.isfinite(grad_norm):
                    grad_norm = None
                    if not scaler.is_enabled():  # float16: an overflow, which the scaler skips and scales down
                        problem = "non-finite gradient norm"
            if problem is not None:  # nothing changes: no optimizer, scheduler or scaler step
                skipped, bad_in_row = skipped + 1, bad_in_row + 1
                optimizer.zero_grad(set_to_none=True)
                if ranks.main:
                    tqdm.write(f"step {step + 1}: {problem}; update skipped ({bad_in_row} in a row, {skipped} in "
                               "this run's history)")
                    log.log({"step": step + 1, "skipped_update": problem, "nonfinite_skipped": skipped})
                if bad_in_row >= cfg.max_nonfinite_steps:
                    raise AiaynError(_diverged_message(cfg, step + 1, bad_in_row, out, saved_at["step"]))
                done = {"position": position, "rng": capture_rng()}
                continue
            bad_in_row = 0
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            step += 1
            done = {"position": position, "rng": capture_rng()}
            governor.after_step(total_targets)
            window["loss"] += loss_total
            window["nll"] += nll_total
            window["moe"] += moe_total
            window["tokens"] += total_targets
            bar.update(step)
            if ranks.main and (step % cfg.log_every == 0 or step == cfg.max_steps):
                now = time.time()
                rec = {"step": step, "train_loss": window["loss"] / max(window["tokens"], 1),
                       "train_nll": window["nll"] / max(window["tokens"], 1),
                       "lr": optimizer.param_groups[0]["lr"],
                       "tokens_per_s": window["tokens"] / (now - window["time"]),
                       "grad_norm": grad_norm, "elapsed_s": elapsed_before + now - t0}
                if moe_weights is not None:  # the weighted router losses per target, the last forward pass's loads
                    rec["moe_loss"] = window["moe"] / max(window["tokens"], 1)
                    rec.update(moe_load_stats(model))
                if scaler.is_enabled():
                    rec["loss_scale"] = scaler.get_scale()
                if skipped:
                    rec["nonfinite_skipped"] = skipped
                log.log(rec)
                bar.set_postfix(loss=f"{rec['train_loss']:.3f}", lr=f"{rec['lr']:.2e}",
                                tok_s=f"{rec['tokens_per_s']:.0f}")
                window = {"loss": 0.0, "nll": 0.0, "moe": 0.0, "tokens": 0, "time": now}
            evaluate = step % cfg.eval_every == 0 or step == cfg.max_steps
            periodic = bool(cfg.save_every) and step % cfg.save_every == 0
            if evaluate or periodic:
                rng_by_rank = gather_rng()
                refresh_weights()
            if ranks.main:
                with _all_cores(ranks, on_cpu):
                    if evaluate:
                        with _evaluating(task, weights), bar.validating(step):
                            best = _evaluate_and_keep(task, step, best, log, out, save)
                        model.train()
                    if periodic:
                        save(out / f"step-{step}", with_state=False)
                        keep_last(out, "step-*", max(cfg.keep_checkpoints, cfg.average_last))
            if evaluate or periodic:
                with _all_cores(ranks, on_cpu):
                    save(last, with_state=True)
                ranks.barrier()
    except KeyboardInterrupt:
        bar.close()
        if ranks.world == 1 and step > 0 and saved_at["step"] != step:  # save the last whole step, resumable
            position = done["position"]
            restore_rng(done["rng"])
            tqdm.write(f"saving step {step} to {last} before stopping (interrupt again to skip)")
            with contextlib.suppress(KeyboardInterrupt):  # a save cut short is rolled back: last/ stays as it was
                save(last, with_state=True)
        if ranks.main:
            saved = (f"last saved: step {saved_at['step']} in {last}" if saved_at["step"] is not None
                     else "nothing saved")
            tqdm.write(f"interrupted at step {step}; {saved}")
        raise
    except AiaynError:
        bar.close()
        raise
    bar.close()
    trained_seconds = elapsed_before + time.time() - t0  # what train.max_minutes counts
    if ranks.main and step < cfg.max_steps:
        tqdm.write(f"stopped by train.max_minutes={cfg.max_minutes:g} at step {step} of max_steps "
                   f"{cfg.max_steps} ({trained_seconds / 60:.1f} min of steps, validations and saves; start-up "
                   "before them and the last validation and save after them are not counted); to go on, raise "
                   "train.max_minutes and pass --resume")
    accel.release_workspace()  # the accelerator's training buffers, no longer needed
    rng_by_rank = gather_rng()
    refresh_weights()
    averaged_dir = None
    if ranks.main and step < cfg.max_steps and step % cfg.eval_every != 0:  # stopped by max_minutes
        tqdm.write(f"step {step}: validating and saving before stopping")
        with _all_cores(ranks, on_cpu), _evaluating(task, weights):
            best = _evaluate_and_keep(task, step, best, log, out, save)
    with _all_cores(ranks, on_cpu):
        save(last, with_state=True)
    if ranks.main:
        with _all_cores(ranks, on_cpu), _evaluating(task, weights):
            if cfg.average_last:
                dirs = periodic_checkpoints(out)[-cfg.average_last:] if cfg.save_every else []
                if len(dirs) < 2:
                    tqdm.write(f"note: no averaged/: train.average_last={cfg.average_last} needs at least 2 periodic "
                               f"checkpoints, this run has {len(dirs)}"
                               + ("" if cfg.save_every else " (set train.save_every)"))
                else:
                    weights.load_state_dict(read_state_dict(write_average(dirs, out / "averaged")))
                    metrics = task.evaluate()
                    log.log({"step": step, "averaged_of": len(dirs),
                             **{f"avg_{k}": v for k, v in metrics.items()}})
                    averaged_dir = str(out / "averaged")
                    _report_average(task, dirs, metrics, best)
        log.close()
    ranks.barrier()
    history = read_metrics(out / METRICS_FILE) if ranks.main else []
    if ranks.main:
        _plot(history, out)
    return TrainResult(step, None if best is None else best["value"], str(out / "best") if best else None,
                       str(out / "last"), elapsed_before + time.time() - t0, history, averaged_dir,
                       trained_seconds)


def _resumed(stream: Iterator, file: Path) -> Iterator[tuple[Any, Any]]:
    """A task's (batch, position) stream started at a saved position: a position that does not fit the data, or
    a damaged sampler state, is an error naming the training state ``file`` when the first batch is drawn."""
    try:
        first = next(stream)
    except (KeyError, TypeError, IndexError, ValueError, RuntimeError, AiaynError) as e:
        raise AiaynError(f"{file}: its data position does not fit this run's data or is damaged ({e}); resume "
                         "with the original data, or start a new run in another train.out_dir") from None
    yield first
    yield from stream


def _grad_norm(par: Parallel, model: nn.Module, clip_norm: float | None) -> float:
    """The gradients' total 2-norm over every rank, clipped to ``clip_norm`` when set (inf or nan when a gradient is
    not finite)."""
    return par.grad_norm(list(model.parameters()), clip_norm)


def _optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """The optimizer ``train.optimizer`` names over ``model``'s trainable parameters (fused where supported)."""
    return build_optimizer(model, cfg.optimizer, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                           weight_decay=cfg.weight_decay)


def _continue_schedule(optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR,
                       settings: list[dict[str, Any]], saved: dict[str, Any]) -> None:
    """Continue a resumed run under this run's ``[train]`` settings: the optimizer keeps its loaded moments but
    takes this run's hyper-parameters (``settings``: lr, betas, eps, weight decay per group), and the schedule
    keeps only its position (``last_epoch``) from ``saved``, so a changed lr, warmup, schedule or max_steps
    applies from the first resumed step."""
    for group, mine in zip(optimizer.param_groups, settings):
        group.update(mine)
    scheduler.load_state_dict({**saved, "lr_lambdas": [None] * len(scheduler.lr_lambdas),
                               "base_lrs": [g["initial_lr"] for g in optimizer.param_groups]})
    lrs = [base * f(scheduler.last_epoch) for base, f in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
    for group, lr in zip(optimizer.param_groups, lrs):
        group["lr"] = lr
    scheduler._last_lr = lrs  # what get_last_lr() reports until the next step


def _resume_state(last: Path, cfg: TrainConfig) -> dict[str, Any]:
    """``last/``'s training state, refused when absent or when it was trained with another freeze list."""
    state = load_training_state(last)
    if state is None:
        raise AiaynError(f"{last}: no training state to resume from; train without --resume first")
    saved_train = state.get("train_config")
    saved_freeze = saved_train.get("freeze") if isinstance(saved_train, dict) else None
    if list(saved_freeze or []) != list(cfg.freeze or []):
        raise AiaynError(f"{last}: the run was trained with train.freeze={saved_freeze!r}, this one has "
                         f"{cfg.freeze!r}; the optimizer's state fits only the same trainable parameters: "
                         "resume with the original freeze list, or start a new run in another train.out_dir")
    return state


@contextlib.contextmanager
def _evaluating(task: Task, weights: nn.Module):
    """While rank 0 evaluates or averages: ``task.model`` is ``weights`` (under FSDP, the whole copy)."""
    model = task.model
    task.model = weights
    try:
        yield
    finally:
        task.model = model


def _diverged_message(cfg: TrainConfig, step: int, count: int, out: Path, saved_step: int | None) -> str:
    """The error that ends a run after ``count`` non-finite steps in a row."""
    where = ("no checkpoint was written" if saved_step is None
             else f"the last checkpoint, with finite weights, is {out / 'last'} (step {saved_step})")
    return (f"training diverged: {count} tries in a row at step {step}, each on new batches, had a non-finite loss "
            f"or gradient norm and were skipped (train.max_nonfinite_steps={cfg.max_nonfinite_steps}); {where}. "
            f"Lower train.lr (now {cfg.lr:g}), "
            "raise train.warmup or set train.clip_norm, then continue with --resume or start again")


def _moe_weights(model: nn.Module) -> tuple[float, float] | None:
    """The (load-balancing, z-loss) weights of a mixture-of-experts model (``ffn="moe"``), else None."""
    config = getattr(model, "config", None)
    if getattr(config, "ffn", "dense") != "moe":
        return None
    return config.moe_aux_loss_weight, config.moe_z_loss_weight


def _report_average(task: Task, dirs: list[Path], metrics: dict[str, float], best: dict | None) -> None:
    """Print the averaged checkpoint's validation metrics, and a note where they are worse than ``best/``'s: in a
    short run the last ``average_last`` periodic checkpoints reach back to its first minutes, whose weights drag the
    average down."""
    name = task.select_metric
    tqdm.write(f"averaged {len(dirs)} checkpoints ({dirs[0].name} .. {dirs[-1].name}): "
               + ", ".join(f"val_{k}={v:.4g}" for k, v in metrics.items()))
    value = metrics[name]
    if best is not None and math.isfinite(value) and _better(task, best["value"], value):
        tqdm.write(f"note: averaged/ is worse than best/ on val_{name} ({value:.4g} against {best['value']:.4g} at "
                   f"step {best['step']}): the average reaches back to {dirs[0].name}. Use best/, or average later "
                   "checkpoints: fewer (train.average_last), or `aiayn average --run RUN_DIR --last N --out DIR`")


@contextlib.contextmanager
def _all_cores(ranks: Ranks, on_cpu: bool):
    """While rank 0 evaluates or saves alone, let it use the threads of the ranks waiting on its machine."""
    if ranks.local_world == 1 or not on_cpu or not ranks.main:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(before * ranks.local_world)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _better(task: Task, value: float, than: float) -> bool:
    """Whether validation metric ``value`` beats ``than`` (lower for a "min" task, higher for a "max" one)."""
    return value < than if task.select_mode == "min" else value > than


def _evaluate_and_keep(task: Task, step: int, best: dict | None, log: MetricsLogger, out: Path, save) -> dict:
    started = time.time()
    metrics = task.evaluate()
    log.log({"step": step, **{f"val_{k}": v for k, v in metrics.items()}, **getattr(task, "metric_notes", {})})
    tqdm.write("step {}: {} ({:.1f} s)".format(step, ", ".join(f"val_{k}={v:.4g}" for k, v in metrics.items()),
                                             time.time() - started))
    value = metrics[task.select_metric]
    better = best is None or _better(task, value, best["value"])
    if better and math.isfinite(value):
        best = {"value": value, "step": step}
        save(out / "best", with_state=False)
    return best


def _autocast(dtype: str, model: nn.Module):
    if dtype == "float32":
        return contextlib.nullcontext()
    device_type = next(model.parameters()).device.type
    return torch.autocast(device_type, dtype=getattr(torch, dtype))


def _plain(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in d.items()}


def _plot(history: list[dict[str, Any]], out: Path) -> None:
    try:
        from aiayn.viz.curves import plot_learning_curves

        plot_learning_curves(history, out / CURVE_FILE, ys=("train_nll", "val_loss"),
                             title="per-token NLL (train: running mean, no label smoothing)")
    except AiaynError as e:  # matplotlib missing: training results still stand
        tqdm.write(f"note: {e}")
