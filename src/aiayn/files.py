"""Writing a file so that a reader sees the old file or the whole new one, never a part, with the permissions an
ordinary ``open()`` would give it (the umask's); a file's SHA-256; parsing JSON with every failure in words.

Only the standard library: every package may import it without an import cycle.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import tempfile
import uuid
from pathlib import Path
from typing import Any

HOST = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"  # no "-": it separates a side name's parts
#: a hidden side folder of :func:`side_name`: ``.<name>.<kind>-<host>-<pid>-<random>`` (older ones have no host)
SIDE_FOLDER = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|trash)-(?:(?P<host>[A-Za-z0-9._]+)-)?(?P<pid>\d+)"
                         r"-[0-9a-f]{8}$")


def side_name(target: str | Path, kind: str) -> Path:
    """A hidden sibling ``.<name>.<kind>-<host>-<pid>-<random>`` of ``target`` that only this process uses (``kind``
    "tmp" or "trash"; savers sweep such folders up once their process is gone)."""
    target = Path(target)
    return target.parent / f".{target.name}.{kind}-{HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def umask() -> int:
    """This process's umask (read without changing it where Linux tells it, in ``/proc/self/status``)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere reading the umask means setting it; set it straight back
    os.umask(mask)
    return mask


def default_file_mode() -> int:
    """The mode ``open(path, "w")`` gives a new file under the process's umask (usually 0o644)."""
    return 0o666 & ~umask()


def as_umask_allows(file: str | os.PathLike) -> None:
    """Give ``file`` the mode a new file gets under the umask (0644 under 022): for files a library writes with a
    mode of its own (safetensors' ``save_file`` writes 0600)."""
    os.chmod(file, default_file_mode())


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: a temporary file in the same folder, fsynced, then a rename.

    Parent folders are created. Either the old file or the complete new one exists at every moment, and the new
    one has the umask's mode (a temporary file alone would be 0o600).

    Args:
        path: the destination file.
        data: the bytes to write.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, default_file_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` as UTF-8 to ``path`` atomically (see :func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def sha256_of(path: str | Path | int) -> str:
    """Hex SHA-256 of a file (a path, or an open file descriptor, read from its start), read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(os.dup(path) if isinstance(path, int) else path, "rb") as f:
        f.seek(0)
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fsync_dir(path: str | Path) -> None:
    """fsync a directory, so that the renames in it last (best effort: not every file system supports it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class BadJSON(ValueError):
    """What :func:`parse_json` could not read: ``detail`` in words (``Expecting value``, ``nested too deeply ...``),
    ``line`` where there is one. Callers say it with the file's name and the fix (``<file>:<line>: not valid JSON
    (<detail>); ...``)."""

    def __init__(self, detail: str, line: int | None = None) -> None:
        super().__init__(detail)
        self.detail, self.line = detail, line


def parse_json(text: str | bytes) -> Any:
    """``json.loads`` whose every failure is one :class:`BadJSON`: a syntax error (with its line), bytes that are not
    text, and nesting deeper than the parser follows (Python raises ``RecursionError`` a thousand levels down).

    Raises:
        BadJSON: what is wrong, in words.
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise BadJSON(e.msg, e.lineno) from None
    except RecursionError:
        raise BadJSON("nested too deeply to read: thousands of [ or { inside each other, where no file of aiayn's "
                      "nests more than a few") from None
    except UnicodeDecodeError as e:
        raise BadJSON(f"not UTF-8 text: {e.reason} at byte {e.start}") from None


def manifest_entries(data: Any) -> dict[str, dict[str, Any]] | None:
    """The ``files`` of a parsed manifest (``manifest.json`` of a checkpoint, ``aiayn-output.json`` of other output):
    relative path -> ``{"size": int, "sha256": str}``, when ``data`` has a manifest's shape (an integer
    ``format_version`` too); None when it has not."""
    files = data.get("files") if isinstance(data, dict) and isinstance(data.get("format_version"), int) else None
    if not isinstance(files, dict) or not all(
            isinstance(k, str) and isinstance(v, dict) and isinstance(v.get("size"), int)
            and isinstance(v.get("sha256"), str) for k, v in files.items()):
        return None
    return files
