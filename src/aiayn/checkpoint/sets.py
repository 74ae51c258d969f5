"""The checkpoints of a run taken together: averaging their weights, listing the periodic ones, pruning old ones."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

import torch

from aiayn.checkpoint.disk import trash
from aiayn.checkpoint.layout import checkpoint_dir, old_path, tokenizer_files
from aiayn.checkpoint.load import load_config, read_model_file
from aiayn.checkpoint.save import save_checkpoint
from aiayn.errors import AiaynError
from aiayn.output_folder import CHECKPOINT, check_output_folder


def average_checkpoints(paths: Iterable[str | os.PathLike]) -> dict[str, torch.Tensor]:
    """Average the weights of several checkpoints (the paper averages the last 5 or 20).

    Floating-point tensors are averaged in float64 and cast back; integer tensors (counters, index
    buffers) are taken from the last checkpoint. Tied names map to the same averaged tensor.

    Args:
        paths: checkpoint directories of the same model.

    Returns:
        A state dict (CPU) for ``model.load_state_dict``.

    Raises:
        AiaynError: no paths, or checkpoints whose tensor names, shapes or ties differ.
    """
    dirs = [checkpoint_dir(p) for p in paths]
    if not dirs:
        raise AiaynError("average_checkpoints: no checkpoints given")
    sums: dict[str, torch.Tensor] = {}
    last: dict[str, torch.Tensor] = {}
    ref_aliases: dict[str, str] = {}
    for i, directory in enumerate(dirs):
        tensors, aliases = read_model_file(directory)
        if i == 0:
            ref_aliases = aliases
            sums = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in tensors.items()}
        elif aliases != ref_aliases or tensors.keys() != sums.keys():
            raise AiaynError(f"{directory}: tensor names or ties differ from {dirs[0]}; not the same model")
        for k, v in tensors.items():
            if v.shape != sums[k].shape:
                raise AiaynError(
                    f"{directory}: tensor {k} has shape {tuple(v.shape)}, {dirs[0]} has "
                    f"{tuple(sums[k].shape)}; not the same model"
                )
            if v.is_floating_point():
                sums[k] += v.double()
        last = tensors
    out = {
        k: (sums[k] / len(dirs)).to(v.dtype) if v.is_floating_point() else v.clone() for k, v in last.items()
    }
    for dropped, kept in ref_aliases.items():
        out[dropped] = out[kept]
    return out


def periodic_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """The periodic ``step-N`` checkpoints of a training run, oldest first (by N, not by name).

    Args:
        run_dir: a run's ``train.out_dir``.

    Returns:
        The ``step-N`` paths (read them through :func:`~aiayn.checkpoint.layout.checkpoint_dir`: a
        ``step-N`` whose save was cut short is listed when its ``step-N.old`` is there); temporary and trash
        folders are never listed.
    """
    steps: set[str] = set()
    for p in Path(run_dir).glob("step-*"):
        name = p.name.removesuffix(".old")
        if p.is_dir() and name.split("-", 1)[1].isdigit():
            steps.add(name)
    return sorted((Path(run_dir) / name for name in steps), key=lambda p: int(p.name.split("-", 1)[1]))


def write_average(paths: Iterable[str | os.PathLike], out: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Average checkpoints (:func:`average_checkpoints`) into a new checkpoint directory ``out``.

    ``config.json`` and the tokenizer files come from the last checkpoint; no training state is written,
    so the result is for decoding and evaluation, not for ``--resume``.

    Args:
        paths: checkpoint directories of one model (at least one).
        out: the directory to write (atomically): a new or empty folder, or an aiayn checkpoint (replaced); any
            other folder only with ``overwrite`` (:func:`aiayn.output_folder.check_output_folder`).
        overwrite: write the checkpoint's files into a folder that holds other things (only files of the same
            names are replaced; nothing else there is changed or removed).

    Returns:
        The written directory.

    Raises:
        AiaynError: the checkpoints differ in config or tensors; ``out`` is one of them (or inside or around one),
            or a folder of something else and ``overwrite`` is false.
    """
    paths = [Path(p) for p in paths]
    dirs = [checkpoint_dir(p) for p in paths]
    if not dirs:
        raise AiaynError("average: no checkpoints given")
    target = Path(out)
    if any(target.resolve() in (d.resolve(), old_path(d).resolve()) for d in dirs):
        raise AiaynError(f"{target}: is one of the checkpoints being averaged; write the average elsewhere")
    into = check_output_folder(target, CHECKPOINT, overwrite=overwrite, sources=[*paths, *dirs])
    config = load_config(dirs[-1])
    for d in dirs[:-1]:
        if load_config(d).get("model") != config.get("model"):
            raise AiaynError(f"{d}: its model config differs from {dirs[-1]}; average checkpoints of one model")
    state = average_checkpoints(dirs)
    return save_checkpoint(target, state, config, tokenizer_writer=tokenizer_files(dirs[-1]), into=into)


def _natural_key(name: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def keep_last(parent: str | os.PathLike, pattern: str, n: int) -> list[Path]:
    """Delete all but the last ``n`` checkpoint directories in ``parent`` matching ``pattern``.

    "Last" is natural name order (``step_900`` < ``step_1000``). Temporary, trash and ``.old`` siblings
    are never counted; a pruned checkpoint's ``.old`` sibling is deleted with it. Each is renamed to a
    hidden trash name before it is deleted, so a kill never leaves a half-deleted checkpoint in sight.

    Args:
        parent: the folder holding checkpoints.
        pattern: a glob such as ``"step_*"``.
        n: how many to keep (>= 0).

    Returns:
        The deleted directories.
    """
    if n < 0:
        raise AiaynError(f"keep_last: n must be >= 0, got {n}")
    found: dict[str, Path] = {}  # checkpoint name -> its directory (or its .old when that is all there is)
    for p in Path(parent).glob(pattern):
        if not p.is_dir() or p.name.startswith("."):
            continue
        if p.name.endswith(".old"):
            name = p.name[: -len(".old")]
            found.setdefault(name, p)
        else:
            found[p.name] = p
    names = sorted(found, key=_natural_key)
    doomed = [found[name] for name in names[: max(0, len(names) - n)]]
    for p in doomed:
        for victim in (p, p.with_name(p.name + ".old")):
            if victim.is_dir():
                trash(victim, victim)
    return doomed
