"""Saving a checkpoint directory atomically: writing it with its manifest and putting it in place of the previous
one.

A save writes a temporary sibling (:func:`write_tmp`, manifest last) and puts it in place with two renames
(:func:`commit`): at every instant ``<name>`` is complete, or it is missing and ``<name>.old`` is complete.
A resumed run renames ``<name>.old`` back after a save that was cut short
(:func:`aiayn.train.restore.recover_checkpoint`, which asks the run lock first). What a reader needs (the
file names, the manifest, completeness, :func:`~aiayn.checkpoint.layout.checkpoint_dir`) is in
:mod:`aiayn.checkpoint.layout`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiayn.checkpoint.disk import fsync_file, trash, write_file
from aiayn.checkpoint.layout import (
    CONFIG_FILE,
    FORMAT_VERSION,
    MANIFEST_FILE,
    MODEL_FILE,
    OWN_FILES,
    STATE_FILE,
    is_readable,
)
from aiayn.errors import AiaynError
from aiayn.files import fsync_dir, sha256_of

# ------------------------------------------------------------------------------------- writing


def write_tmp(tmp: Path, files: dict[str, bytes], tokenizer: Callable[[Path], None] | list[Path]) -> None:
    """Write the checkpoint into ``tmp``: our files, the tokenizers, then the manifest; all fsynced.

    Args:
        tmp: an empty folder.
        files: file name -> bytes for ``config.json``, ``model.safetensors`` and, when given,
            ``training_state.pt``.
        tokenizer: a callable that writes tokenizer files into a folder, or the tokenizer files to copy.

    Raises:
        AiaynError: the tokenizer writer wrote a file with one of the checkpoint's own names.
        OSError: writing failed.
    """
    listed: dict[str, dict[str, Any]] = {}
    for name in (CONFIG_FILE, MODEL_FILE):
        write_file(tmp / name, files[name])
    if callable(tokenizer):
        tokenizer(tmp)
        clash = [n for n in (STATE_FILE, MANIFEST_FILE) if (tmp / n).exists()]
        if clash:
            raise AiaynError(f"the tokenizer writer wrote {clash} into {tmp}; those names are the checkpoint's own")
    else:
        for src in tokenizer:
            shutil.copyfile(src, tmp / src.name)
    for file in sorted(tmp.rglob("*")):
        name = file.relative_to(tmp).as_posix()
        if file.is_file() and name not in files:
            fsync_file(file)
            listed[name] = {"size": file.stat().st_size, "sha256": sha256_of(file)}
    if STATE_FILE in files:
        write_file(tmp / STATE_FILE, files[STATE_FILE])
    for name, data in files.items():
        listed[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest = {"format_version": FORMAT_VERSION, "files": dict(sorted(listed.items()))}
    write_file(tmp / MANIFEST_FILE, (json.dumps(manifest, indent=2) + "\n").encode("utf-8"))
    fsync_dir(tmp)


# ------------------------------------------------------------------------------------ replacing


def _looks_like_checkpoint(path: Path) -> bool:
    return any((path / name).is_file() for name in OWN_FILES)


def check_target(target: Path, old: Path) -> None:
    """Refuse to replace a file, or a folder the user made that is not a checkpoint.

    Raises:
        AiaynError: ``target`` or ``old`` is a file, or ``target`` is a non-empty folder that is not a
            checkpoint.
    """
    for existing in (target, old):
        if existing.exists() and not existing.is_dir():
            raise AiaynError(
                f"{existing}: is a file, not a folder; cannot save the checkpoint {target}: remove or rename "
                "that file, or choose another checkpoint path"
            )
    if target.is_dir() and any(target.iterdir()) and not _looks_like_checkpoint(target):
        raise AiaynError(f"{target}: exists and is not a checkpoint; refusing to overwrite it, choose another path")


def _is_ours(old: Path, target: Path, tmp: Path) -> bool:
    """Whether ``old`` is a leftover of an earlier save (possibly half deleted), not a user's folder."""
    names = {p.name for p in old.iterdir()}
    if not names or _looks_like_checkpoint(old):
        return True
    known = set(OWN_FILES) | {p.name for p in tmp.iterdir()}
    if target.is_dir():
        known |= {p.name for p in target.iterdir()}
    return names <= known


def commit(tmp: Path, target: Path, old: Path) -> None:
    """Put the complete ``tmp`` in place of ``target``; at every instant ``target`` or ``old`` is complete.

    An existing ``target`` is renamed to ``old`` first, and renamed back when the second rename fails. The
    caller deletes ``old`` afterwards (:func:`aiayn.checkpoint.disk.trash`).

    Raises:
        AiaynError: ``old`` is a folder that is not a checkpoint.
        OSError: a rename failed (``target`` is back in place where it could be).
    """
    if old.is_dir():
        if not _is_ours(old, target, tmp):
            raise AiaynError(f"{old}: exists and is not a checkpoint; refusing to overwrite it, move it away")
        if is_readable(target) or not is_readable(old):
            trash(old, target)  # a stale .old beside a good checkpoint
        elif target.is_dir():
            trash(target, target)  # a broken checkpoint beside the good .old: keep the good one for now
        # else: the save before was cut short between its renames; .old is deleted once the new one is in place
    moved = False
    if target.is_dir():
        os.rename(target, old)
        moved = True
    try:
        os.rename(tmp, target)
    except BaseException:
        if moved:
            try:
                os.rename(old, target)
            except OSError:
                pass  # readers still find the previous checkpoint at .old
        raise
    fsync_dir(target.parent)
