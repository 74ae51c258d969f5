"""Pictures of attention: heatmaps of per-head weights with token labels, and of masks."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from aiayn.errors import AiaynError


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise AiaynError("plotting needs matplotlib: pip install 'aiayn[plot]'") from e
    return plt


def plot_attention(weights: Tensor, query_tokens: Sequence[str], key_tokens: Sequence[str],
                   path: str | os.PathLike, *, title: str | None = None, heads: Sequence[int] | None = None,
                   cols: int = 4) -> Path:
    """Heatmaps of attention weights, one panel per head, plus the mean over heads first.

    Args:
        weights: (H, T, S) or (T, S) attention weights of one example (rows: queries, columns: keys).
        query_tokens: T labels for the rows; key_tokens: S labels for the columns.
        path: PNG to write.
        heads: which heads to draw (default all).
    Returns:
        The PNG path.
    """
    plt = _pyplot()
    w = weights.detach().float().cpu()
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
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_mask(mask: Tensor, path: str | os.PathLike, title: str | None = None) -> Path:
    """Draw a (T, S) boolean mask (True = may attend) as a black/white grid."""
    plt = _pyplot()
    m = mask
    while m.dim() > 2:
        m = m[0]
    fig, ax = plt.subplots(figsize=(3 + 0.15 * m.shape[1], 3 + 0.15 * m.shape[0]))
    ax.imshow(m.to(torch.float32).cpu().numpy(), cmap="Greys", vmin=0, vmax=1)
    ax.set_xlabel("key position")
    ax.set_ylabel("query position")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
