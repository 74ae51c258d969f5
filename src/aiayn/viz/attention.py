"""Pictures of attention: heatmaps of per-head weights with token labels, masks and position encodings.

Each ``*_figure`` function returns a matplotlib figure whose images hold exactly the values given (tests read them
back with ``ax.images[0].get_array()``); the ``plot_*`` functions write one as a PNG.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from aiayn.errors import AiaynError

DPI = 110
MAX_FIGURE_INCHES = (24.0, 20.0)  # the largest picture: 2640 x 2200 pixels at DPI, however long the input
MAX_PANEL_INCHES = 6.0  # the longest side of one heatmap
MIN_PANEL_INCHES = 1.6
LABEL_PITCH = 0.1  # inches one 7-point tick label needs; fewer labels are drawn when cells are smaller
MAX_LABEL_CHARS = 12  # longer tokens are cut in labels


def _pyplot():
    try:
        import matplotlib  # optional: matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # optional: matplotlib (after its backend is set)
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise AiaynError("plotting needs matplotlib: pip install 'aiayn[plot]'") from e
    return plt


def _as_tensor(x: Tensor | Sequence[Any]) -> Tensor:
    return x.detach().float().cpu() if isinstance(x, Tensor) else torch.tensor(x, dtype=torch.float32)


def save_figure(fig: Any, path: str | os.PathLike) -> Path:
    """Write ``fig`` as a PNG at :data:`DPI` (parents made), close it, and return the path.

    Raises:
        AiaynError: the file cannot be written (a folder of that name, no space, no permission).
    """
    out = Path(path)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=DPI, format="png")
    except OSError as e:
        raise AiaynError(f"{e.filename or out}: cannot write the picture ({e.strerror or e}); remove what is in "
                         "the way, or choose another path") from None
    finally:
        _pyplot().close(fig)
    return out


def attention_figure(weights: Tensor | Sequence[Any], query_tokens: Sequence[str], key_tokens: Sequence[str], *,
                     title: str | None = None, heads: Sequence[int] | None = None, cols: int | None = None) -> Any:
    """Heatmaps of attention weights, the mean over heads first, then one panel per head, on one colour bar.

    The picture stays within :data:`MAX_FIGURE_INCHES` however long the input or many the heads: panels shrink to
    fit, and token labels are thinned (or give way to position numbers) when too many to read. Query labels are
    drawn on the left column, key labels under the lowest panel of each column. Axes are made for panels only (an
    unfilled slot of the grid stays blank), the grid near square: the largest panels, then the fewest
    such slots.

    Args:
        weights: (H, T, S) or (T, S) attention weights of one example (rows: queries, columns: keys).
        query_tokens: T labels for the rows; key_tokens: S labels for the columns.
        heads: which heads to draw (default all).
        cols: panels per row (default chosen from the number of panels).
    Returns:
        the figure; panel 0 is the mean, panel 1 + i head ``heads[i]``; the last axes is the colour bar.
    """
    plt = _pyplot()
    w = _as_tensor(weights)
    if w.dim() == 2:
        w = w[None]
    if w.shape[1:] != (len(query_tokens), len(key_tokens)):
        raise ValueError(f"weights {tuple(w.shape)} do not match {len(query_tokens)} x {len(key_tokens)} labels")
    panels = [("mean of heads", w.mean(0))] + [(f"head {h}", w[h]) for h in (heads or range(w.shape[0]))]
    n = len(panels)
    left, bottom = _label_room(query_tokens), _label_room(key_tokens)

    def layout(cols: int) -> tuple[int, int, float, float, float, float]:
        rows = -(-n // cols)
        # Fixed room: query labels once, the colour bar, a title over each row and the figure's title.
        fixed_w, fixed_h = left + 1.0 + 0.15 * (cols - 1), bottom + 0.35 * rows + (0.45 if title else 0.1)
        return (rows, cols, *_image_inches(len(key_tokens), len(query_tokens), cols, rows, fixed_w, fixed_h),
                fixed_w, fixed_h)

    # As near square as can be: the largest panels (up to full size), then the fewest empty slots.
    side = math.ceil(math.sqrt(n))
    rows, cols, img_w, img_h, fixed_w, fixed_h = layout(min(cols, n)) if cols else min(
        (layout(c) for c in range(side, min(n, side + 2) + 1)),
        key=lambda g: (-round(g[2] * g[3], 2), g[0] * g[1] - n, g[1]))
    fig = plt.figure(figsize=_bounded(fixed_w + cols * img_w, fixed_h + rows * img_h), layout="constrained")
    spec = fig.add_gridspec(rows, cols)
    axes, image = [], None
    for i, (name, m) in enumerate(panels):
        r, c = divmod(i, cols)
        ax = fig.add_subplot(spec[r, c])
        image = ax.imshow(m.numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
        ax.set_title(name, fontsize=9)
        _label_axis(ax.xaxis, key_tokens, img_w, "key", show=i + cols >= n)  # nothing below it
        _label_axis(ax.yaxis, query_tokens, img_h, "query", show=c == 0)
        axes.append(ax)
    grid_w = cols * img_w  # inches: the colour bar takes about 0.45 of them, beside the grid
    fig.colorbar(image, ax=axes, label="attention weight", fraction=0.3 / grid_w, pad=0.15 / grid_w,
                 shrink=min(1.0, 4.0 / (rows * img_h)))
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


def plot_attention(weights: Tensor, query_tokens: Sequence[str], key_tokens: Sequence[str],
                   path: str | os.PathLike, *, title: str | None = None, heads: Sequence[int] | None = None,
                   cols: int | None = None) -> Path:
    """Write :func:`attention_figure` as a PNG at ``path``; returns the path."""
    return save_figure(attention_figure(weights, query_tokens, key_tokens, title=title, heads=heads, cols=cols), path)


def matrix_figure(matrix: Tensor | Sequence[Any], row_labels: Sequence[str] | None = None,
                  col_labels: Sequence[str] | None = None, *, title: str | None = None, cmap: str = "viridis",
                  symmetric: bool = False, xlabel: str | None = None, ylabel: str | None = None,
                  value_range: tuple[float, float] | None = None) -> Any:
    """One labelled heatmap of a (R, C) matrix (a mask, an alignment, a position table or a bias), with a colour bar.

    The picture stays within :data:`MAX_FIGURE_INCHES`, its labels thinned as in :func:`attention_figure`.

    Args:
        symmetric: a colour scale centred on 0 (position encodings, biases); else ``value_range`` (low, high), or
            from the minimum to the maximum.
    """
    plt = _pyplot()
    m = _as_tensor(matrix)
    r, c = m.shape
    left = _label_room(row_labels) + (0.3 if ylabel else 0.0)
    bottom = _label_room(col_labels) + (0.3 if xlabel else 0.0)
    fixed_w, fixed_h = left + 1.1, bottom + (0.5 if title else 0.15)
    img_w, img_h = _image_inches(c, r, 1, 1, fixed_w, fixed_h, cell=0.22)
    fig, ax = plt.subplots(figsize=_bounded(fixed_w + img_w, fixed_h + img_h), layout="constrained")
    if symmetric:
        top = float(m.abs().max()) or 1.0
        low, high = -top, top
    else:
        low, high = value_range or (None, None)
    image = ax.imshow(m.numpy(), cmap=cmap, vmin=low, vmax=high, aspect="auto", interpolation="nearest")
    _label_axis(ax.xaxis, col_labels, img_w, xlabel)
    _label_axis(ax.yaxis, row_labels, img_h, ylabel)
    fig.colorbar(image, ax=ax, fraction=0.04)
    if title:
        ax.set_title(title, fontsize=10)
    return fig


def _image_inches(n_cols: int, n_rows: int, grid_cols: int, grid_rows: int, fixed_w: float, fixed_h: float, *,
                  cell: float = LABEL_PITCH) -> tuple[float, float]:
    """(width, height) in inches of one heatmap of ``n_rows`` x ``n_cols`` cells in a ``grid_rows`` x
    ``grid_cols`` grid, beside ``fixed_w`` x ``fixed_h`` inches of labels: ``cell`` inches a cell, between
    :data:`MIN_PANEL_INCHES` and :data:`MAX_PANEL_INCHES` a side, both shrunk alike until the figure fits
    :data:`MAX_FIGURE_INCHES`."""
    def side(n: int) -> float:
        return min(MAX_PANEL_INCHES, max(MIN_PANEL_INCHES, n * cell))

    w, h = side(n_cols), side(n_rows)
    max_w, max_h = MAX_FIGURE_INCHES
    scale = min(1.0, (max_w - fixed_w) / (grid_cols * w), (max_h - fixed_h) / (grid_rows * h))  # keep the shape
    return max(0.3, scale * w), max(0.3, scale * h)


def _bounded(width: float, height: float) -> tuple[float, float]:
    """A figure size in inches held within :data:`MAX_FIGURE_INCHES`."""
    return min(width, MAX_FIGURE_INCHES[0]), min(height, MAX_FIGURE_INCHES[1])


def _shown(token: str) -> str:
    """A token as a tick label: control characters made visible, ``$`` kept from mathtext, long ones cut."""
    text = token.replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
    if len(text) > MAX_LABEL_CHARS:
        text = text[:MAX_LABEL_CHARS - 1] + "…"
    return text.replace("$", r"\$")


def _label_room(labels: Sequence[str] | None) -> float:
    """Inches that tick labels of these tokens take across the axis (for the figure's size)."""
    if labels is None:
        return 0.4
    return 0.25 + 0.07 * min(MAX_LABEL_CHARS, max((len(_shown(x)) for x in labels), default=1))


def _label_axis(axis: Any, labels: Sequence[str] | None, inches: float, name: str | None, *,
                show: bool = True) -> None:
    """Label one axis of a heatmap ``inches`` long with ``labels`` (one a cell), as many as can be read.

    Every token when each gets :data:`LABEL_PITCH`; else every k-th one (k up to 4, said in the axis name); else
    position numbers. ``show=False`` hides the labels (a panel that shares them with its neighbour)."""
    if not show:
        axis.set_ticks([])
        return
    if labels is None:
        if name:
            axis.set_label_text(name, fontsize=8)
        axis.set_tick_params(labelsize=7)
        return
    n = len(labels)
    step = max(1, math.ceil(n * LABEL_PITCH / inches)) if n else 1
    vertical = axis.axis_name == "x"
    if step <= 4:
        ticks = list(range(0, n, step))
        axis.set_ticks(ticks, [_shown(labels[i]) for i in ticks], fontsize=7, rotation=90 if vertical else 0)
        note = "" if step == 1 else f"every {step}{'nd' if step == 2 else 'rd' if step == 3 else 'th'} token"
    else:
        axis.get_major_locator().set_params(integer=True)
        axis.set_tick_params(labelsize=7)
        note = "position"
    if name or note:
        axis.set_label_text(", ".join(x for x in (name, note) if x), fontsize=8)


def plot_mask(mask: Tensor, path: str | os.PathLike, title: str | None = None) -> Path:
    """Draw a (T, S) boolean mask (True = may attend) as a black/white grid."""
    m = mask
    while m.dim() > 2:
        m = m[0]
    return save_figure(matrix_figure(m.to(torch.float32), title=title, cmap="Greys", xlabel="key position",
                                     ylabel="query position", value_range=(0.0, 1.0)), path)
