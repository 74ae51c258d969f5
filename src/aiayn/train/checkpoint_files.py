"""A checkpoint directory on disk: its files, its manifest, when it is complete, and how one replaces another.

A directory whose ``manifest.json`` is present and whose files have the listed sizes is *complete*; one
without a manifest but with config and weights is a checkpoint older than manifests (*legacy*), read
unverified. A save writes a temporary sibling (:func:`write_tmp`, manifest last) and puts it in place with
two renames (:func:`commit`): at every instant ``<name>`` is complete, or it is missing and ``<name>.old``
is complete. :func:`checkpoint_dir` finds whichever it is, and :func:`recover_checkpoint` renames
``<name>.old`` back after a save that was cut short. :func:`verify` checks one file against the manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiayn.data.download import sha256_of
from aiayn.errors import AiaynError
from aiayn.train.disk import fsync_dir, fsync_file, trash, write_file

CONFIG_FILE = "config.json"
MODEL_FILE = "model.safetensors"
STATE_FILE = "training_state.pt"
MANIFEST_FILE = "manifest.json"
ALIASES_KEY = "aiayn.aliases"  # metadata of model.safetensors: {dropped name: kept name} of tied tensors
FORMAT_VERSION = 1
OWN_FILES = (CONFIG_FILE, MODEL_FILE, STATE_FILE, MANIFEST_FILE)  # every other file is a tokenizer's


def old_path(path: Path) -> Path:
    """``<path>.old``: where a save moves the previous checkpoint for the instant between its renames."""
    return path.with_name(path.name + ".old")


# ------------------------------------------------------------------------------------- manifest


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


def _read_manifest(directory: Path) -> dict | None:
    """The parsed ``manifest.json`` of ``directory``; None when it has none.

    Raises:
        AiaynError: the manifest is unreadable or malformed.
    """
    file = directory / MANIFEST_FILE
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise AiaynError(f"{file}: cannot read the checkpoint manifest ({e}); the checkpoint is corrupt") from e
    try:
        data = json.loads(text)
        files = data["files"]
        ok = isinstance(data["format_version"], int) and all(
            isinstance(v["size"], int) and isinstance(v["sha256"], str) for v in files.values()
        )
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise AiaynError(
            f"{file}: not a valid checkpoint manifest ({type(e).__name__}: {e}); the checkpoint is corrupt: "
            "use another checkpoint, or delete the manifest to load this one unverified"
        ) from e
    if not ok:
        raise AiaynError(f"{file}: not a valid checkpoint manifest; the checkpoint is corrupt")
    if data["format_version"] > FORMAT_VERSION:
        raise AiaynError(
            f"{file}: checkpoint format {data['format_version']} is newer than this aiayn reads "
            f"({FORMAT_VERSION}); upgrade aiayn"
        )
    return data


_VERIFIED: dict[tuple, str] = {}  # (path, inode, mtime, size) -> sha256 already checked in this process


def verify(directory: Path, name: str) -> None:
    """Check ``directory/name`` against the manifest (size and SHA-256); no manifest: nothing to check.

    Raises:
        AiaynError: the file differs from what was saved, is missing while listed, or was added later.
    """
    manifest = _read_manifest(directory)
    if manifest is None:
        return
    file = directory / name
    entry = manifest["files"].get(name)
    if entry is None:
        if file.exists():
            raise AiaynError(
                f"{file}: not part of this checkpoint (absent from {MANIFEST_FILE}): it was added after the "
                f"save; remove it, or delete {MANIFEST_FILE} to accept the checkpoint as it is"
            )
        return
    try:
        st = file.stat()
        key = (str(file.resolve()), st.st_ino, st.st_mtime_ns, st.st_size)
        if st.st_size == entry["size"] and _VERIFIED.get(key) == entry["sha256"]:
            return
        same = st.st_size == entry["size"] and sha256_of(file) == entry["sha256"]
    except FileNotFoundError:
        raise AiaynError(
            f"{file}: missing, though {MANIFEST_FILE} lists it; the checkpoint is incomplete: restore the "
            "file or use another checkpoint"
        ) from None
    except OSError as e:
        raise AiaynError(f"{file}: cannot read ({e.strerror or e}); give this user read access to it "
                         f"(chmod u+r {file}) or use another checkpoint") from None
    if not same:
        raise AiaynError(
            f"{file}: checksum mismatch: the file is corrupt or was edited; restore it or use another "
            f"checkpoint (or delete {MANIFEST_FILE} to accept a deliberate edit)"
        )
    if len(_VERIFIED) > 256:
        _VERIFIED.clear()
    _VERIFIED[key] = entry["sha256"]


# ------------------------------------------------------------------------ completeness, recovery

_COMPLETE, _LEGACY, _INCOMPLETE, _MISSING = "complete", "legacy", "incomplete", "missing"
_GOOD = (_COMPLETE, _LEGACY)


def holds_checkpoint(target: Path) -> bool:
    """Whether a complete checkpoint can be read at ``target`` (or at ``<target>.old``, where a cut-short save
    left it)."""
    return _status(target) in _GOOD or _status(old_path(target)) in _GOOD


def _status(directory: Path) -> str:
    """``complete`` (valid manifest, every listed file of the listed size), ``legacy`` (no manifest but
    config and weights: a checkpoint older than manifests), ``incomplete`` or ``missing``."""
    if not directory.is_dir():
        return _MISSING
    try:
        manifest = _read_manifest(directory)
    except AiaynError:
        return _INCOMPLETE
    if manifest is None:
        legacy = (directory / CONFIG_FILE).is_file() and (directory / MODEL_FILE).is_file()
        return _LEGACY if legacy else _INCOMPLETE
    for name, entry in manifest["files"].items():
        try:
            if (directory / name).stat().st_size != entry["size"]:
                return _INCOMPLETE
        except OSError:
            return _INCOMPLETE
    return _COMPLETE


def checkpoint_dir(path: str | os.PathLike) -> Path:
    """The directory to read for the checkpoint ``path``; never changes anything on disk.

    ``path`` itself when it is complete; else ``<path>.old`` when that is complete (a save was cut
    short between its two renames); else whichever of the two exists, so that the reader names the
    missing or corrupt file.

    Raises:
        AiaynError: neither ``path`` nor ``<path>.old`` is a directory.
    """
    target = Path(path)
    old = old_path(target)
    if _status(target) in _GOOD:
        return target
    if _status(old) in _GOOD:
        return old
    for candidate in (target, old):
        if candidate.is_dir():
            return candidate
    if target.exists():
        raise AiaynError(f"{target}: is a file, not a checkpoint directory; pass the checkpoint's folder")
    raise AiaynError(
        f"{target}: no checkpoint directory here (nor {old.name}); check the path, or train first"
    )


def checkpoint_file(path: str | os.PathLike, name: str) -> Path:
    """The file ``name`` (e.g. ``"tokenizer.json"``) of the checkpoint ``path``, as :func:`checkpoint_dir`
    resolves it, so that every file of one load comes from the same complete directory, checked against the
    manifest (:func:`verify`).

    Raises:
        AiaynError: no checkpoint directory at ``path``, or the file differs from the checkpoint's manifest.
    """
    directory = checkpoint_dir(path)
    verify(directory, name)
    return directory / name


def recovered_file(path: str | os.PathLike) -> Path:
    """For a file inside a checkpoint directory: the same file in ``<dir>.old`` when ``<dir>`` is missing or
    incomplete and ``<dir>.old`` is complete; otherwise ``path`` unchanged. Never raises."""
    file = Path(path)
    directory = file.parent
    old = old_path(directory)
    if old.is_dir() and _status(directory) not in _GOOD and _status(old) in _GOOD:
        return old / file.name
    return file


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
    from aiayn.train.run_lock import owner

    target = Path(path)
    old = old_path(target)
    if _status(target) in _GOOD or _status(old) not in _GOOD:
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
    caller deletes ``old`` afterwards (:func:`aiayn.train.disk.trash`).

    Raises:
        AiaynError: ``old`` is a folder that is not a checkpoint.
        OSError: a rename failed (``target`` is back in place where it could be).
    """
    if old.is_dir():
        if not _is_ours(old, target, tmp):
            raise AiaynError(f"{old}: exists and is not a checkpoint; refusing to overwrite it, move it away")
        if _status(target) in _GOOD or _status(old) not in _GOOD:
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
