"""A checkpoint directory as readers find it: its file names, its manifest, when it is complete, and where a save
that was cut short left it.

A directory whose ``manifest.json`` is present and whose files have the listed sizes is *complete*; one
without a manifest but with config and weights is a checkpoint older than manifests (*legacy*), read
unverified. A save (:mod:`aiayn.train.checkpoint_files`) puts a new checkpoint in place with two renames, so
that at every instant ``<name>`` is complete, or it is missing and ``<name>.old`` is complete:
:func:`checkpoint_dir` finds whichever it is, :func:`recovered_file` does the same for one file of it (a
tokenizer's), and :func:`verify` checks one file against the manifest.

Only the standard library, :mod:`aiayn.errors` and :mod:`aiayn.files`: every package that reads a checkpoint's
files (tokenizers included) may import it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from aiayn.errors import AiaynError
from aiayn.files import sha256_of

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


# ----------------------------------------------------------------- completeness, the previous copy

_COMPLETE, _LEGACY, _INCOMPLETE, _MISSING = "complete", "legacy", "incomplete", "missing"
_GOOD = (_COMPLETE, _LEGACY)


def is_readable(directory: Path) -> bool:
    """Whether ``directory`` holds a checkpoint that loads: complete, or legacy (no manifest, config and weights)."""
    return _status(directory) in _GOOD


def holds_checkpoint(target: Path) -> bool:
    """Whether a complete checkpoint can be read at ``target`` (or at ``<target>.old``, where a cut-short save
    left it)."""
    return is_readable(target) or is_readable(old_path(target))


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
