"""Reading a checkpoint: weights (tied names restored), config and training state, each checked first.

Every reader resolves the directory with :func:`~aiayn.checkpoint_layout.checkpoint_dir` (a save cut
short between its renames leaves the checkpoint at ``<name>.old``) and checks each file against the
manifest. Nothing is unpickled: weights are safetensors, the config is JSON, and the training state is
read with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import safetensors
import torch
from torch import nn

from aiayn.checkpoint_layout import ALIASES_KEY, CONFIG_FILE, MODEL_FILE, STATE_FILE, checkpoint_dir, verify
from aiayn.errors import AiaynError


def first_non_finite(tensors: Mapping[str, torch.Tensor]) -> str | None:
    """The name of the first floating-point tensor holding NaN or inf, else None."""
    for name, t in tensors.items():
        if t.is_floating_point() and t.device.type != "meta" and not bool(torch.isfinite(t).all()):
            return name
    return None


def read_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read a checkpoint's model state dict (on CPU) with tied names restored as the same tensor.

    Args:
        path: a checkpoint directory.

    Raises:
        AiaynError: the directory or ``model.safetensors`` is missing, unreadable, differs from its
            checksum, or holds NaN/inf.
    """
    tensors, aliases = read_model_file(checkpoint_dir(path))
    for dropped, kept in aliases.items():
        tensors[dropped] = tensors[kept]
    return tensors


def read_model_file(directory: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors of ``directory/model.safetensors`` (each shared tensor once) and the aliases of the tied
    names (``aliases[dropped] = kept``), checked against the manifest and for NaN/inf.

    Raises:
        AiaynError: the file is missing, corrupt, differs from its checksum, or holds NaN/inf.
    """
    file = directory / MODEL_FILE
    if not file.is_file():
        raise AiaynError(f"{file}: checkpoint has no {MODEL_FILE}; the checkpoint is incomplete")
    verify(directory, MODEL_FILE)
    try:
        with safetensors.safe_open(str(file), framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        aliases = json.loads(metadata.get(ALIASES_KEY, "{}"))
    except (safetensors.SafetensorError, OSError, ValueError) as e:
        raise AiaynError(f"{file}: cannot read model weights ({e}); the file is corrupt") from e
    missing = sorted({k for k in aliases.values() if k not in tensors})
    if missing:
        raise AiaynError(f"{file}: aliases point at missing tensors {missing}; the file is corrupt")
    bad = first_non_finite(tensors)
    if bad is not None:
        raise AiaynError(
            f"{file}: holds NaN/inf in tensor {bad}; it was written by a diverged run, use an earlier checkpoint"
        )
    return tensors, aliases


def load_model_state(
    path: str | os.PathLike, model: nn.Module, strict: bool = True
) -> tuple[list[str], list[str]]:
    """Load a checkpoint's weights into ``model`` (tied parameters stay tied: values are copied in).

    Args:
        path: a checkpoint directory.
        model: a model built from the checkpoint's config.
        strict: require exactly matching keys.

    Returns:
        ``(missing_keys, unexpected_keys)`` as ``nn.Module.load_state_dict`` returns them (both
        empty when ``strict``).

    Raises:
        AiaynError: missing/corrupt files, NaN/inf weights, or keys or shapes that do not match the model.
    """
    directory = checkpoint_dir(path)
    state = read_state_dict(directory)
    try:
        return model.load_state_dict(state, strict=strict)
    except RuntimeError as e:
        raise AiaynError(
            f"{directory / MODEL_FILE}: weights do not fit the model ({e}); build the model from this "
            f"checkpoint's {CONFIG_FILE}"
        ) from e


def load_config(path: str | os.PathLike) -> dict:
    """Read a checkpoint's ``config.json``.

    Raises:
        AiaynError: missing directory or file, invalid JSON (with the line), or a checksum mismatch.
    """
    directory = checkpoint_dir(path)
    file = directory / CONFIG_FILE
    if not file.is_file():
        raise AiaynError(f"{file}: checkpoint has no {CONFIG_FILE}; the checkpoint is incomplete")
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise AiaynError(f"{file}:{e.lineno}: invalid JSON ({e.msg}); the checkpoint is corrupt") from e
    except (OSError, UnicodeDecodeError) as e:
        raise AiaynError(f"{file}: cannot read ({e})") from e
    if not isinstance(config, dict):
        raise AiaynError(f"{file}: expected a JSON object, got {type(config).__name__}")
    verify(directory, CONFIG_FILE)
    return config


def load_training_state(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict | None:
    """Read ``training_state.pt`` safely (``weights_only=True``), or None if the checkpoint has none.

    Returns:
        ``{"format_version", "optimizer", "scheduler", "rng", **train_state}``: ``optimizer`` and
        ``scheduler`` are state dicts (or None), ``rng`` is for :func:`~aiayn.train.rng_state.restore_rng`,
        and the rest is the ``train_state`` given to :func:`~aiayn.train.checkpoint_save.save_checkpoint`.

    Raises:
        AiaynError: the file differs from its checksum, is missing while the manifest lists it, is corrupt,
            or holds objects that are not plain data.
    """
    directory = checkpoint_dir(path)
    file = directory / STATE_FILE
    verify(directory, STATE_FILE)
    if not file.is_file():
        return None
    try:
        state = torch.load(file, map_location=map_location, weights_only=True)
    except Exception as e:  # torch raises several types (UnpicklingError, RuntimeError, EOFError)
        raise AiaynError(f"{file}: cannot read training state ({e}); the file is corrupt or unsafe") from e
    if not isinstance(state, dict) or "format_version" not in state:
        raise AiaynError(f"{file}: not an aiayn training state; the checkpoint is corrupt")
    return state
