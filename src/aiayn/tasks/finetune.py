"""Starting a run from an earlier checkpoint (``[model] init_from = "DIR"``), shared by every task.

A checkpoint that aiayn trained or that ``aiayn convert --from-hf`` wrote gives the new run its model config, its
weights and its tokenizer(s): nothing is trained before the first step, and the data is encoded with the
checkpoint's tokenizer and special ids. What a recipe may still say:

- ``[model]``: only settings that leave the weights' meaning alone (:data:`OVERRIDABLE`: dropout rates, mixture-of-
  experts loss weights); a key that changes the architecture is an error listing every such key. A classifier
  started from a masked-LM checkpoint gets a new head, so it may also set ``pooling`` (and ``init``).
- ``[tokenizer]``: nothing; the checkpoint's tokenizer is kept (a key there is an error).

The task must be the checkpoint's, except a classifier started from a masked-LM checkpoint (the encoder route:
the new classification head starts fresh). ``--resume`` continues from the run's own ``last/`` instead, which
already holds the model, its tokenizer and the overrides.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiayn.checkpoint import checkpoint_dir, load_config
from aiayn.config import ModelConfig
from aiayn.errors import AiaynError
from aiayn.train.recipe import resolve_path

#: ``[model]`` keys an ``init_from`` run may change: they act in training only
OVERRIDABLE = ("dropout", "attn_dropout", "ffn_dropout", "moe_capacity_factor", "moe_aux_loss_weight",
               "moe_z_loss_weight", "name")
#: further keys for a model whose head is new (a classifier from a masked-LM checkpoint)
NEW_HEAD_KEYS = ("pooling", "init")
#: (checkpoint task, run task) pairs besides the same task
CROSS_TASK = {("mlm", "classification"), ("embedding", "classification")}
#: tasks a recipe can train (an "embedding" checkpoint only starts other runs)
TRAINABLE = ("lm", "mlm", "classification", "translation", "image_classification")


def init_from_name(recipe: dict[str, Any]) -> str | None:
    """The checkpoint a recipe starts from (``[model] init_from``), or None."""
    value = recipe["model"].get("init_from")
    return value if value else None


def source_problems(recipe: dict[str, Any], task: str) -> tuple[Path | None, dict[str, Any] | None, list[str]]:
    """Read and check the ``init_from`` checkpoint of a recipe.

    Returns:
        ``(directory, its config.json, problems)``: ``(None, None, [])`` when the recipe names none; each
        problem as ``[section] key=value: problem; fix``.
    """
    name = init_from_name(recipe)
    if name is None:
        return None, None, []
    where = f"[model] init_from={name!r}"
    if not isinstance(name, str):
        return None, None, [f"{where}: must be a checkpoint directory in quotes"]
    path = resolve_path(recipe, name)
    try:
        directory = checkpoint_dir(path)
        meta = load_config(directory)
    except AiaynError as e:
        return None, None, [f"{where}: {e}"]
    source = meta.get("task")
    if not isinstance(meta.get("model"), dict) or source is None:
        return None, None, [f"{where}: {directory} is not an aiayn model checkpoint (its config.json has no task "
                            "and model); give a checkpoint folder (e.g. runs/NAME/best, or what aiayn convert "
                            "--from-hf wrote)"]
    if source != task and (source, task) not in CROSS_TASK:
        return None, None, [f"{where}: a {source!r} checkpoint cannot start a {task!r} run; give a {task!r} "
                            "checkpoint" + (" (or an 'mlm' or 'embedding' one)" if task == "classification" else "")
                            + (f", or set task = \"{source}\"" if source in TRAINABLE else "")]
    problems = []
    allowed = OVERRIDABLE + (NEW_HEAD_KEYS if (source, task) in CROSS_TASK else ())
    fixed = sorted(k for k in recipe["model"] if k not in allowed and k != "init_from")
    if fixed:
        problems.append(f"[model] {', '.join(fixed)}: init_from = {name!r} takes the model from that checkpoint; "
                        f"these keys would change its architecture: remove them (only {', '.join(allowed)} may "
                        "be set)")
    if recipe.get("tokenizer"):
        keys = ", ".join(sorted(recipe["tokenizer"]))
        problems.append(f"[tokenizer] {keys}: init_from = {name!r} keeps that checkpoint's tokenizer; remove the "
                        "[tokenizer] section")
    return directory, meta, problems


def finetune_source(recipe: dict[str, Any], task: str) -> tuple[Path, dict[str, Any]] | None:
    """The ``init_from`` checkpoint's directory and ``config.json``, or None when the recipe names none.

    Raises:
        AiaynError: every problem :func:`source_problems` finds, naming the recipe.
    """
    directory, meta, problems = source_problems(recipe, task)
    if problems:
        origin = recipe.get("_path", "recipe")
        raise AiaynError(f"{origin}: " + "\n  - ".join(problems) if len(problems) == 1 else
                         f"{origin}: {len(problems)} problems:\n  - " + "\n  - ".join(problems))
    return None if directory is None else (directory, meta)  # type: ignore[return-value]


def finetune_config(meta: dict[str, Any], recipe: dict[str, Any], where: str, **forced: Any) -> ModelConfig:
    """The checkpoint's model config with the recipe's overridable ``[model]`` keys and ``forced`` applied."""
    section = {k: v for k, v in recipe["model"].items() if k != "init_from"}
    return ModelConfig.from_dict({**meta["model"], **section, **forced}, f"{where}/config.json + [model]")


def announce(directory: Path, meta: dict[str, Any], tokenizer_ids: dict[str, Any]) -> None:
    """Print where the run starts from, and the tokenizer ids it keeps."""
    ids = ", ".join(f"{k}={v}" for k, v in tokenizer_ids.items() if v is not None)
    print(f"init_from {directory}: the {meta.get('task')} checkpoint's model, weights and tokenizer ({ids})")
