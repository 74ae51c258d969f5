"""A checkpoint directory as readers find it: its file names, its manifest, when it is complete, and where a save
that was cut short left it.

A directory whose ``manifest.json`` is present and whose files have the listed sizes is *complete*; one
without a manifest but with config and weights is a checkpoint older than manifests (*legacy*), read
unverified. A save (:mod:`aiayn.checkpoint.atomic`) puts a new checkpoint in place with two renames, so
that at every instant ``<name>`` is complete, or it is missing and ``<name>.old`` is complete:
:func:`checkpoint_dir` finds whichever it is, :func:`recovered_file` does the same for one file of it (a
tokenizer's), and :func:`verify` checks one file against the manifest. A load reads every file through one
:class:`CheckpointRead`: one directory, its manifest read once, unchanged by the saves that replace it meanwhile.

Only the standard library, :mod:`aiayn.errors` and :mod:`aiayn.files`: every package that reads a checkpoint's
files (tokenizers included) may import it.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import BinaryIO, TypeVar

from aiayn.errors import AiaynError, where
from aiayn.files import BadJSON, manifest_entries, parse_json, sha256_of

CONFIG_FILE = "config.json"
MODEL_FILE = "model.safetensors"
STATE_FILE = "training_state.pt"
MANIFEST_FILE = "manifest.json"
ALIASES_KEY = "aiayn.aliases"  # metadata of model.safetensors: {dropped name: kept name} of tied tensors
FORMAT_VERSION = 1
OWN_FILES = (CONFIG_FILE, MODEL_FILE, STATE_FILE, MANIFEST_FILE)  # every other file is a tokenizer's


def tokenizer_files(directory: Path) -> list[Path]:
    """A checkpoint directory's tokenizer files: every file but its own (:data:`OWN_FILES`), sorted."""
    return [f for f in sorted(directory.iterdir()) if f.is_file() and f.name not in OWN_FILES]


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
        data = file.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise AiaynError(f"{file}: cannot read the checkpoint manifest ({e}); the checkpoint is corrupt") from e
    return _parse_manifest(data, file)


def _parse_manifest(data: bytes, file: Path) -> dict:
    """The checked contents of the manifest ``file`` (its bytes ``data``).

    Raises:
        AiaynError: the manifest is not JSON, not nested as a manifest is, or from a newer aiayn.
    """
    try:
        data = parse_json(data)
    except BadJSON as e:
        raise AiaynError(
            f"{where(file, e.line)}: not a valid checkpoint manifest ({e.detail}); the checkpoint is corrupt: use "
            "another checkpoint, or delete the manifest to load this one unverified"
        ) from None
    if manifest_entries(data) is None:
        raise AiaynError(f"{file}: not a valid checkpoint manifest (an integer format_version and files, each with "
                         "an integer size and a sha256, are needed); the checkpoint is corrupt: use another "
                         "checkpoint, or delete the manifest to load this one unverified")
    if data["format_version"] > FORMAT_VERSION:
        raise AiaynError(
            f"{file}: checkpoint format {data['format_version']} is newer than this aiayn reads "
            f"({FORMAT_VERSION}); upgrade aiayn"
        )
    return data


_VERIFIED: dict[tuple, str] = {}  # (path, inode, mtime, size) -> sha256 already checked in this process


def verify(directory: Path, name: str) -> None:
    """Check ``directory/name`` against the manifest (size and SHA-256); no manifest: nothing to check. (A load reads
    through :class:`CheckpointRead`, which checks each file it reads; this is for files read by other means.)

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
            raise _unlisted(file)
        return
    try:
        st = file.stat()
    except FileNotFoundError:
        raise _missing(file) from None
    except OSError as e:
        raise _unreadable(file, e) from None
    _check_entry(file, st, file, entry)


def _check_entry(file: Path, st: os.stat_result, source: Path | int, entry: dict) -> None:
    """Check the file ``file`` (``st`` its status; read from ``source``, its path or an open descriptor) against its
    manifest ``entry``; a file this process checked already, unchanged since, is not read again.

    Raises:
        AiaynError: the size or the SHA-256 differs, or the file cannot be read.
    """
    key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
    if st.st_size == entry["size"] and _VERIFIED.get(key) == entry["sha256"]:
        return
    try:
        same = st.st_size == entry["size"] and sha256_of(source) == entry["sha256"]
    except OSError as e:
        raise _unreadable(file, e) from None
    if not same:
        raise _mismatch(file)
    if len(_VERIFIED) > 256:
        _VERIFIED.clear()
    _VERIFIED[key] = entry["sha256"]


def _unlisted(file: Path) -> AiaynError:
    return AiaynError(f"{file}: not part of this checkpoint (absent from {MANIFEST_FILE}): it was added after the "
                      f"save; remove it, or delete {MANIFEST_FILE} to accept the checkpoint as it is")


def _missing(file: Path) -> AiaynError:
    return AiaynError(f"{file}: missing, though {MANIFEST_FILE} lists it; the checkpoint is incomplete: restore the "
                      "file or use another checkpoint")


def _unreadable(file: Path, e: OSError) -> AiaynError:
    return AiaynError(f"{file}: cannot read ({e.strerror or e}); give this user read access to it "
                      f"(chmod u+r {file}) or use another checkpoint")


def _mismatch(file: Path) -> AiaynError:
    return AiaynError(f"{file}: checksum mismatch: the file is corrupt or was edited; restore it or use another "
                      f"checkpoint (or delete {MANIFEST_FILE} to accept a deliberate edit)")


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
    resolves it, checked against the manifest of its directory (:class:`CheckpointRead`). A caller that opens the
    path later reads whatever is there then; a load that reads several files reads them through one
    :class:`CheckpointRead`.

    Raises:
        AiaynError: no checkpoint directory at ``path``, or the file differs from the checkpoint's manifest.
    """
    with CheckpointRead(path) as ck:
        ck.check(name)
        return ck.file(name)


def recovered_file(path: str | os.PathLike) -> Path:
    """For a file inside a checkpoint directory: the same file in ``<dir>.old`` when ``<dir>`` is missing or
    incomplete and ``<dir>.old`` is complete; otherwise ``path`` unchanged. Never raises."""
    file = Path(path)
    directory = file.parent
    old = old_path(directory)
    if old.is_dir() and _status(directory) not in _GOOD and _status(old) in _GOOD:
        return old / file.name
    return file


# ------------------------------------------------------------------------ reading one checkpoint consistently

T = TypeVar("T")
_DIR_FDS = os.open in os.supports_dir_fd and hasattr(os, "O_DIRECTORY")  # files opened inside an open directory
_PROC_FD = Path("/proc/self/fd")  # Linux: a path that opens what a descriptor holds, whatever was renamed since


class CheckpointRead:
    """One checkpoint read as one save wrote it, while other saves may replace it.

    A save puts a new directory at ``<name>`` with two renames and then deletes the previous one (``<name>`` ->
    ``<name>.old`` -> trash), so a reader that resolves the directory, or reads the manifest, once per file can mix
    the files of two saves. This pins one directory: it opens the directory :func:`checkpoint_dir` finds, reads its
    manifest once, and opens every file at its top level at once (those the manifest lists; all of them in a
    checkpoint older than manifests), so that later renames and deletions change nothing it reads. When the
    directory moved while it was being pinned (a save committed in that instant), it is pinned again, up to
    :attr:`TRIES` times; then one error says that the checkpoint was rewritten while being read. Each file is checked
    against its own directory's manifest as it is read, so a mismatch means the file is corrupt.

    Use it as a context manager; the loaders (:mod:`aiayn.checkpoint.load`) take it in place of a path
    (:func:`read_checkpoint`).

    Attributes:
        path: the checkpoint as the caller named it.
        directory: the directory pinned (``path``, or ``<path>.old`` after a save cut short), for messages.
        manifest: its parsed manifest; None for a checkpoint older than manifests.

    Raises:
        AiaynError: no checkpoint at ``path``, an unreadable directory or manifest, or a checkpoint replaced during
            every try.
    """

    TRIES = 5

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._fds: dict[str, int | OSError | None] = {}  # file name -> descriptor, the error opening it, or None
        self._dir: int | None = None
        self._stat: os.stat_result | None = None
        for _ in range(self.TRIES):
            self.directory = checkpoint_dir(self.path)
            try:
                self._pin()
                error = None
            except AiaynError as e:
                error = e
            except OSError as e:
                error = _unreadable(self.directory, e)
            if self._in_place():
                if error is None:
                    return
                self.close()
                raise error
            self.close()
        raise AiaynError(f"{self.path}: the checkpoint was rewritten while being read ({self.TRIES} tries): another "
                         "process saves it over and over (a training run saving it every step?); retry, or read a "
                         "checkpoint that is not being written (best/ or step-N/ beside it)")

    def _pin(self) -> None:
        """Open the directory, read its manifest and open its files (a file already gone is left unopened)."""
        self._stat, self.manifest = None, None
        self._stat = os.stat(self.directory)
        if _DIR_FDS:
            self._dir = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        raw = self._read(MANIFEST_FILE)
        if raw is None and (self.directory / MANIFEST_FILE).is_dir():
            raise AiaynError(f"{self.file(MANIFEST_FILE)}: cannot read the checkpoint manifest (a folder, not a "
                             "file); the checkpoint is corrupt: use another checkpoint")
        self.manifest = None if raw is None else _parse_manifest(raw, self.file(MANIFEST_FILE))
        if self.manifest is not None:
            names = [n for n in self.manifest["files"] if "/" not in n]
        else:
            with os.scandir(self.directory if self._dir is None else self._dir) as entries:
                names = [e.name for e in entries if e.is_file()]
        for name in names:
            self._fds[name] = self._opened(name)

    def _in_place(self) -> bool:
        """Whether the directory at :attr:`directory` is still the one pinned (a save renames it away)."""
        try:
            now = os.stat(self.directory)
        except FileNotFoundError:
            return False
        except OSError:
            return True  # not a move: the error is the reader's to report
        pinned = os.fstat(self._dir) if self._dir is not None else self._stat
        return pinned is not None and (now.st_dev, now.st_ino) == (pinned.st_dev, pinned.st_ino)

    def _open(self, name: str) -> int | None:
        """The open descriptor of ``name`` in the pinned directory; None when there is no such file.

        Raises:
            AiaynError: the file cannot be opened (said only when it is asked for: a reader that does not need it
                is not stopped by it).
        """
        if name not in self._fds:
            self._fds[name] = self._opened(name)
        fd = self._fds[name]
        if isinstance(fd, OSError):
            raise _unreadable(self.file(name), fd)
        return fd

    def _opened(self, name: str) -> int | OSError | None:
        try:
            fd = (os.open(self.directory / name, os.O_RDONLY) if self._dir is None
                  else os.open(name, os.O_RDONLY, dir_fd=self._dir))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            return e
        if stat.S_ISDIR(os.fstat(fd).st_mode):  # a folder where a file should be: no such file
            os.close(fd)
            return None
        return fd

    def _read(self, name: str) -> bytes | None:
        try:
            with self.open_file(name) or nullcontext() as f:
                return None if f is None else f.read()
        except OSError as e:
            raise _unreadable(self.file(name), e) from None

    def _entry(self, name: str) -> dict | None:
        """The manifest's entry for ``name``; None when there is nothing to check (no manifest, or an unlisted
        file that is absent).

        Raises:
            AiaynError: ``name`` is listed but missing, or present but not listed.
        """
        if self.manifest is None:
            return None
        entry = self.manifest["files"].get(name)
        if entry is None and self.has(name):
            raise _unlisted(self.file(name))
        if entry is not None and not self.has(name):
            raise _missing(self.file(name))
        return entry

    def file(self, name: str) -> Path:
        """``name``'s path in the pinned directory, for messages."""
        return self.directory / name

    def has(self, name: str) -> bool:
        """Whether the pinned directory holds the file ``name``."""
        return self._open(name) is not None

    def check(self, name: str, data: bytes | None = None) -> None:
        """Check ``name`` against the manifest: its size and SHA-256, or those of ``data``, its bytes as the caller
        read them (:meth:`read_bytes`). A file this process checked already is not read again.

        Raises:
            AiaynError: the file differs from what was saved, is missing while listed, or was added later.
        """
        entry = self._entry(name)
        if entry is None:
            return
        if data is not None:
            if len(data) != entry["size"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
                raise _mismatch(self.file(name))
            return
        fd = self._open(name)
        _check_entry(self.file(name), os.fstat(fd), fd, entry)

    def read_bytes(self, name: str, check: bool = True) -> bytes | None:
        """The bytes of ``name``, checked against the manifest unless ``check`` is false (the caller then calls
        :meth:`check` with them, e.g. after saying what is wrong with their JSON); None when the checkpoint has no
        such file.

        Raises:
            AiaynError: the file differs from what was saved, is missing while listed, or was added later.
        """
        if check:
            self._entry(name)  # listed but missing, or not listed: said before anything is read
        data = self._read(name)
        if check and data is not None:
            self.check(name, data)
        return data

    def open_file(self, name: str) -> BinaryIO | None:
        """The pinned file ``name``, opened for reading from its start (unchecked: e.g. for a look at a header); None
        when the checkpoint has no such file."""
        fd = self._open(name)
        if fd is None:
            return None
        f = open(os.dup(fd), "rb")
        f.seek(0)
        return f

    def os_path(self, name: str) -> Path | None:
        """A path that opens the pinned file ``name``, checked against the manifest, for a library that opens files
        by path (safetensors): ``/proc/self/fd/N`` on Linux; elsewhere the file in the directory (a save that
        replaces the checkpoint between the check and the library's open goes unnoticed there). None when absent.

        Raises:
            AiaynError: as :meth:`check`.
        """
        self.check(name)
        fd = self._open(name)
        if fd is None:
            return None
        return _PROC_FD / str(fd) if _PROC_FD.is_dir() else self.file(name)

    def close(self) -> None:
        """Close every descriptor (the files stay as they are)."""
        for fd in self._fds.values():
            if isinstance(fd, int):
                os.close(fd)
        self._fds.clear()
        if self._dir is not None:
            os.close(self._dir)
            self._dir = None

    def __enter__(self) -> CheckpointRead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_checkpoint(source: str | os.PathLike | CheckpointRead, read: Callable[[CheckpointRead], T]) -> T:
    """``read(ck)`` of the checkpoint ``source``: a :class:`CheckpointRead` as it is (several reads of one load), or
    a path, pinned for this one read."""
    if isinstance(source, CheckpointRead):
        return read(source)
    with CheckpointRead(source) as ck:
        return read(ck)
