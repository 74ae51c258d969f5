"""Saving a checkpoint so that a kill at any instruction, or a full disk, leaves one that loads.

Everything is serialized in memory first (a bad config, an unsafe ``train_state`` or NaN/inf weights are
refused before the disk is touched), then written into a hidden temporary sibling and put in place by
:func:`~aiayn.checkpoint.atomic.commit`. Every ``OSError`` becomes one :class:`AiaynError` naming the
path and the cause in words.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from torch import nn

from aiayn.checkpoint.atomic import check_target, commit, write_tmp
from aiayn.checkpoint.disk import describe_os_error, error_path, remove_tree, sweep, trash, writing
from aiayn.checkpoint.layout import (
    ALIASES_KEY,
    CONFIG_FILE,
    FORMAT_VERSION,
    MODEL_FILE,
    OWN_FILES,
    STATE_FILE,
    holds_checkpoint,
    old_path,
)
from aiayn.checkpoint.load import first_non_finite
from aiayn.checkpoint.rng_state import capture_rng
from aiayn.errors import AiaynError
from aiayn.files import side_name
from aiayn.output_folder import OutputFolder, merge_into

TokenizerWriter = Callable[[Path], None] | Iterable[str | os.PathLike]
_RESERVED = ("optimizer", "scheduler", "format_version")
_PLAIN = (str, int, float, bool, type(None), torch.Tensor)


def _check_plain(value: Any, where: str) -> None:
    """Refuse values that ``torch.load(weights_only=True)`` would not read back."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, (str, int)):
                raise AiaynError(f"train_state{where}: key {k!r} must be a str or int")
            _check_plain(v, f"{where}[{k!r}]")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_plain(v, f"{where}[{i}]")
    elif not isinstance(value, _PLAIN):
        raise AiaynError(
            f"train_state{where}: {type(value).__name__} cannot be stored safely; use numbers, strings, "
            "lists, dicts or tensors"
        )


def _dedupe(state_dict: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Store each shared tensor once: ``(tensors, aliases)`` with ``aliases[dropped] = kept``."""
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for name, t in state_dict.items():
        t = t.detach()
        key = (t.device, t.dtype, t.data_ptr(), tuple(t.shape), t.stride())
        if t.numel() > 0 and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        tensors[name] = t
    # Distinct tensors that still overlap in memory (views of one storage) are copied apart.
    owners: dict[tuple, int] = {}
    for t in tensors.values():
        if t.numel() > 0:
            sk = (t.device, t.untyped_storage().data_ptr())
            owners[sk] = owners.get(sk, 0) + 1
    for name, t in list(tensors.items()):
        shared = t.numel() > 0 and owners[(t.device, t.untyped_storage().data_ptr())] > 1
        tensors[name] = t.clone().contiguous() if shared else t.contiguous()
    return tensors, aliases


def _serialize(
    target: Path,
    model: nn.Module | Mapping[str, torch.Tensor],
    config: dict,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any | None,
    train_state: dict | None,
) -> dict[str, bytes]:
    """Every file of the checkpoint but the tokenizers and the manifest, as bytes; refuses bad input."""
    try:
        text = json.dumps(config, indent=2, ensure_ascii=False)
    except (TypeError, ValueError) as e:
        raise AiaynError(f"checkpoint config is not JSON-serializable ({e}); pass plain values") from e
    state_dict = model if isinstance(model, Mapping) else model.state_dict()
    bad = first_non_finite(state_dict)
    if bad is not None:
        earlier = ("resume from the earlier checkpoint there, which is unchanged" if holds_checkpoint(target)
                   else "train again (no earlier checkpoint is there)")
        raise AiaynError(f"{target}: not saved: tensor {bad} holds NaN/inf, the run diverged; lower the learning "
                         f"rate or clip gradients, and {earlier}")
    tensors, aliases = _dedupe(state_dict)
    tensors = {k: v.contiguous() for k, v in tensors.items()}  # e.g. column-major inference weights
    files = {
        CONFIG_FILE: (text + "\n").encode("utf-8"),
        MODEL_FILE: safetensors.torch.save(tensors, metadata={ALIASES_KEY: json.dumps(aliases)}),
    }
    if optimizer is not None or scheduler is not None or train_state is not None:
        extra = dict(train_state or {})
        clash = [k for k in _RESERVED if k in extra]
        if clash:
            raise AiaynError(f"train_state uses reserved key(s) {clash}; rename them")
        extra.setdefault("rng", capture_rng())
        _check_plain(extra, "")
        state = {
            "format_version": FORMAT_VERSION,
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            **extra,
        }
        buffer = io.BytesIO()
        torch.save(state, buffer)  # in memory: a full disk then raises a real OSError, not torch's own
        files[STATE_FILE] = buffer.getvalue()
    return files


def _tokenizer_source(tokenizer_writer: TokenizerWriter | None) -> Callable[[Path], None] | list[Path]:
    """The tokenizer callback, or the checked list of tokenizer files to copy."""
    if tokenizer_writer is None:
        return []
    if callable(tokenizer_writer):
        return tokenizer_writer
    sources = [Path(src) for src in tokenizer_writer]
    for src in sources:
        if not src.is_file():
            raise AiaynError(f"{src}: tokenizer file not found; pass existing tokenizer file paths")
        if src.name in OWN_FILES:
            raise AiaynError(f"{src}: a tokenizer file may not be named {src.name}; rename it")
    return sources


def _save_error(target: Path, e: OSError) -> AiaynError:
    cause, fix = describe_os_error(e)
    before = ("a previous checkpoint there is unchanged and still loads" if holds_checkpoint(target)
              else "no checkpoint was there before, and none is left half-written")
    return AiaynError(f"{error_path(e, target)}: {cause}; cannot save the checkpoint {target}: {fix} ({before})")


def save_checkpoint(
    path: str | os.PathLike,
    model: nn.Module | Mapping[str, torch.Tensor],
    config: dict,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    train_state: dict | None = None,
    tokenizer_writer: TokenizerWriter | None = None,
    shard_writer: Callable[[Path], None] | None = None,
    into: OutputFolder | None = None,
) -> Path:
    """Write a checkpoint directory so that a kill at any point leaves a loadable one (:mod:`aiayn.checkpoint`).

    ``training_state.pt`` is written when any of ``optimizer``, ``scheduler`` or ``train_state`` is
    given; the RNG states are captured at this call unless ``train_state`` has an ``"rng"`` entry. The
    weights and the training state are serialized in memory first (extra memory of their size).

    Args:
        path: the checkpoint directory to create or replace.
        model: the model, or a state dict; the state dict goes to ``model.safetensors``.
        config: JSON-serializable dict for ``config.json``.
        optimizer: optimizer whose ``state_dict()`` is saved.
        scheduler: anything with ``state_dict()`` (e.g. ``LambdaLR``).
        train_state: step, epoch, data position and other plain data (numbers, strings, lists, dicts,
            tensors); the keys ``optimizer``, ``scheduler`` and ``format_version`` are reserved.
        tokenizer_writer: a callable ``f(directory)`` that writes tokenizer files into the directory,
            or an iterable of file paths to copy in.
        shard_writer: a callable ``f(directory)`` that writes more files into the temporary folder before the
            other files and the manifest (a sharded run's ``dcp/`` folder, written by every rank:
            :mod:`aiayn.train.dcp_checkpoint`); the manifest lists them.
        into: ``path`` as :func:`aiayn.output_folder.check_output_folder` checked it for a command that writes a
            checkpoint where the user says (``aiayn convert --from-hf``, ``aiayn average``): a folder that holds
            more than an earlier checkpoint then gets the checkpoint's files one by one, every other file left as
            it is (:func:`aiayn.output_folder.merge_into`). None: the run's own folders, replaced as a whole.

    Returns:
        The checkpoint directory.

    Raises:
        AiaynError: unserializable config or state, NaN/inf in a floating-point tensor of the model, missing
            tokenizer files, ``path`` being a file or an existing directory that is not a checkpoint (never
            overwritten), or any ``OSError`` while writing (no space, read-only, permission, ...), named in
            words. Nothing is replaced when it is raised.
    """
    target = Path(path)
    old = old_path(target)
    files = _serialize(target, model, config, optimizer, scheduler, train_state)
    tokenizer = _tokenizer_source(tokenizer_writer)
    merge = into is not None and not into.whole
    try:
        if not merge:
            check_target(target, old)
        target.parent.mkdir(parents=True, exist_ok=True)
        sweep(target.parent)
        tmp = side_name(target, "tmp")
        with writing(tmp):
            try:
                os.mkdir(tmp)
                if shard_writer is not None:
                    shard_writer(tmp)
                write_tmp(tmp, files, tokenizer)
                if merge:
                    merge_into(tmp, into)
                else:
                    commit(tmp, target, old)
            except BaseException:
                remove_tree(tmp)
                raise
    except OSError as e:
        raise _save_error(target, e) from e
    if old.is_dir():
        try:
            trash(old, target)
        except OSError:
            pass  # the next save removes it
    return target
