"""From a recipe to a running training: pick the task class, build it, train, report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiayn.errors import AiaynError
from aiayn.train.recipe import load_recipe, take
from aiayn.train.trainer import TrainConfig, TrainResult, pick_device, train


def train_config(recipe: dict[str, Any]) -> TrainConfig:
    """The ``[train]`` section as a validated TrainConfig."""
    known = {f: getattr(TrainConfig(), f) for f in TrainConfig.__dataclass_fields__}
    return TrainConfig(**take(recipe["train"], known, "train"))


def build_task(recipe: dict[str, Any], cfg: TrainConfig, resume: bool):
    """Instantiate the task a recipe names."""
    device = pick_device(cfg.device)
    resume_dir = Path(cfg.out_dir) / "last" if resume else None
    if recipe["task"] == "translation":
        from aiayn.tasks.translation import TranslationTask

        return TranslationTask(recipe, resume_dir=resume_dir, device=device, seed=cfg.seed)
    if recipe["task"] == "lm":
        from aiayn.tasks.lm import LMTask

        return LMTask(recipe, resume_dir=resume_dir, device=device, seed=cfg.seed)
    if recipe["task"] == "mlm":
        from aiayn.tasks.mlm import MLMTask

        return MLMTask(recipe, resume_dir=resume_dir, device=device, seed=cfg.seed)
    if recipe["task"] == "classification":
        from aiayn.tasks.classification import ClassificationTask

        return ClassificationTask(recipe, resume_dir=resume_dir, device=device, seed=cfg.seed)
    raise AiaynError(f"{recipe.get('_path')}: task {recipe['task']!r} is not available in this version")


def run_recipe(path: str | Path, overrides: list[str] | None = None, *, resume: bool = False) -> TrainResult:
    """Load a recipe, build its task and train it; prints where the checkpoints went."""
    recipe = load_recipe(path, overrides)
    cfg = train_config(recipe)
    task = build_task(recipe, cfg, resume)
    result = train(task, cfg, resume=resume)
    print(f"trained {result.steps} steps in {result.wall_seconds / 60:.1f} min; "
          f"best {task.select_metric} {result.best_metric}; checkpoints: {result.best_dir}, {result.last_dir}")
    return result
