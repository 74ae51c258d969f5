"""Text-classification data: read labeled TSV/CSV files (e.g. GLUE SST-2) and collate batches.

A file holds one example per line, a label column and a text column. The delimiter comes from the
suffix (``.tsv``/``.csv``, also under ``.gz``), else from the first line (a tab means TSV). A first
line naming a known label column (``label``, ``class``, ...) or text column (``sentence``, ``text``,
``content``, ...) is a header; without one, column 0 is the label and column 1 the text. TSV fields
are split on tabs verbatim (no quoting), since TSV corpora like SST-2 keep quote characters in their
text; CSV fields follow the usual quoting rules, one record per line.

Labels become ids through ``label_names``, sorted numerically when every label is an integer
(so SST-2's ``0``/``1`` map to 0/1) and as strings when every label is a word; a file that mixes the two
is an error. Pass the training file's names when
loading the dev file so both use one mapping.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from aiayn.data.lm import read_text
from aiayn.errors import AiaynError, where

LABEL_HEADERS = ("label", "labels", "class", "category", "target", "sentiment", "y")
TEXT_HEADERS = ("sentence", "text", "content", "review", "document", "sentence1", "x")


@dataclass(frozen=True)
class LabeledData:
    """Labeled texts read from a file.

    Attributes:
        texts: One text per example, surrounding whitespace removed.
        labels: Label id per example, an index into ``label_names``.
        label_names: The label strings; id ``i`` means ``label_names[i]``.
        lines: The 1-based line of each example in its file, for error messages.
        path: The file read.
    """

    texts: list[str]
    labels: list[int]
    label_names: list[str]
    lines: list[int]
    path: str

    def __len__(self) -> int:
        return len(self.texts)


def _sorted_label_names(names: set[str]) -> list[str]:
    try:
        return sorted(names, key=int)
    except ValueError:
        return sorted(names)


def _is_whole(label: str) -> bool:
    try:
        int(label)
    except ValueError:
        return False
    return True


def _check_label_kinds(path: Path, labels: list[str], lines: list[int]) -> None:
    """Refuse a file that mixes whole-number labels with other labels (a stray ``positive`` among 0/1 labels would
    silently become a class of its own), naming the first line whose kind differs from most labels'.

    Raises:
        AiaynError: naming ``path:line``, the label and the fix.
    """
    whole = [_is_whole(label) for label in labels]
    n_whole = sum(whole)
    if n_whole in (0, len(labels)):
        return
    majority = n_whole * 2 >= len(labels)
    i = next(i for i, w in enumerate(whole) if w != majority)
    examples = sorted({label for label, w in zip(labels, whole) if w == majority}, key=lambda x: (len(x), x))[:3]
    kind = "a whole number" if majority else "a word"
    raise AiaynError(
        f"{where(path, lines[i])}: label {labels[i]!r} is not {kind} like the other labels ({', '.join(examples)}); "
        "mixing whole-number labels with other labels would make a class of its own: fix the label (all labels "
        "whole numbers, or all words)"
    )


def _delimiter(path: Path, first_line: str) -> str:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    if suffixes and suffixes[-1] == ".tsv":
        return "\t"
    if suffixes and suffixes[-1] == ".csv":
        return ","
    if "\t" in first_line:
        return "\t"
    if "," in first_line:
        return ","
    raise AiaynError(
        f"{where(path, 1)}: cannot tell the format (no tab or comma on the first line); "
        "give a .tsv or .csv file with a label column and a text column"
    )


def _split_rows(path: Path, lines: list[str], delimiter: str) -> list[tuple[int, list[str]]]:
    """(line number, fields) for every non-blank line."""
    rows: list[tuple[int, list[str]]] = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if delimiter == "\t":
            fields = line.split("\t")
        else:
            try:
                fields = next(csv.reader([line], strict=True))
            except csv.Error as e:
                raise AiaynError(
                    f"{where(path, n)}: malformed CSV ({e}); fix the quoting on this line"
                ) from e
        rows.append((n, fields))
    return rows


def _column(
    path: Path, header: list[str] | None, given: str | int | None, known: tuple[str, ...], what: str
) -> int | None:
    """Index of a column from a user's choice or the header; None when not determined."""
    if isinstance(given, int):
        return given
    if header is None:
        if given is not None:
            raise AiaynError(
                f"{where(path, 1)}: {what} column {given!r} asked for, but the file has no header line "
                f"naming it; add a header or give the column's index"
            )
        return None
    names = [h.strip().lower() for h in header]
    if given is not None:
        if given.lower() not in names:
            raise AiaynError(f"{where(path, 1)}: no {what} column named {given!r} in the header {header}")
        return names.index(given.lower())
    for name in known:
        if name in names:
            return names.index(name)
    return None


def load_labeled_text(
    path: str | Path,
    *,
    text_column: str | int | None = None,
    label_column: str | int | None = None,
    label_names: Sequence[str] | None = None,
    texts_only: bool = False,
) -> LabeledData:
    """Read a labeled TSV or CSV file.

    Args:
        path: The file (plain or ``.gz``, UTF-8).
        text_column: Text column by header name or index; default: found by its header name, or the
            column that is not the label in a two-column file, or column 1 without a header.
        label_column: Label column by header name or index; default: found by its header name, or
            column 0 without a header.
        label_names: Fix the label mapping (e.g. the training file's ``label_names`` when reading
            dev); a label outside it is an error. Default: the labels found, sorted.
        texts_only: the caller reads the texts alone (masked-LM pretraining), so whole-number labels mixed with
            other labels are no error.

    Returns:
        :class:`LabeledData`.

    Raises:
        AiaynError: Naming ``path:line`` and the fix, for a missing file, a row with the wrong number
            of columns, an empty text or label, an unknown label, whole-number labels mixed with other
            labels, or no rows at all.
    """
    p = Path(path)
    lines = read_text(p).split("\n")
    lines = [line.removesuffix("\r") for line in lines]
    if not any(line.strip() for line in lines):
        raise AiaynError(f"{where(p)}: the file is empty; give one labeled example per line")
    delimiter = _delimiter(p, next(line for line in lines if line.strip()))
    rows = _split_rows(p, lines, delimiter)

    first = [f.strip().lower() for f in rows[0][1]]
    has_header = (
        isinstance(text_column, str)
        or isinstance(label_column, str)
        or any(f in LABEL_HEADERS or f in TEXT_HEADERS for f in first)
    )
    header = rows[0][1] if has_header else None
    data_rows = rows[1:] if has_header else rows
    n_cols = len(rows[0][1])
    kind = "TSV" if delimiter == "\t" else "CSV"
    if not data_rows:
        raise AiaynError(f"{where(p)}: no examples after the header; give one labeled example per line")

    label_idx = _column(p, header, label_column, LABEL_HEADERS, "label")
    text_idx = _column(p, header, text_column, TEXT_HEADERS, "text")
    if label_idx is None and text_idx is not None and n_cols == 2:
        label_idx = 1 - text_idx
    if text_idx is None and label_idx is not None and n_cols == 2:
        text_idx = 1 - label_idx
    if header is None:
        label_idx = 0 if label_idx is None else label_idx
        text_idx = 1 if text_idx is None else text_idx
    if label_idx is None or text_idx is None:
        raise AiaynError(
            f"{where(p, rows[0][0])}: cannot tell the label and text columns from the header {header}; "
            "pass label_column= and text_column= (--label-column/--text-column)"
        )
    for idx, what in ((label_idx, "label"), (text_idx, "text")):
        if not 0 <= idx < n_cols:
            raise AiaynError(
                f"{where(p, rows[0][0])}: {what} column {idx} is out of range for {n_cols} columns; "
                "pick a column index that exists"
            )
    if label_idx == text_idx:
        raise AiaynError(f"{where(p)}: the label and text columns are both column {label_idx}; pick two")

    texts: list[str] = []
    raw_labels: list[str] = []
    line_numbers: list[int] = []
    for n, fields in data_rows:
        if len(fields) != n_cols:
            raise AiaynError(
                f"{where(p, n)}: {len(fields)} columns where the {'header' if header else 'first line'} has "
                f"{n_cols}; fix this line (a {kind} text must not contain the delimiter"
                f"{'' if kind == 'TSV' else ' unless quoted'})"
            )
        text, label = fields[text_idx].strip(), fields[label_idx].strip()
        if not text:
            raise AiaynError(f"{where(p, n)}: empty text; remove this line or give it a text")
        if not label:
            raise AiaynError(f"{where(p, n)}: empty label; give this example a label")
        texts.append(text)
        raw_labels.append(label)
        line_numbers.append(n)

    if label_names is None and not texts_only:
        _check_label_kinds(p, raw_labels, line_numbers)
    names = list(label_names) if label_names is not None else _sorted_label_names(set(raw_labels))
    index = {name: i for i, name in enumerate(names)}
    labels: list[int] = []
    for label, n in zip(raw_labels, line_numbers):
        if label not in index:
            raise AiaynError(
                f"{where(p, n)}: label {label!r} is not one of the known labels {names}; "
                "fix the label, or load this file with the training file's label names"
            )
        labels.append(index[label])
    return LabeledData(texts=texts, labels=labels, label_names=names, lines=line_numbers, path=str(p))


@dataclass(frozen=True)
class ClassificationBatch:
    """A padded classification batch.

    Attributes:
        input_ids: (B, T) LongTensor, right-padded with the pad id.
        attention_mask: (B, T) BoolTensor, True on real tokens.
        labels: (B,) LongTensor of label ids.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor

    def to(self, device: torch.device | str) -> ClassificationBatch:
        """The same batch on ``device``."""
        return ClassificationBatch(
            self.input_ids.to(device), self.attention_mask.to(device), self.labels.to(device)
        )


def collate_classification(
    ids_list: Sequence[Sequence[int]],
    labels: Sequence[int],
    pad_id: int,
    max_len: int,
    cls_id: int | None = None,
) -> ClassificationBatch:
    """Pad token-id lists into a batch.

    Args:
        ids_list: B token-id lists.
        labels: B label ids.
        pad_id: Padding id.
        max_len: Longest sequence kept, the CLS/BOS token included; longer ones are cut at the end.
        cls_id: If given, prepended to every sequence (a CLS or BOS token to pool from).

    Returns:
        :class:`ClassificationBatch` with T = the longest (truncated) sequence in the batch.
    """
    if len(ids_list) != len(labels):
        raise ValueError(f"{len(ids_list)} sequences but {len(labels)} labels")
    if not ids_list:
        raise ValueError("cannot collate an empty batch")
    if max_len < 1:
        raise AiaynError(f"max_len must be at least 1, got {max_len}")
    prefix = [] if cls_id is None else [cls_id]
    seqs = [(prefix + list(ids))[:max_len] for ids in ids_list]
    for i, s in enumerate(seqs):
        if not s:
            raise AiaynError(
                f"example {i} of the batch has no tokens; remove empty texts or prepend a CLS token"
            )
    T = max(len(s) for s in seqs)
    input_ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)  # (B, T)
    attention_mask = torch.zeros((len(seqs), T), dtype=torch.bool)  # (B, T)
    for i, s in enumerate(seqs):
        input_ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        attention_mask[i, : len(s)] = True
    return ClassificationBatch(input_ids, attention_mask, torch.tensor(list(labels), dtype=torch.long))
