"""The one error type for user mistakes.

Every mistake a user can make (a bad path, mismatched corpora, an unknown config key, invalid UTF-8,
an over-long input) raises :class:`AiaynError` with a message that names the file, the line when there
is one, and the fix. The command line prints the message without a traceback and exits non-zero.
"""

from __future__ import annotations

from pathlib import Path


class AiaynError(Exception):
    """A user-facing error: the message says what is wrong, where, and how to fix it."""


def where(path: str | Path, line: int | None = None) -> str:
    """Format a location as ``path:line`` (or just ``path``) for error messages."""
    return f"{path}:{line}" if line is not None else str(path)
