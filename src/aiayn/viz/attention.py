"""Pictures of attention: heatmaps of per-head weights with token labels, masks and position encodings.

Each ``*_figure`` function returns a matplotlib figure whose images hold exactly the values given (tests read them
back with ``ax.images[0].get_array()``); the ``plot_*`` functions write one as a PNG.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from aiayn.errors import AiaynError

DPI = 110


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
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
                     title: str | None = None, heads: Sequence[int] | None = None, cols: int = 4) -> Any:
    """Heatmaps of attention weights, the mean over heads first, then one panel per head.

    Args:
        weights: (H, T, S) or (T, S) attention weights of one example (rows: queries, columns: keys).
        query_tokens: T labels for the rows; key_tokens: S labels for the columns.
        heads: which heads to draw (default all).
    Returns:
        the figure; panel 0 is the mean, panel 1 + i head ``heads[i]``.
    """
    plt = _pyplot()
    w = _as_tensor(weights)
    if w.dim() == 2:
        w = w[None]
    if w.shape[1:] != (len(query_tokens), len(key_tokens)):
        raise ValueError(f"weights {tuple(w.shape)} do not match {len(query_tokens)} x {len(key_tokens)} labels")
    panels = [("mean of heads", w.mean(0))] + [(f"head {h}", w[h]) for h in (heads or range(w.shape[0]))]
    cols = min(cols, len(panels))
    rows = (len(panels) + cols - 1) // cols
    cell = 0.32
    fig_w = max(4.0, cols * (len(key_tokens) * cell + 1.5))
    fig_h = max(3.0, rows * (len(query_tokens) * cell + 1.5))
    fig, axes = plt.subplots(rows, cols, figsize=(fig_w, fig_h), squeeze=False)
    for ax, (name, m) in zip(axes.flat, panels):
        ax.imshow(m.numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_xticks(range(len(key_tokens)), key_tokens, rotation=90, fontsize=8)
        ax.set_yticks(range(len(query_tokens)), query_tokens, fontsize=8)
        ax.set_title(name, fontsize=9)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_attention(weights: Tensor, query_tokens: Sequence[str], key_tokens: Sequence[str],
                   path: str | os.PathLike, *, title: str | None = None, heads: Sequence[int] | None = None,
                   cols: int = 4) -> Path:
    """Write :func:`attention_figure` as a PNG at ``path``; returns the path."""
    return save_figure(attention_figure(weights, query_tokens, key_tokens, title=title, heads=heads, cols=cols), path)


def matrix_figure(matrix: Tensor | Sequence[Any], row_labels: Sequence[str] | None = None,
                  col_labels: Sequence[str] | None = None, *, title: str | None = None, cmap: str = "viridis",
                  symmetric: bool = False, xlabel: str | None = None, ylabel: str | None = None,
                  value_range: tuple[float, float] | None = None) -> Any:
    """One labelled heatmap of a (R, C) matrix (a mask, an alignment, a position table or a bias).

    Args:
        symmetric: a colour scale centred on 0 (position encodings, biases); else ``value_range`` (low, high), or
            from the minimum to the maximum.
    """
    plt = _pyplot()
    m = _as_tensor(matrix)
    r, c = m.shape
    fig, ax = plt.subplots(figsize=(max(3.5, 1.8 + 0.22 * c), max(3.0, 1.5 + 0.22 * r)))
    if symmetric:
        top = float(m.abs().max()) or 1.0
        image = ax.imshow(m.numpy(), cmap=cmap, vmin=-top, vmax=top, aspect="auto")
    else:
        low, high = value_range or (None, None)
        image = ax.imshow(m.numpy(), cmap=cmap, vmin=low, vmax=high, aspect="auto")
    if row_labels is not None:
        ax.set_yticks(range(r), row_labels, fontsize=8)
    if col_labels is not None:
        ax.set_xticks(range(c), col_labels, rotation=90, fontsize=8)
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    fig.colorbar(image, ax=ax, fraction=0.04)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_mask(mask: Tensor, path: str | os.PathLike, title: str | None = None) -> Path:
    """Draw a (T, S) boolean mask (True = may attend) as a black/white grid."""
    m = mask
    while m.dim() > 2:
        m = m[0]
    return save_figure(matrix_figure(m.to(torch.float32), title=title, cmap="Greys", xlabel="key position",
                                     ylabel="query position", value_range=(0.0, 1.0)), path)
