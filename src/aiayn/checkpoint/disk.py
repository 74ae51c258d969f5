"""Writing to disk so that a kill or a full disk never leaves a half-written thing in sight.

- Files are created exclusively, written in full and fsynced (:func:`write_file`); folders are fsynced
  after a rename (:func:`aiayn.files.fsync_dir`).
- Work in progress lives under a hidden sibling name ``.<name>.<kind>-<host>-<pid>-<random>``
  (:func:`aiayn.files.side_name`); a folder is deleted by first renaming it to such a ``trash`` name (:func:`trash`),
  so a half-deleted folder never sits under a name a reader looks at.
- :func:`sweep` deletes the ``tmp`` and ``trash`` folders whose process is gone (same host: the pid no
  longer exists; another host: older than :data:`STALE_AFTER_S`), never those of a process still running.
- :func:`describe_os_error` puts an ``OSError`` in words, with the fix.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from aiayn.files import HOST, SIDE_FOLDER, side_name

STALE_AFTER_S = 24 * 3600  # leftovers of a save on another host are deleted after this long


# ------------------------------------------------------------------------------------ OS errors


def describe_os_error(e: OSError) -> tuple[str, str]:
    """``(cause, fix)`` in words for an ``OSError`` met while writing (``"no space left on device"``, ...)."""
    code = e.errno
    if code in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        cause = "no space left on device" if code == errno.ENOSPC else "disk quota exceeded"
        return cause, "free space on that disk, or choose a folder on another disk"
    if code == errno.EROFS:
        return "read-only file system", "choose a folder on a writable disk"
    if code in (errno.EACCES, errno.EPERM):
        return "permission denied", "make the folder writable for this user, or choose another folder"
    if code in (errno.ENOTDIR, errno.EEXIST):
        return "is a file, not a folder", "remove or rename that file, or choose another folder"
    if code == errno.EIO:
        return "input/output error (the disk may be failing)", "check the disk, or choose another folder"
    if code == errno.ENAMETOOLONG:
        return "file name too long", "choose a shorter path"
    return e.strerror or str(e), "check the folder, or choose another one"


def error_path(e: OSError, default: Path) -> Path:
    """The path an ``OSError`` is about; for "not a folder" errors, the ancestor that is a file."""
    path = Path(e.filename) if isinstance(e.filename, (str, os.PathLike)) else default
    if e.errno in (errno.ENOTDIR, errno.EEXIST):
        for p in (path, *path.parents):
            if p.exists() and not p.is_dir():
                return p
    return path


# ------------------------------------------------------------------------------ files and folders


def fsync_file(path: Path) -> None:
    """fsync a file written by someone else (e.g. copied in)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path: Path, data: bytes) -> None:
    """Create ``path`` (it must not exist), write ``data`` and fsync it; errors are real ``OSError``s."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


# ------------------------------------------------------------------- hidden side folders, sweeping


def _owner_gone(entry: Path, host: str | None, pid: int) -> bool:
    """Whether the process that made the temporary or trash folder ``entry`` no longer runs."""
    try:
        age = time.time() - entry.lstat().st_mtime
    except OSError:
        return False
    if host not in (None, HOST):  # host None: a save older than host names in these folders
        return age > STALE_AFTER_S
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # PermissionError: alive, another user's
        pass
    return age > STALE_AFTER_S  # still "alive" after a day: the pid was reused


_WRITING: set[str] = set()  # names of the temporary folders this process is writing now


@contextmanager
def writing(tmp: Path) -> Iterator[None]:
    """Mark the temporary folder ``tmp`` as being written by this process while the block runs, so that
    :func:`sweep` leaves it alone."""
    _WRITING.add(tmp.name)
    try:
        yield
    finally:
        _WRITING.discard(tmp.name)


def sweep(parent: Path) -> None:
    """Delete the temporary and trash folders in ``parent`` whose process is gone, and this process's own
    leftovers (its trash, and temporary folders of saves that failed and could not remove them)."""
    try:
        entries = list(parent.iterdir())
    except OSError:
        return
    for entry in entries:
        m = SIDE_FOLDER.match(entry.name)
        if m is None or not entry.is_dir():
            continue
        host, pid = m["host"], int(m["pid"])
        ours = host == HOST and pid == os.getpid() and (m["kind"] == "trash" or entry.name not in _WRITING)
        if ours or _owner_gone(entry, host, pid):
            remove_tree(entry)


def remove_tree(path: Path) -> None:
    """Delete a folder; failures are ignored (a later save retries; a hidden leftover harms no reader)."""
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        pass
    except OSError:
        pass  # a later save retries; a leftover under a hidden name harms no reader


def trash(path: Path, target: Path) -> None:
    """Rename ``path`` out of readers' sight (``.<target>.trash-...``), then delete it.

    Raises:
        OSError: the rename failed (``path`` is untouched); failures while deleting are ignored.
    """
    trash_dir = side_name(target, "trash")
    os.rename(path, trash_dir)
    remove_tree(trash_dir)
