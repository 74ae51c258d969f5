"""Learning curves: loss (or any metric) against step, from metrics-log records."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiayn.errors import AiaynError


def _points(records: Sequence[dict[str, Any]], x: str, y: str) -> tuple[list[float], list[float]]:
    """The (x, y) pairs of the records that carry both keys with finite numbers."""
    xs: list[float] = []
    ys: list[float] = []
    for r in records:
        a, b = r.get(x), r.get(y)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isfinite(b):
            xs.append(float(a))
            ys.append(float(b))
    return xs, ys


def plot_learning_curves(
    records: Sequence[dict[str, Any]],
    path: str | os.PathLike,
    x: str = "step",
    ys: Sequence[str] = ("train_loss", "val_loss"),
    *,
    title: str | None = None,
    logy: bool = False,
) -> Path:
    """Plot metrics against ``x`` into a PNG (matplotlib, Agg canvas; no display needed).

    Each name in ``ys`` is one line, drawn from the records that have both ``x`` and that key, so
    sparse metrics (validation every N steps) plot correctly next to dense ones. Names no record has
    are skipped.

    Args:
        records: metric records, e.g. from :func:`aiayn.train.metrics_log.read_metrics`.
        path: the PNG to write; parent folders are created.
        x: the key for the horizontal axis.
        ys: the keys to plot.
        title: optional figure title.
        logy: logarithmic vertical axis.

    Returns:
        The written path.

    Raises:
        AiaynError: matplotlib is missing, or no record has ``x`` together with any of ``ys``.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # optional: matplotlib
        from matplotlib.figure import Figure
    except ImportError as e:
        raise AiaynError("plotting needs matplotlib: pip install aiayn[plot]") from e
    series = {y: _points(records, x, y) for y in ys}
    series = {y: pts for y, pts in series.items() if pts[0]}
    if not series:
        keys = sorted({k for r in records for k in r})
        raise AiaynError(
            f"no record has {x!r} together with any of {list(ys)}; available keys: {keys or 'none'}"
        )
    fig = Figure(figsize=(7, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for y, (xs, vals) in series.items():
        ax.plot(xs, vals, label=y, marker="o" if len(xs) < 30 else None, markersize=3)
    ax.set_xlabel(x)
    ax.set_ylabel(", ".join(series))
    if logy:
        ax.set_yscale("log")
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out = Path(path)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, format="png")
    except OSError as e:
        raise AiaynError(f"{e.filename or out}: cannot write the learning curve ({e.strerror or e}); remove what "
                         "is in the way, or choose another path") from None
    return out
