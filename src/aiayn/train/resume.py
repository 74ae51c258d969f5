"""What ``--resume`` checks before it continues a run: the saved training state is whole, and the run it
continues is the same model on the same tokenizers.

A damaged or edited ``training_state.pt`` (a missing entry, an emptied optimizer, a ``position`` of None, a format
from a newer aiayn) is one error naming the file and every problem, not a ``KeyError`` later. The checkpoint's
``config.json`` (model, tokenizers, task settings) and the recipe's ``[model]`` / ``[tokenizer]`` sections saved with
the state must match this run's: an architecture change is refused with the differing keys listed. Changes to
``[data]`` and ``[train]`` (lr, max_steps, ...) and to decoding settings are allowed and reported.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from aiayn.checkpoint import FORMAT_VERSION, restore_rng
from aiayn.errors import AiaynError
from aiayn.train.distributed import Ranks

#: ``training_state.pt``'s ``sharded`` entry when model and optimizer state are in ``dcp/`` (dcp_checkpoint.py)
SHARDED_FORMAT = "dcp"

#: recipe sections whose change makes a different model (refused on resume); the others are reported
ARCHITECTURE_SECTIONS = ("model", "tokenizer")
#: config.json entries that may change on resume (decoding settings and how validation scores were computed)
FREE_CONFIG_KEYS = ("decode", "metrics")


def validate_training_state(state: Mapping[str, Any], file: Path, optimizer: torch.optim.Optimizer) -> None:
    """Raise one :class:`AiaynError` naming ``file`` and every problem of a loaded training state.

    Args:
        state: what :func:`aiayn.checkpoint.load_training_state` returned.
        file: the ``training_state.pt`` it came from (for the message).
        optimizer: this run's optimizer, whose parameters the saved state must fit (a sharded run's optimizer
            state is in the checkpoint's ``dcp/`` folder, checked as it loads).

    The saved ``world_size`` may differ from this run's: ``rng_by_rank`` must hold one RNG state per process of
    the run that saved it.
    """
    problems: list[str] = []
    version = state.get("format_version")
    if not isinstance(version, int) or version < 1:
        problems.append(f"format_version={version!r} is not a version this program wrote")
    elif version > FORMAT_VERSION:
        problems.append(f"format_version={version} is newer than this aiayn reads ({FORMAT_VERSION}); upgrade aiayn")
    step = state.get("step")
    if not _is_int(step) or step < 0:
        problems.append(f"step={step!r} must be a non-negative integer")
    position = state.get("position")
    if not isinstance(position, dict) or not position:
        problems.append(f"position={position!r} must be the data position (a non-empty dict)")
    best = state.get("best")
    if best is not None and not (isinstance(best, dict) and isinstance(best.get("value"), numbers.Real)
                                 and _is_int(best.get("step"))):
        problems.append(f"best={best!r} must be None or {{'value': number, 'step': int}}")
    for key, kind in (("elapsed", numbers.Real), ("world_size", int)):
        if key in state and not isinstance(state[key], kind):
            problems.append(f"{key}={state[key]!r} must be a {kind.__name__}")
    if state.get("sharded") != SHARDED_FORMAT:
        problems += _optimizer_problems(state.get("optimizer"), optimizer, step if _is_int(step) else 0)
    scheduler = state.get("scheduler")
    if not isinstance(scheduler, dict) or not _is_int(scheduler.get("last_epoch")):
        problems.append("scheduler must be a state dict with an integer last_epoch")
    elif _is_int(step) and scheduler["last_epoch"] != step:  # the schedule steps once per optimizer step
        problems.append(f"step={step} but the schedule made {scheduler['last_epoch']} steps; they are saved equal")
    saved_world = state.get("world_size", 1)
    saved_world = saved_world if _is_int(saved_world) and saved_world > 0 else 1
    rng = state.get("rng_by_rank") if saved_world > 1 else state.get("rng")
    rngs = rng if saved_world > 1 and isinstance(rng, list) else [rng]
    if saved_world > 1 and (not isinstance(rng, list) or len(rng) != saved_world):
        problems.append(f"rng_by_rank must hold one RNG state per process of the run that saved it ({saved_world})")
    for r in rngs:
        if not (isinstance(r, dict) and {"python", "numpy", "torch"} <= r.keys()
                and isinstance(r["torch"], torch.Tensor)):
            problems.append("rng must hold the python, numpy and torch generator states")
            break
    if problems:
        raise AiaynError(f"{file}: the training state is damaged or edited:\n  - " + "\n  - ".join(problems)
                         + "\nRestore the file, or start a new run in another train.out_dir")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _optimizer_problems(saved: Any, optimizer: torch.optim.Optimizer, step: int) -> list[str]:
    """Problems of a saved optimizer state dict against this run's optimizer (empty when it fits)."""
    if not isinstance(saved, dict) or not isinstance(saved.get("state"), dict) \
            or not isinstance(saved.get("param_groups"), list):
        return ["optimizer must be a state dict with 'state' and 'param_groups'"]
    groups = optimizer.param_groups
    if len(saved["param_groups"]) != len(groups):
        return [f"optimizer has {len(saved['param_groups'])} parameter groups, this model's optimizer {len(groups)}"]
    params = [p for g in groups for p in g["params"]]
    ids = [i for g in saved["param_groups"] if isinstance(g, dict) for i in g.get("params", [])]
    if len(ids) != len(params):
        return [f"optimizer covers {len(ids)} parameters, this model has {len(params)}"]
    problems = []
    if step > 0 and not saved["state"]:
        problems.append(f"optimizer state is empty at step {step} (moment estimates missing)")
    by_id = dict(zip(ids, params))
    for pid, entry in saved["state"].items():
        param = by_id.get(pid)
        if param is None or not isinstance(entry, dict):
            problems.append(f"optimizer state entry {pid!r} belongs to no parameter")
            continue
        for name, value in entry.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != param.shape:
                problems.append(f"optimizer state {pid}.{name} has shape {tuple(value.shape)}, its parameter "
                                f"{tuple(param.shape)}")
    return problems


def config_changes(saved: Mapping[str, Any], current: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The keys where two nested JSON-like dicts differ, as ``key: saved -> current`` lines (dotted keys)."""
    changes = []
    for key in sorted(set(saved) | set(current), key=str):
        name = f"{prefix}{key}"
        a, b = saved.get(key, "<absent>"), current.get(key, "<absent>")
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            changes += config_changes(a, b, name + ".")
        elif _normal(a) != _normal(b):
            changes.append(f"{name}: {a!r} -> {b!r}")
    return changes


def _normal(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def check_same_run(checkpoint: Path, saved_config: Mapping[str, Any], config: Mapping[str, Any],
                   saved_recipe: Mapping[str, Any] | None, recipe: Mapping[str, Any] | None,
                   saved_train: Mapping[str, Any] | None, train: Mapping[str, Any]) -> list[str]:
    """Refuse a resume that would continue another model; list the allowed changes.

    Args:
        checkpoint: the ``last/`` directory being resumed (for messages).
        saved_config / config: the checkpoint's ``config.json`` and the one this run would write.
        saved_recipe / recipe: the recipe sections saved with the training state and this run's (None: unknown).
        saved_train / train: the ``[train]`` settings saved with the state and this run's.

    Returns:
        Lines describing allowed changes (data, training and decoding settings), for the log.

    Raises:
        AiaynError: the model, tokenizer or task settings differ, every differing key listed.
    """
    fixed = {k: v for k, v in saved_config.items() if k not in FREE_CONFIG_KEYS}
    now = {k: v for k, v in config.items() if k not in FREE_CONFIG_KEYS}
    refused = config_changes(fixed, now)
    allowed = config_changes({k: saved_config.get(k, {}) for k in FREE_CONFIG_KEYS},
                             {k: config.get(k, {}) for k in FREE_CONFIG_KEYS})
    if saved_recipe is not None and recipe is not None:
        for section in sorted(set(saved_recipe) | set(recipe)):
            diff = config_changes(saved_recipe.get(section, {}), recipe.get(section, {}), f"[{section}] ")
            (refused if section in ARCHITECTURE_SECTIONS else allowed).extend(diff)
    if refused:
        raise AiaynError(f"{checkpoint}: --resume would continue a different model; this run changes:\n  - "
                         + "\n  - ".join(dict.fromkeys(refused))
                         + "\nResume with the recipe and overrides of the original run, or train the changed "
                           "model from scratch in another train.out_dir")
    if saved_train is not None:
        allowed += config_changes({k: v for k, v in saved_train.items() if k != "progress"},
                                  {k: v for k, v in train.items() if k != "progress"}, "train.")
    return list(dict.fromkeys(allowed))


def restore_rank_rng(state: Mapping[str, Any], ranks: Ranks, seed: int, accum: int) -> list[str]:
    """Restore this rank's RNG streams from a validated training state; describe a change of world size.

    On the world size that saved the state, every rank continues its own streams exactly. On another one, rank
    ``r`` continues the saved stream of rank ``r`` where that rank existed, and a new rank starts a stream seeded
    from ``(seed, rank, step)``; model, optimizer, schedule and data position continue exactly, but the
    micro-batches meet other dropout masks than in the uninterrupted run.

    Returns:
        Lines for the resume message (empty when the world size and the micro-batches per step are unchanged).
    """
    saved_world = state.get("world_size", 1)
    rngs = state["rng_by_rank"] if saved_world > 1 else [state["rng"]]
    if ranks.rank < len(rngs):
        restore_rng(rngs[ranks.rank])
    else:
        torch.manual_seed(seed + ranks.rank + 1_000_003 * state["step"])
    notes = []
    if saved_world != ranks.world:
        notes.append(f"processes: {saved_world} -> {ranks.world} (model, optimizer, schedule and data position "
                     "continue; dropout masks differ from an uninterrupted run)")
    saved_train = state.get("train_config") if isinstance(state.get("train_config"), dict) else {}
    before = int(saved_train.get("accum", accum)) * saved_world
    if before != accum * ranks.world:
        notes.append(f"micro-batches per optimizer step: {before} -> {accum * ranks.world} (train.accum x processes); "
                     f"set train.accum={before // ranks.world if before % ranks.world == 0 else '...'} to keep the "
                     "batch of the saved run")
    return notes
