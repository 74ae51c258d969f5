"""Classification metrics: accuracy, per-class and macro precision/recall/F1, confusion matrix.

Conventions follow scikit-learn: confusion-matrix rows are true labels and columns predicted
labels; a precision, recall or F1 whose denominator is zero is 0.0; the macro average is the
unweighted mean over the given labels.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from aiayn.errors import AiaynError


def _check(y_true: Sequence[Hashable], y_pred: Sequence[Hashable], metric: str) -> None:
    if len(y_true) != len(y_pred):
        raise AiaynError(
            f"{metric}: got {len(y_true)} true labels but {len(y_pred)} predictions; score the same examples"
        )
    if not y_true:
        raise AiaynError(f"{metric}: got no examples; check that the evaluation set is not empty")


def _check_labels(
    y_true: Sequence[Hashable], y_pred: Sequence[Hashable], labels: Sequence[Hashable], metric: str
) -> None:
    if len(set(labels)) != len(labels):
        raise AiaynError(f"{metric}: labels {list(labels)} contain duplicates")
    unknown = sorted(({*y_true, *y_pred} - set(labels)), key=str)
    if unknown:
        raise AiaynError(
            f"{metric}: labels {unknown} occur in the data but not in labels={list(labels)}; "
            "add them to labels"
        )


def accuracy(y_true: Sequence[Hashable], y_pred: Sequence[Hashable]) -> float:
    """Fraction of predictions equal to the true label.

    Raises:
        AiaynError: if the lengths differ or there are no examples.
    """
    _check(y_true, y_pred, "accuracy")
    return sum(t == p for t, p in zip(y_true, y_pred)) / len(y_true)


@dataclass(frozen=True)
class PRF:
    """Precision, recall and F1 of one class (or their macro average), and the class's support
    (number of true examples; for the macro average, the total)."""

    precision: float
    recall: float
    f1: float
    support: int


@dataclass(frozen=True)
class ClassificationReport:
    """Per-class :class:`PRF` keyed by label, and the macro average over the labels."""

    per_class: dict[Hashable, PRF]
    macro: PRF


def _ratio(num: int, den: int) -> float:
    return num / den if den else 0.0


def confusion_matrix(
    y_true: Sequence[Hashable], y_pred: Sequence[Hashable], labels: Sequence[Hashable]
) -> list[list[int]]:
    """Counts ``m[i][j]`` of examples with true label ``labels[i]`` predicted as ``labels[j]``.

    Raises:
        AiaynError: if the lengths differ, there are no examples, or a label is missing from ``labels``.
    """
    _check(y_true, y_pred, "confusion_matrix")
    _check_labels(y_true, y_pred, labels, "confusion_matrix")
    index = {lab: i for i, lab in enumerate(labels)}
    m = [[0] * len(labels) for _ in labels]
    for t, p in zip(y_true, y_pred):
        m[index[t]][index[p]] += 1
    return m


def precision_recall_f1(
    y_true: Sequence[Hashable], y_pred: Sequence[Hashable], labels: Sequence[Hashable]
) -> ClassificationReport:
    """Per-class precision, recall and F1, and their macro (unweighted) average.

    The macro F1 is the mean of the per-class F1 scores (scikit-learn's ``average="macro"``), not
    the F1 of the mean precision and recall.

    Raises:
        AiaynError: if the lengths differ, there are no examples, or a label is missing from ``labels``.
    """
    m = confusion_matrix(y_true, y_pred, labels)
    per_class: dict[Hashable, PRF] = {}
    for i, lab in enumerate(labels):
        tp = m[i][i]
        predicted = sum(row[i] for row in m)
        support = sum(m[i])
        p, r = _ratio(tp, predicted), _ratio(tp, support)
        per_class[lab] = PRF(p, r, _ratio(2 * tp, predicted + support), support)
    k = len(labels)
    macro = PRF(
        sum(c.precision for c in per_class.values()) / k,
        sum(c.recall for c in per_class.values()) / k,
        sum(c.f1 for c in per_class.values()) / k,
        len(y_true),
    )
    return ClassificationReport(per_class, macro)


def format_confusion(matrix: Sequence[Sequence[int]], labels: Sequence[Hashable]) -> str:
    """A confusion matrix as an aligned text table, rows true labels and columns predictions.

    Example:
        >>> print(format_confusion([[3, 1], [0, 2]], ["neg", "pos"]))
        true \\ pred  neg  pos
                neg    3    1
                pos    0    2
    """
    if len(matrix) != len(labels) or any(len(row) != len(labels) for row in matrix):
        raise AiaynError(f"format_confusion: the matrix is not {len(labels)}x{len(labels)} like the labels")
    corner = "true \\ pred"
    names = [str(lab) for lab in labels]
    first = max(len(corner), *(len(n) for n in names))
    width = max(*(len(n) for n in names), *(len(str(v)) for row in matrix for v in row))
    lines = [corner.ljust(first) + "".join(f"  {n:>{width}}" for n in names)]
    for name, row in zip(names, matrix):
        lines.append(f"{name:>{first}}" + "".join(f"  {v:>{width}}" for v in row))
    return "\n".join(lines)
