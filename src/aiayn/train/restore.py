"""How a run starts: resumed from ``last/`` (``--resume``), or fresh.

Resuming happens in two halves around the wrapping of the model (:func:`aiayn.train.parallel.parallelize`):

1. :func:`read_last`, before it: ``last/`` recovered if a save was cut short, its training state read and checked
   (:mod:`aiayn.train.resume`: whole, the same freeze list, the same model and tokenizers), the full weights loaded
   into the model, and for an FSDP run continuing a replicated one, its optimizer state keyed by parameter name.
2. :func:`restore_run`, after the optimizer and schedule are built: the optimizer's moments (from the state, from
   the shards of a sharded run resharded to this run's ranks, or by name), the schedule's position under this
   run's ``[train]`` settings (:func:`continue_schedule`), the float16 loss scale, every rank's RNG state and the
   data position; a run already at ``train.max_steps`` is refused.

A fresh run (:func:`check_fresh_start`, :func:`fresh_run`) refuses a folder that holds a run, checks that every rank
built the same tokenizers, gives FSDP's ranks rank 0's weights, and seeds each rank's dropout.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from aiayn.checkpoint import STATE_FILE, load_config, load_model_state, load_training_state
from aiayn.checkpoint.adapter import load_adapted
from aiayn.checkpoint.disk import trash
from aiayn.checkpoint.layout import CheckpointRead, checkpoint_dir, is_readable, old_path
from aiayn.errors import AiaynError
from aiayn.files import fsync_dir
from aiayn.train.checkpoint_policy import RunState
from aiayn.train.dcp_checkpoint import load_sharded, optimizer_state_by_name, set_full_optimizer_state
from aiayn.train.distributed import Ranks, broadcast_parameters, check_same_files
from aiayn.train.precision import Precision
from aiayn.train.resume import SHARDED_FORMAT, check_same_run, restore_rank_rng, validate_training_state
from aiayn.train.run_lock import owner
from aiayn.train.step import optimizer_for
from aiayn.train.train_config import TrainConfig


@dataclass
class Resumed:
    """``last/``'s training state, read and checked by :func:`read_last`.

    Attributes:
        last: the ``last/`` folder.
        state: its training state.
        changes: the settings this run changes, in words (reported when it resumes).
        by_name: under FSDP, a replicated run's optimizer state keyed by parameter name; else None.
    """

    last: Path
    state: dict[str, Any]
    changes: list[str] = field(default_factory=list)
    by_name: dict[str, Any] | None = None


def read_last(task: Any, cfg: TrainConfig, ranks: Ranks, kind: str, config_json: dict[str, Any],
              recipe_sections: dict[str, Any]) -> Resumed:
    """Read and check ``last/`` of ``cfg.out_dir`` and load its full weights into ``task.model`` (every rank, before
    the model is wrapped).

    Raises:
        AiaynError: no or a damaged training state, another freeze list, another model or tokenizers.
    """
    last = Path(cfg.out_dir) / "last"
    if ranks.main:
        recover_checkpoint(last, say=tqdm.write)  # a save killed between its renames left last.old only
    ranks.barrier()
    with CheckpointRead(last) as ck:  # state, config and weights of one save
        state = _resume_state(ck, cfg)
        model = task.model
        probe = optimizer_for(model, cfg)  # an optimizer as this run builds it, for the checks and the conversion
        validate_training_state(state, last / STATE_FILE, probe)
        changes = check_same_run(last, load_config(ck), config_json, state.get("recipe"), recipe_sections or None,
                                 state.get("train_config"), cfg.to_dict())
        if "base" in config_json.get("adapter", {}):  # the trained tensors alone, over the base they adapt
            load_adapted(ck, config_json["adapter"], model)
        else:
            load_model_state(ck, model)  # the full weights, before any sharding
    by_name = None
    if kind == "fsdp" and state.get("sharded") != SHARDED_FORMAT:  # a replicated run's optimizer, by name
        by_name = optimizer_state_by_name(model, probe, state["optimizer"])
    return Resumed(last, state, changes, by_name)


def restore_run(resumed: Resumed, model: nn.Module, optimizer: torch.optim.Optimizer,
                scheduler: torch.optim.lr_scheduler.LambdaLR, precision: Precision, cfg: TrainConfig,
                ranks: Ranks) -> RunState:
    """Continue the run :func:`read_last` read: optimizer, schedule, loss scale, RNG states and data position.

    Raises:
        AiaynError: the run is at ``train.max_steps`` already, or its RNG state is damaged.
    """
    state, last = resumed.state, resumed.last
    settings = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    if state.get("sharded") == SHARDED_FORMAT:
        load_sharded(last, model, optimizer)  # resharded to this run's ranks
    elif resumed.by_name is not None:
        set_full_optimizer_state(model, optimizer, resumed.by_name)
    else:
        optimizer.load_state_dict(state["optimizer"])
    continue_schedule(optimizer, scheduler, settings, state["scheduler"])
    run = RunState(step=state["step"], position=state["position"], best=state["best"],
                   elapsed_before=state.get("elapsed", 0.0), skipped=state.get("nonfinite_skipped", 0))
    if "grad_scaler" in state:
        precision.load_state_dict(state["grad_scaler"])
    if run.step > cfg.max_steps:
        raise AiaynError(f"{last}: the run is at step {run.step}, past train.max_steps={cfg.max_steps}; raise "
                         f"train.max_steps (e.g. train.max_steps={run.step + cfg.max_steps}) to go on")
    try:
        changes = resumed.changes + restore_rank_rng(state, ranks, cfg.seed, cfg.accum)
    except (RuntimeError, ValueError, TypeError, KeyError, IndexError) as e:
        raise AiaynError(f"{last / STATE_FILE}: its random-number generator state is damaged ({e}); restore "
                         "the file, or start a new run in another train.out_dir") from None
    if ranks.main:
        position = run.position
        epoch = f", epoch {position['epoch'] + 1}" if isinstance(position.get("epoch"), int) else ""
        tqdm.write(f"resuming from step {run.step}{epoch} ({last}, {run.elapsed_before / 60:.1f} min trained)"
                   + "".join(f"\n  changed: {c}" for c in changes))
        if run.step == cfg.max_steps:
            tqdm.write(f"the run is at train.max_steps={cfg.max_steps}: nothing to train (the checkpoint is read and "
                       "saved again, on this run's processes); raise train.max_steps to go on")
    return run


def continue_schedule(optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR,
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


def resumed_stream(stream: Iterator, file: Path) -> Iterator[tuple[Any, Any]]:
    """A task's (batch, position) stream started at a saved position: a position that does not fit the data, or
    a damaged sampler state, is an error naming the training state ``file`` when the first batch is drawn."""
    try:
        first = next(stream)
    except (KeyError, TypeError, IndexError, ValueError, RuntimeError, AiaynError) as e:
        raise AiaynError(f"{file}: its data position does not fit this run's data or is damaged ({e}); resume "
                         "with the original data, or start a new run in another train.out_dir") from None
    yield first
    yield from stream


def check_fresh_start(task: Any, out: Path, kind: str, ranks: Ranks) -> None:
    """Before a fresh run (every rank): ``out`` holds no run, every rank built the same tokenizers, and under FSDP
    every rank shards rank 0's weights (DDP copies them itself).

    Raises:
        AiaynError: ``out`` holds a run (pass ``--resume``), or the ranks' tokenizers differ.
    """
    if (out / "last").exists() or (out / "last.old").exists():
        raise AiaynError(f"{out}: already holds a training run; pass --resume to continue it, "
                         "or choose another train.out_dir")
    check_same_files(task.write_tokenizers, ranks, "tokenizers")
    if kind == "fsdp":
        broadcast_parameters(task.model, ranks)


def fresh_run(cfg: TrainConfig, ranks: Ranks) -> RunState:
    """Step 0 at the beginning of the data; each rank its own dropout masks (rank 0 those of a single process)."""
    torch.manual_seed(cfg.seed + ranks.rank)
    return RunState()


def _resume_state(ck: CheckpointRead, cfg: TrainConfig) -> dict[str, Any]:
    """``last/``'s training state, refused when absent or when it was trained with another freeze list."""
    last = ck.path
    state = load_training_state(ck)
    if state is None:
        raise AiaynError(f"{last}: no training state to resume from; train without --resume first")
    saved_train = state.get("train_config")
    saved_freeze = saved_train.get("freeze") if isinstance(saved_train, dict) else None
    if list(saved_freeze or []) != list(cfg.freeze or []):
        raise AiaynError(f"{last}: the run was trained with train.freeze={saved_freeze!r}, this one has "
                         f"{cfg.freeze!r}; the optimizer's state fits only the same trainable parameters: "
                         "resume with the original freeze list, or start a new run in another train.out_dir")
    return state


def recover_checkpoint(path: str | os.PathLike, say: Callable[[str], None] | None = None) -> Path:
    """Repair a checkpoint left by an interrupted save and return the directory to read.

    When ``path`` is missing or incomplete and ``<path>.old`` is complete, ``<path>.old`` is renamed back
    to ``path`` (a broken ``path`` is deleted first) -- unless another live process holds the run lock of
    ``path``'s parent folder (:mod:`aiayn.train.run_lock`) or the folder is read-only; then
    ``<path>.old`` is only read from. Call it before resuming, while holding the run lock.

    Args:
        path: a checkpoint directory.
        say: receives a one-line notice when something was renamed back.

    Raises:
        AiaynError: no checkpoint directory at ``path``.
    """
    target = Path(path)
    old = old_path(target)
    if is_readable(target) or not is_readable(old):
        return checkpoint_dir(target)
    holder = owner(target.parent)
    if holder is not None and holder.alive is not False and not holder.is_this_process:
        return old
    try:
        if target.is_dir():
            trash(target, target)
        os.rename(old, target)
        fsync_dir(target.parent)
    except OSError:
        return checkpoint_dir(target)
    if say is not None:
        say(f"{target}: restored from {old.name}, left by a save that was cut short")
    return target
