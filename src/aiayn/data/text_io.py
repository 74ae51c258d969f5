"""Reading and writing line-oriented UTF-8 text files (plain or gzip), strictly and atomically.

Every corpus in the project goes through :func:`read_lines`: it refuses invalid UTF-8 with the file,
the line and the fix, instead of silently replacing bytes. Writes go to a temporary file in the same
folder that is then renamed over the target, so a crash never leaves half a file behind.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterable
from pathlib import Path

from aiayn.errors import AiaynError, where
from aiayn.files import atomic_write_bytes, atomic_write_text  # noqa: F401  (re-exported)

_BOM = "\ufeff"


def _read_bytes(path: Path) -> bytes:
    """Read a whole file, gunzipping it when its name ends in ``.gz``."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except FileNotFoundError:
        raise AiaynError(
            f"{path}: no such file; check the path (relative paths start at {Path.cwd()})"
        ) from None
    except IsADirectoryError:
        raise AiaynError(f"{path}: is a directory, not a text file; give the path of a file") from None
    except PermissionError:
        raise AiaynError(f"{path}: permission denied; make the file readable (chmod +r)") from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise AiaynError(
            f"{path}: not a valid gzip file ({e}); rename it without the .gz suffix if it is plain text, "
            "or re-download it if it is truncated"
        ) from None


def read_lines(path: str | Path) -> list[str]:
    """Read a UTF-8 text file (``.gz`` by suffix) into a list of lines.

    Only the line terminator is removed (``\\n`` and a ``\\r`` before it); other whitespace is kept.
    Lines are split on ``\\n`` alone, never on other Unicode separators. A UTF-8 byte-order mark at
    the start of the file is dropped. A final newline does not create an extra empty line.

    Args:
        path: the file to read.

    Returns:
        The lines, in order; line ``i`` of the list is line ``i + 1`` of the file.

    Raises:
        AiaynError: the file is missing or unreadable, is a broken gzip, or holds invalid UTF-8 (the
            message names ``path:line`` and how to re-encode the file).
    """
    path = Path(path)
    data = _read_bytes(path)
    try:
        text = data.decode("utf-8", errors="strict")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        bad = data[e.start : e.end].hex(" ")
        fix = f"iconv -f latin1 -t utf-8 {path} > fixed.txt"
        if path.suffix == ".gz":
            fix = f"zcat {path} | iconv -f latin1 -t utf-8 | gzip > fixed.gz"
        raise AiaynError(
            f"{where(path, line)}: invalid UTF-8 (byte(s) {bad} at column {column}); "
            f"re-encode the file as UTF-8, e.g. {fix}"
        ) from None
    if text.startswith(_BOM):
        text = text[1:]
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":  # the file ended with a newline
        lines.pop()
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


def write_lines(path: str | Path, lines: Iterable[str]) -> None:
    """Write one line per item, each ending in ``\\n``, as UTF-8 (gzip when ``path`` ends in ``.gz``).

    The write is atomic (temporary file, then rename). ``read_lines(path)`` returns ``list(lines)``.

    Args:
        path: the destination file.
        lines: the lines, without terminators.

    Raises:
        AiaynError: a line contains a newline (it would silently become two lines).
    """
    path = Path(path)
    lines = list(lines)
    for i, ln in enumerate(lines):
        if "\n" in ln or "\r" in ln:
            raise AiaynError(
                f"{path}: item {i} of the lines to write contains a line break; "
                "replace line breaks inside a line (e.g. with a space) before writing"
            )
    data = "".join(ln + "\n" for ln in lines).encode("utf-8")
    if path.suffix == ".gz":
        data = gzip.compress(data, mtime=0)
    atomic_write_bytes(path, data)
