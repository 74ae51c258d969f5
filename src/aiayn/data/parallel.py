"""Parallel corpora for translation: two aligned files or one TSV, validated and filtered.

Bad pairs (an empty side, a side longer than a limit) are handled by one of three policies:
``"skip"`` drops them silently (they are counted in ``stats``), ``"warn"`` drops them and warns with
``file:line`` for the first few, ``"error"`` stops at the first with an :class:`AiaynError`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from aiayn.data.text_io import read_lines
from aiayn.errors import AiaynError, where

POLICIES: tuple[str, ...] = ("skip", "warn", "error")
MAX_WARNINGS = 5  # per kind of problem; the rest are summed up in one closing warning
_LABELS = {"skipped_empty": "empty", "skipped_long": "over-length"}


class DataWarning(UserWarning):
    """A problem in the data that was worked around (a pair skipped under ``policy="warn"``)."""


@dataclass
class ParallelCorpus:
    """Aligned source/target sentences and where each pair came from.

    Attributes:
        src: source sentences.
        tgt: target sentences; ``tgt[i]`` translates ``src[i]``.
        line_numbers: 1-based line of pair ``i`` in the input file(s).
        stats: ``read``, ``kept``, ``skipped_empty``, ``skipped_long`` pair counts.
        origin: the input file(s), for messages.
        files: the input file (a TSV) or files (source, target), for :meth:`location`.
    """

    src: list[str]
    tgt: list[str]
    line_numbers: list[int]
    stats: dict[str, int] = field(default_factory=dict)
    origin: str = ""
    files: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.src)

    def location(self, index: int) -> str:
        """Where pair ``index`` came from, for messages: ``file:line``, or ``src:line / tgt:line`` for two files."""
        line = self.line_numbers[index]
        return " / ".join(where(f, line) for f in self.files) if self.files else where(self.origin, line)


class FilteredPairs(NamedTuple):
    """Result of :func:`filter_by_token_length`: the kept pairs and their indices in the input."""

    src: list[list[int]]
    tgt: list[list[int]]
    kept: list[int]
    stats: dict[str, int]


class _Reporter:
    """Applies a policy to bad pairs: count, warn for the first few, or raise."""

    def __init__(self, policy: str, origin: str) -> None:
        if policy not in POLICIES:
            raise AiaynError(f"unknown policy {policy!r} for bad pairs; choose one of {', '.join(POLICIES)}")
        self.policy, self.origin = policy, origin
        self.counts: dict[str, int] = {}

    def bad(self, kind: str, location: str, problem: str, fix: str) -> None:
        n = self.counts[kind] = self.counts.get(kind, 0) + 1
        if self.policy == "error":
            raise AiaynError(
                f"{location}: {problem}; {fix}, or set policy to 'skip' or 'warn' (a recipe's data.policy) to "
                "drop such pairs"
            )
        if self.policy == "warn" and n <= MAX_WARNINGS:
            warnings.warn(f"{location}: {problem}; skipping the pair", DataWarning, stacklevel=3)

    def summary(self, read: int) -> None:
        if self.policy == "warn" and any(n > 0 for n in self.counts.values()):
            parts = ", ".join(f"{n} {_LABELS.get(kind, kind)}" for kind, n in self.counts.items())
            warnings.warn(f"{self.origin}: skipped {parts} of {read} pairs read", DataWarning, stacklevel=3)


def _pairs_from_tsv(path: Path) -> tuple[list[str], list[str]]:
    src, tgt = [], []
    for i, line in enumerate(read_lines(path), start=1):
        if line == "":  # a blank line is an empty pair, left to the policy
            src.append("")
            tgt.append("")
            continue
        n_tabs = line.count("\t")
        if n_tabs != 1:
            raise AiaynError(
                f"{where(path, i)}: expected exactly one tab (source<TAB>target), found {n_tabs}; "
                "fix the line, or give the two sides as two aligned files"
            )
        s, t = line.split("\t")
        src.append(s)
        tgt.append(t)
    return src, tgt


def load_parallel(
    src_path: str | Path | None = None,
    tgt_path: str | Path | None = None,
    *,
    tsv_path: str | Path | None = None,
    max_len_chars: int | None = None,
    policy: str = "warn",
) -> ParallelCorpus:
    """Read a parallel corpus from two line-aligned files (plain or ``.gz``) or one TSV file.

    A pair is bad when either side is empty (or only whitespace), or, with ``max_len_chars``, when
    either side has more characters than that. Bad pairs are handled by ``policy`` (module docstring).
    In a TSV, a completely blank line counts as an empty pair; any other line must hold exactly one tab.

    Args:
        src_path: source-language file (one sentence per line).
        tgt_path: target-language file, aligned line by line with ``src_path``.
        tsv_path: instead of the two files, one file of ``source<TAB>target`` lines.
        max_len_chars: longest side to keep, in characters; None keeps all lengths.
        policy: ``"skip"``, ``"warn"`` or ``"error"``.

    Raises:
        AiaynError: missing/unreadable files or invalid UTF-8; line counts differ (names both files
            and both counts); a TSV line without exactly one tab; a bad pair under ``"error"``.
    """
    if tsv_path is not None and (src_path is not None or tgt_path is not None):
        raise AiaynError("give either src_path and tgt_path, or tsv_path, not both")
    if tsv_path is not None:
        tsv = Path(tsv_path)
        src, tgt = _pairs_from_tsv(tsv)
        origin, files = str(tsv), (str(tsv),)

        def loc(line: int) -> str:
            return where(tsv, line)
    else:
        if src_path is None or tgt_path is None:
            raise AiaynError("give both src_path and tgt_path (two aligned files), or tsv_path (one file)")
        sp, tp = Path(src_path), Path(tgt_path)
        src, tgt = read_lines(sp), read_lines(tp)
        if len(src) != len(tgt):
            raise AiaynError(
                f"parallel files differ in length: {sp} has {len(src)} lines but {tp} has {len(tgt)}; "
                "line i of one must translate line i of the other: check that they are the matching pair "
                "of files and that neither has lost or gained a line"
            )
        origin, files = f"{sp} + {tp}", (str(sp), str(tp))

        def loc(line: int) -> str:
            return f"{where(sp, line)} / {where(tp, line)}"

    if max_len_chars is not None and max_len_chars < 1:
        raise AiaynError(f"max_len_chars must be >= 1 or None, got {max_len_chars}")
    rep = _Reporter(policy, origin)
    out_src, out_tgt, lines = [], [], []
    for i, (s, t) in enumerate(zip(src, tgt), start=1):
        if not s.strip() or not t.strip():
            side = {(True, True): "source and target", (True, False): "source", (False, True): "target"}[
                (not s.strip(), not t.strip())
            ]
            rep.bad("skipped_empty", loc(i), f"empty {side} sentence", "remove the pair from both sides")
            continue
        if max_len_chars is not None and max(len(s), len(t)) > max_len_chars:
            rep.bad(
                "skipped_long",
                loc(i),
                f"pair longer than max_len_chars={max_len_chars} ({len(s)} source, {len(t)} target chars)",
                "raise max_len_chars or shorten the pair",
            )
            continue
        out_src.append(s)
        out_tgt.append(t)
        lines.append(i)
    rep.summary(len(src))
    stats = {
        "read": len(src),
        "kept": len(out_src),
        "skipped_empty": rep.counts.get("skipped_empty", 0),
        "skipped_long": rep.counts.get("skipped_long", 0),
    }
    return ParallelCorpus(out_src, out_tgt, lines, stats, origin, files)


def filter_by_token_length(
    src_ids: Sequence[Sequence[int]],
    tgt_ids: Sequence[Sequence[int]],
    max_tokens_per_side: int,
    policy: str = "warn",
    *,
    line_numbers: Sequence[int] | None = None,
    origin: str = "corpus",
    locate: Callable[[int], str] | None = None,
) -> FilteredPairs:
    """Drop tokenized pairs with a side longer than ``max_tokens_per_side`` (per ``policy``).

    Lengths are counted as given: if BOS/EOS will be added later, pass the model's limit minus one.

    Args:
        src_ids: token ids of each source sentence.
        tgt_ids: token ids of each target sentence, aligned with ``src_ids``.
        max_tokens_per_side: longest side to keep, in tokens.
        policy: ``"skip"``, ``"warn"`` or ``"error"``.
        line_numbers: 1-based file lines of the pairs (e.g. ``ParallelCorpus.line_numbers``), so
            messages can say ``origin:line``; without them (and without ``locate``) messages give the
            pair's 1-based position.
        origin: the file(s) the pairs came from, for messages.
        locate: pair index -> its location for messages (e.g. ``ParallelCorpus.location``, which
            names both files of a two-file corpus); overrides ``line_numbers``.

    Returns:
        The kept pairs, their indices in the input, and stats (``read``, ``kept``, ``skipped_long``).
    """
    if len(src_ids) != len(tgt_ids):
        raise AiaynError(
            f"{origin}: {len(src_ids)} source but {len(tgt_ids)} target sequences; they must align"
        )
    if line_numbers is not None and len(line_numbers) != len(src_ids):
        raise AiaynError(f"{origin}: {len(line_numbers)} line numbers for {len(src_ids)} pairs")
    if max_tokens_per_side < 1:
        raise AiaynError(f"max_tokens_per_side must be >= 1, got {max_tokens_per_side}")
    rep = _Reporter(policy, origin)
    out_src, out_tgt, kept = [], [], []
    for i, (s, t) in enumerate(zip(src_ids, tgt_ids)):
        if max(len(s), len(t)) > max_tokens_per_side:
            if locate is not None:
                loc = locate(i)
            else:
                loc = where(origin, line_numbers[i]) if line_numbers is not None else f"{origin}, pair {i + 1}"
            rep.bad(
                "skipped_long",
                loc,
                f"pair longer than {max_tokens_per_side} tokens ({len(s)} source, {len(t)} target)",
                "raise the token limit (a recipe's data.max_tokens_per_side, and model.max_len) or shorten the "
                "pair",
            )
            continue
        out_src.append(list(s))
        out_tgt.append(list(t))
        kept.append(i)
    rep.summary(len(src_ids))
    stats = {"read": len(src_ids), "kept": len(kept), "skipped_long": rep.counts.get("skipped_long", 0)}
    return FilteredPairs(out_src, out_tgt, kept, stats)
