"""From a recipe to a running training: pick the task class, build it, train, report."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from aiayn.devices import pick_device
from aiayn.errors import AiaynError
from aiayn.output_folder import check_run_folder
from aiayn.program import RESUME_COMMAND_VAR, command
from aiayn.tasks import recipe_checks  # noqa: F401 - registers every task's recipe checks
from aiayn.tasks.classification import ClassificationTask
from aiayn.tasks.image_classification import ImageClassificationTask
from aiayn.tasks.lm import LMTask
from aiayn.tasks.mlm import MLMTask
from aiayn.tasks.translation import TranslationTask
from aiayn.train.distributed import finish, init_from_env
from aiayn.train.recipe import load_recipe, take, validate_recipe, with_data_dir
from aiayn.train.stop_signals import Stopped, stop_signals
from aiayn.train.trainer import TrainConfig, TrainResult, train


def train_config(recipe: dict[str, Any]) -> TrainConfig:
    """The ``[train]`` section as a validated TrainConfig."""
    known = {f: getattr(TrainConfig(), f) for f in TrainConfig.__dataclass_fields__}
    return TrainConfig(**take(recipe["train"], known, "train"))


def build_task(recipe: dict[str, Any], cfg: TrainConfig, resume: bool, local_rank: int = 0):
    """Instantiate the task a recipe names (on GPU ``local_rank`` for a rank of a data-parallel run)."""
    device = pick_device(cfg.device, local_rank)
    if device.type == "cuda":
        if device.index >= torch.cuda.device_count():
            raise AiaynError(f"{device}: this machine has {torch.cuda.device_count()} GPU(s); use at most that many "
                             "processes (--nproc) or train.device=cpu")
        torch.cuda.set_device(device)
    resume_dir = Path(cfg.out_dir) / "last" if resume else None
    if recipe["task"] == "translation":
        return TranslationTask(recipe, resume_dir=resume_dir, device=device, seed=cfg.seed)
    if recipe["task"] == "lm":
        return LMTask(recipe, resume_dir=resume_dir, device=device, seed=cfg.seed)
    if recipe["task"] == "mlm":
        return MLMTask(recipe, resume_dir=resume_dir, device=device, seed=cfg.seed)
    if recipe["task"] == "classification":
        return ClassificationTask(recipe, resume_dir=resume_dir, device=device, seed=cfg.seed)
    if recipe["task"] == "image_classification":
        return ImageClassificationTask(recipe, resume_dir=resume_dir, device=device, seed=cfg.seed)
    raise AiaynError(f"{recipe.get('_path')}: task {recipe['task']!r} is not available in this version")


def run_recipe(path: str | Path, overrides: list[str] | None = None, *, resume: bool = False,
               data_dir: str | None = None) -> TrainResult:
    """Load a recipe, build its task and train it; prints where the checkpoints went. ``data_dir``: read every
    ``[data]`` file from that folder by its name (:func:`~aiayn.train.recipe.with_data_dir`).

    Under torchrun (or ``aiayn train --nproc N``, :func:`aiayn.train.distributed.launch`) each rank runs this and
    leaves the process group at the end; rank 0 prints.
    """
    started = time.time()
    recipe = load_recipe(path, overrides)
    if data_dir is not None:
        with_data_dir(recipe, data_dir)
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    validate_recipe(recipe, resume=resume, processes=local_world)  # every section's problems at once, first
    cfg = train_config(recipe)
    if not resume:
        check_run_folder(cfg.out_dir)  # before any work: a folder of the user's is never written into
    ranks = init_from_env(pick_device(cfg.device).type)  # a rank of a torchrun / --nproc run, or one process
    together = False  # the ranks leave the process group together (a run that ended, or stopped after one step)
    try:
        with stop_signals(deferred=ranks.world > 1):  # a stop signal while the data is read ends the command too
            if ranks.main:
                print(f"{path}: reading the data, preparing the tokenizer and the {recipe['task']} model",
                      file=sys.stderr, flush=True)
            task = build_task(recipe, cfg, resume, ranks.local_rank)
            result = train(task, cfg, resume=resume, recipe=recipe)
        together = True
    except KeyboardInterrupt as e:
        together = isinstance(e, Stopped) and ranks.world > 1
        if ranks.main and (Path(cfg.out_dir) / "last").is_dir():  # a checkpoint to continue from
            again = os.environ.get(RESUME_COMMAND_VAR) or command("train", str(path), *(overrides or []), "--resume")
            print(f"continue with: {again}", file=sys.stderr)
        raise
    finally:
        if ranks.world > 1:
            finish(together)
    if not ranks.main:
        return result
    print(_summary(result, task.select_metric, time.time() - started), flush=True)
    return result


def _summary(result: TrainResult, metric: str, wall_seconds: float) -> str:
    """The run's last line: the steps and time of this process and, for a resumed run, of the whole run."""
    best = "no validation score" if result.best_metric is None else f"best val_{metric} {result.best_metric:.4g}"
    mine = result.trained_seconds - result.elapsed_before  # this process's steps, validations and saves
    if result.first_step:  # a resumed run
        trained = (f"trained steps {result.first_step + 1}-{result.steps} in {mine / 60:.1f} min "
                   f"({wall_seconds / 60:.1f} min with start-up and the last validation and save; "
                   f"{result.steps} steps and {result.trained_seconds / 60:.1f} min of training in the whole run)")
    else:
        trained = (f"trained {result.steps} steps in {mine / 60:.1f} min ({wall_seconds / 60:.1f} min with start-up "
                   "and the last validation and save)")
    where = ", ".join(d for d in (result.best_dir, result.last_dir, result.averaged_dir) if d)
    return f"{trained}; {best}; checkpoints: {where}"
