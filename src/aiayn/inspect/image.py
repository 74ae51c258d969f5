"""The inspection record of one image through a Vision Transformer checkpoint (``input="patches"``).

The record has the keys of :func:`aiayn.inspect.record.inspect_text`'s (so the explorer's head view, model view,
masks, positions and per-head statistics work over patches), with the encoder's tokens named ``CLS`` and ``p0``,
``p1``, ... row by row, and an ``image`` entry: the pixels the model read (C, S, S), the patch grid and each token's
(row, column) in it. :func:`image_pictures` draws what only an image has: each layer's attention of the CLS token
(or, with mean pooling, the mean over patches) laid over the image's patch grid.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from aiayn.data.images import image_input
from aiayn.errors import AiaynError
from aiayn.evaluate.predict import display_labels
from aiayn.inspect.capture import capture_attention
from aiayn.inspect.record import _attention, _device, _model_summary, _positions, _round
from aiayn.pretrained import Pretrained
from aiayn.viz.attention import _pyplot, save_figure


def patch_tokens(n_side: int, cls_token: bool) -> tuple[list[str], list[tuple[int, int] | None]]:
    """Token names and grid cells of an image of ``n_side`` x ``n_side`` patches: ``["CLS", "p0", ...]`` and
    ``[None, (0, 0), (0, 1), ...]`` (row by row)."""
    names = [f"p{i}" for i in range(n_side * n_side)]
    cells: list[tuple[int, int] | None] = [(i // n_side, i % n_side) for i in range(n_side * n_side)]
    return (["CLS", *names], [None, *cells]) if cls_token else (names, cells)


@torch.no_grad()
def inspect_image(pre: Pretrained, image: str | Path | torch.Tensor, *, layers: list[int] | None = None,
                  digits: int | None = 5) -> dict[str, Any]:
    """The inspection record of one image for an image-classification checkpoint.

    Args:
        pre: a checkpoint from :func:`aiayn.pretrained.load_pretrained` whose model reads patches.
        image: a PNG or ``.npy`` file (brought to the model's channels and size as ``aiayn classify`` does), or a
            (C, S, S) tensor in [0, 1].
        layers: record these layers only (default all).
        digits: decimals kept of each weight (None: full float32 precision).
    Raises:
        AiaynError: a checkpoint that does not read images, or an image it cannot read.
    """
    c = pre.config
    if c.input != "patches":
        raise AiaynError(f"a {pre.task!r} checkpoint reads text; give it a text to inspect, not an image")
    x = image if isinstance(image, torch.Tensor) else image_input(pre, image)  # (C, S, S)
    model = pre.model.eval()
    with capture_attention(model, layers) as capture:
        probs = model(x[None].to(_device(model)), task="classify").logits[0].float().softmax(-1)  # (n_classes,)
    side = c.image_size // c.patch_size
    tokens, cells = patch_tokens(side, c.pooling == "cls")
    labels = display_labels(pre.meta)
    best = int(probs.argmax())
    record = _attention(capture, {"encoder": (tokens, tokens)}, c, digits)
    return {"input": str(image) if not isinstance(image, torch.Tensor) else "image", "model": _model_summary(pre),
            "tokens": {"encoder": tokens}, **record,
            "positions": {"encoder": _positions(model, capture, c, len(tokens), digits, "encoder")},
            "image": {"pixels": _round(x, 4), "patch_size": c.patch_size, "grid": [side, side], "cells": cells},
            "output": {"kind": "classification", "labels": labels, "probs": _round(probs, 6),
                       "prediction": labels[best], "probability": float(probs[best])}}


def pooled_attention(record: dict[str, Any], layer: int) -> torch.Tensor:
    """(rows, cols) the attention, mean over heads, that the pooled summary pays each patch in ``layer``: the CLS
    token's row, or with mean pooling the mean of the patches' rows."""
    weights = torch.tensor(record["attention"]["encoder"][layer]).mean(0)  # (T, T)
    cells = record["image"]["cells"]
    rows, cols = record["image"]["grid"]
    patches = [i for i, cell in enumerate(cells) if cell is not None]
    query = weights[0] if cells[0] is None else weights[patches].mean(0)  # (T,)
    return query[patches].reshape(rows, cols)


def image_pictures(record: dict[str, Any], directory: str | Path) -> list[Path]:
    """Write ``image.png`` (the pixels the model read) and ``patch_attention_layer{l}.png`` per recorded layer (the
    image beside :func:`pooled_attention`) into ``directory``; returns the files."""
    plt = _pyplot()
    pixels = torch.tensor(record["image"]["pixels"])  # (C, S, S)
    shown = (pixels[0] if pixels.shape[0] == 1 else pixels.permute(1, 2, 0)).numpy()  # (S, S) or (S, S, 3)
    cmap = "gray" if pixels.shape[0] == 1 else None
    folder = Path(directory)
    fig, ax = plt.subplots(figsize=(3, 3))
    ax.imshow(shown, cmap=cmap, vmin=0, vmax=1)
    ax.set_title(f"predicted {record['output']['prediction']} ({record['output']['probability']:.2f})")
    ax.axis("off")
    files = [save_figure(fig, folder / "image.png")]
    who = "CLS" if record["image"]["cells"][0] is None else "mean of patches"
    for layer in range(len(record["attention"].get("encoder", []))):
        fig, (left, right) = plt.subplots(1, 2, figsize=(6, 3))
        left.imshow(shown, cmap=cmap, vmin=0, vmax=1)
        left.axis("off")
        im = right.imshow(pooled_attention(record, layer).numpy(), cmap="viridis")
        right.set_title(f"{who} -> patches, layer {layer}")
        right.axis("off")
        fig.colorbar(im, ax=right, fraction=0.046)
        files.append(save_figure(fig, folder / f"patch_attention_layer{layer}.png"))
    return files
