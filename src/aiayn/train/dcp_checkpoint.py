"""The sharded part of a checkpoint: model and optimizer state through ``torch.distributed.checkpoint`` (DCP).

A checkpoint of an FSDP run (``last/``) is an ordinary checkpoint directory (:mod:`aiayn.checkpoint`:
``config.json``, the full weights in ``model.safetensors`` gathered on rank 0, tokenizers, ``training_state.pt``
without the optimizer) plus ``dcp/``: the model and optimizer state as DCP wrote them, one ``__<rank>_0.distcp``
file per rank and a ``.metadata`` index, keyed by parameter name.

Saving keeps the atomic-save guarantee: rank 0 creates the hidden temporary folder and sends its path to every
rank; every rank writes its shards into ``<tmp>/dcp`` (:func:`dcp.save`, a collective); then rank 0 writes the
other files and the manifest (which lists and checksums the shards) and renames the folder into place. A kill of
any rank at any instant leaves the previous ``last/`` whole. Every rank must see the same ``out_dir`` (one
machine, or a shared file system for several).

Loading reshards: DCP reads any saved sharding into any other, so a run saved on 2 ranks resumes on 1, 2 or 4
ranks, with FSDP, DDP or one process (:func:`load_sharded`). :func:`export_sharded` turns ``dcp/`` alone into an
ordinary checkpoint in one process, for inference.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)

from aiayn.checkpoint import CONFIG_FILE, checkpoint_dir, load_config, save_checkpoint
from aiayn.checkpoint.layout import OWN_FILES, verify
from aiayn.config import ModelConfig
from aiayn.errors import AiaynError
from aiayn.models.build import build_model
from aiayn.output_folder import CHECKPOINT, check_output_folder

DCP_DIR = "dcp"


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state dict on rank 0, on the CPU (empty on the other ranks); a collective under FSDP."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def has_sharded(path: str | os.PathLike) -> bool:
    """Whether the checkpoint ``path`` holds a ``dcp/`` folder."""
    return (checkpoint_dir(path) / DCP_DIR / ".metadata").is_file()


def _write(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(folder))


def _dcp_load(state: dict[str, Any], folder: Path) -> None:
    """``dcp.load`` into ``state`` in place; without a process group it reads in this one process (said once here,
    not warned about)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=str(folder))


def _announce(tmp: Path | None) -> Path | None:
    """Rank 0 sends the temporary folder (None: the save failed before it) to every rank; returns it."""
    box = [None if tmp is None else str(tmp)]
    dist.broadcast_object_list(box, src=0)
    return None if box[0] is None else Path(box[0])


def save_sharded(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, rank: int,
                 save_files: Callable[[Callable[[Path], None]], Path] | None) -> None:
    """Write a checkpoint with a ``dcp/`` folder; every rank calls it at the same point.

    Args:
        path: the checkpoint directory (for messages).
        model: this rank's (sharded) model.
        optimizer: this rank's optimizer.
        rank: this process's rank.
        save_files: on rank 0, ``save_files(shard_writer)`` writes the ordinary files with
            :func:`~aiayn.checkpoint.save_checkpoint`, passing ``shard_writer`` on (None on the other ranks).

    Raises:
        AiaynError: rank 0 could not save (on the other ranks: naming rank 0's failure).
    """
    if rank != 0:
        tmp = _announce(None)
        if tmp is None:
            raise AiaynError(f"{path}: rank 0 could not save the checkpoint (its message is above)")
        _write(tmp / DCP_DIR, model, optimizer)
        return
    announced = [False]

    def shard_writer(tmp: Path) -> None:
        announced[0] = True
        _announce(tmp)
        _write(tmp / DCP_DIR, model, optimizer)

    try:
        save_files(shard_writer)
    finally:
        if not announced[0]:  # failed before the shards: release the other ranks
            _announce(None)


def _check_files(directory: Path) -> None:
    """Check every file of ``directory/dcp`` against the checkpoint's manifest."""
    folder = directory / DCP_DIR
    for file in sorted(folder.rglob("*")):
        if file.is_file():
            verify(directory, file.relative_to(directory).as_posix())


def load_sharded(path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Load ``path``'s ``dcp/`` model and optimizer state into this run's model and optimizer, whatever the number
    of ranks that saved it and the engine of this run (FSDP, DDP, one process); every rank calls it.

    Raises:
        AiaynError: a shard differs from its checksum, or the state does not fit the model.
    """

    directory = checkpoint_dir(path)
    _check_files(directory)
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    try:
        _dcp_load(state, directory / DCP_DIR)
    except (RuntimeError, ValueError, KeyError, CheckpointException) as e:  # DCP's is a BaseException
        raise AiaynError(f"{directory / DCP_DIR}: the sharded state does not fit this model and optimizer ({e}); "
                         "resume with the original [model] and train.optimizer") from e
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def optimizer_state_by_name(model: nn.Module, optimizer: torch.optim.Optimizer,
                            saved: dict[str, Any]) -> dict[str, Any]:
    """A single-process optimizer state dict (parameters by index, as ``optimizer.state_dict()``) keyed by
    parameter name, for loading into a sharded optimizer with :func:`set_full_optimizer_state`.

    Args:
        model: the unsharded model.
        optimizer: an optimizer over ``model``'s trainable parameters, built as the run builds its own.
        saved: the saved ``optimizer.state_dict()``.
    """
    optimizer.load_state_dict(saved)
    return get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))[1]


def set_full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load an optimizer state keyed by parameter name (every rank holding all of it) into a sharded optimizer."""
    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def export_sharded(path: str | os.PathLike, out: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Write an ordinary checkpoint (config, ``model.safetensors`` and tokenizers; no training state) at ``out``
    from the ``dcp/`` folder of the checkpoint ``path``, in this one process.

    ``out`` is a new or empty folder, or an aiayn checkpoint (replaced); any other folder only with ``overwrite``,
    and then only the checkpoint's files are replaced (:func:`aiayn.output_folder.check_output_folder`).

    Raises:
        AiaynError: ``path`` has no ``dcp/`` folder, or a shard differs from its checksum; ``out`` is ``path`` (or
            inside or around it), or a folder of something else and ``overwrite`` is false.
    """

    directory = checkpoint_dir(path)
    into = check_output_folder(out, CHECKPOINT, overwrite=overwrite, flag="overwrite=True",
                               sources=[path, directory])
    if not has_sharded(directory):
        raise AiaynError(f"{directory}: no {DCP_DIR}/ folder (not a checkpoint of a sharded run); it is already an "
                         "ordinary checkpoint")
    _check_files(directory)
    config = load_config(directory)
    model = build_model(ModelConfig.from_dict(config["model"], str(directory / CONFIG_FILE)))
    state = {"model": model.state_dict()}
    try:
        _dcp_load(state, directory / DCP_DIR)
    except (RuntimeError, ValueError, KeyError, CheckpointException) as e:
        raise AiaynError(f"{directory / DCP_DIR}: the shards do not fit the model of {directory / CONFIG_FILE} ({e}); "
                         "the folder is damaged or from another run") from e
    model.load_state_dict(state["model"])
    tokenizers = [f for f in sorted(directory.iterdir()) if f.is_file() and f.name not in OWN_FILES]
    target = save_checkpoint(out, model, config, tokenizer_writer=tokenizers, into=into)
    return target

