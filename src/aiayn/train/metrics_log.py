"""Append-only metrics log: one JSON object per line (``.jsonl``) or one CSV row (``.csv``).

Every record is flushed as it is written, so a crash loses at most the record being written, and a
resumed run appends to the same file.

CSV and new keys: the header comes from the first record's keys. A later record with keys the header
lacks (e.g. ``val_loss`` first appearing at the first evaluation) makes the logger rewrite the file
once with the widened header (via a temporary file and an atomic rename); earlier rows get empty
cells there. Keys a record lacks are written as empty cells and are absent from what
:func:`read_metrics` returns for that row.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from aiayn.data.text_io import atomic_write_text
from aiayn.errors import AiaynError, where
from aiayn.files import BadJSON, parse_json

FORMATS = (".jsonl", ".csv")


def _plain(value: Any) -> Any:
    """Tensors and NumPy scalars become Python numbers; other values pass through."""
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        return value.item()
    return value


def _format_of(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise AiaynError(f"{path}: metrics file must end in .jsonl or .csv")
    return suffix


def _parse_cell(text: str) -> Any:
    """CSV cell back to a value: int, float (incl. nan/inf), true/false, or the string."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        pass
    return {"True": True, "False": False}.get(text, text)


class MetricsLogger:
    """Append metric records to a ``.jsonl`` or ``.csv`` file, flushing each one.

    Args:
        path: the log file; parent folders are created; an existing file is appended to.

    Example:
        >>> with MetricsLogger("runs/x/metrics.jsonl") as log:  # doctest: +SKIP
        ...     log.log({"step": 100, "train_loss": 3.2})
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.format = _format_of(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._header: list[str] | None = None
        self._drop_partial_line()
        if self.format == ".csv" and self.path.is_file() and self.path.stat().st_size > 0:
            with self.path.open(newline="", encoding="utf-8") as f:
                self._header = next(csv.reader(f), None)
        self._file: io.TextIOWrapper = self.path.open("a", newline="", encoding="utf-8")

    def _drop_partial_line(self) -> None:
        """Cut a last line left unfinished by a crash, so the file ends with a whole record."""
        if not self.path.is_file() or self.path.stat().st_size == 0:
            return
        data = self.path.read_bytes()
        if not data.endswith(b"\n"):
            with self.path.open("rb+") as f:
                f.truncate(data.rfind(b"\n") + 1)

    def log(self, record: Mapping[str, Any] | None = None, **fields: Any) -> None:
        """Append one record: ``record`` merged with ``fields`` (fields win).

        Values should be numbers, strings, booleans or None; 0-d tensors and NumPy scalars are
        converted.
        """
        row = {str(k): _plain(v) for k, v in {**(record or {}), **fields}.items()}
        if self.format == ".jsonl":
            self._file.write(json.dumps(row, ensure_ascii=False) + "\n")
        else:
            self._write_csv(row)
        self._file.flush()

    __call__ = log

    def _write_csv(self, row: dict[str, Any]) -> None:
        if self._header is None:
            self._header = list(row)
            csv.writer(self._file, lineterminator="\n").writerow(self._header)
        new = [k for k in row if k not in self._header]
        if new:
            self._widen(self._header + new)
        cells = ["" if row.get(k) is None else row[k] for k in self._header]
        csv.writer(self._file, lineterminator="\n").writerow(cells)

    def _widen(self, header: list[str]) -> None:
        """Rewrite the CSV with a wider header (atomic rename), then reopen for appending."""
        self._file.close()
        _rewrite(self.path, read_metrics(self.path), header)
        self._header = header
        self._file = self.path.open("a", newline="", encoding="utf-8")

    def close(self) -> None:
        """Close the file (further :meth:`log` calls fail)."""
        self._file.close()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read every record of a ``.jsonl`` or ``.csv`` metrics file.

    A last line cut short by a crash (no final newline) is skipped; any other unreadable line is an
    error. Opening a :class:`MetricsLogger` on such a file cuts that partial line off.

    Returns:
        One dict per record; CSV cells are parsed back to int/float/bool/str, empty cells dropped.

    Raises:
        AiaynError: missing file, or a corrupt line (named by path and line).
    """
    p = Path(path)
    fmt = _format_of(p)
    if not p.is_file():
        raise AiaynError(f"{p}: metrics file not found")
    text = p.read_text(encoding="utf-8")
    lines = text.splitlines()
    records: list[dict[str, Any]] = []
    if fmt == ".jsonl":
        for i, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                obj = parse_json(line)
            except BadJSON as e:
                if i == len(lines) and not text.endswith("\n"):
                    break  # truncated by a crash mid-write
                raise AiaynError(f"{where(p, i)}: not a JSON object ({e.detail}); fix or delete the line") from None
            if not isinstance(obj, dict):
                raise AiaynError(f"{where(p, i)}: expected a JSON object per line")
            records.append(obj)
        return records
    if not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]  # a row cut short by a crash mid-write
    reader = csv.reader(io.StringIO(text, newline=""))
    header = next(reader, None)
    if header is None:
        return records
    for row in reader:
        if not row:
            continue
        if len(row) > len(header):
            raise AiaynError(
                f"{where(p, reader.line_num)}: {len(row)} cells but the header has {len(header)}; "
                "fix or delete the line"
            )
        records.append({k: _parse_cell(v) for k, v in zip(header, row) if v != ""})
    return records


def drop_rows_after(path: str | os.PathLike, step: int) -> int:
    """Remove the records of steps after ``step`` (rewritten atomically), so that a run resumed from ``step``
    replaces the rows of the steps it makes again instead of repeating them. A missing file is left missing.

    Returns:
        The number of records removed.
    """
    p = Path(path)
    if not p.is_file():
        return 0
    rows = read_metrics(p)
    kept = [r for r in rows if not (isinstance(r.get("step"), int) and r["step"] > step)]
    if len(kept) == len(rows):
        return 0
    _rewrite(p, kept, list(dict.fromkeys(k for r in rows for k in r)))
    return len(rows) - len(kept)


def _rewrite(path: Path, rows: list[dict[str, Any]], header: list[str]) -> None:
    """Replace a metrics file by ``rows`` (a CSV with ``header``), atomically
    (:func:`~aiayn.data.text_io.atomic_write_text`)."""
    if _format_of(path) == ".jsonl":
        atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        return
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    for r in rows:
        w.writerow(["" if r.get(k) is None else r[k] for k in header])
    atomic_write_text(path, buf.getvalue())
