"""``aiayn inspect --png DIR``: the explorer's views as PNG files, drawn from an inspection record.

For each attention kind and layer, the heads' heatmaps (``{kind}_layer{l}.png``, the mean of heads first); for a
translation, the alignment of target and source tokens (``alignment_layer{l}.png``, cross-attention averaged over
heads); the masks the pass applied (``mask_{kind}.png``); and the position scheme (``positions_{stack}.png``: the
encoding table, RoPE's angles, or each head's ALiBi / T5 bias as ``positions_{stack}_head{h}.png``).

:func:`save_pictures` writes them as the command does: into a new or empty folder, or one an earlier ``--png``
wrote (recognised by its ``aiayn-output.json``), drawn in a hidden sibling first and then put in place; another
folder only with ``--overwrite``, and then only pictures of the same names are replaced (:mod:`aiayn.output_folder`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import torch

from aiayn.output_folder import PICTURES, check_output_folder, install, staging_folder
from aiayn.viz.attention import attention_figure, matrix_figure, save_figure

NAMES = {"encoder": "encoder self-attention", "decoder": "decoder self-attention", "cross": "cross-attention"}


def _queries(record: dict[str, Any], kind: str) -> list[str]:
    return record["tokens"]["encoder" if kind == "encoder" else "decoder"]


def _keys(record: dict[str, Any], kind: str) -> list[str]:
    return record["tokens"]["decoder" if kind == "decoder" else "encoder"]


def figures(record: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """Every picture of a record as ``(file name, matplotlib figure)``, made one at a time (not yet written)."""
    for name, draw in _drawings(record).items():
        yield name, draw()


def _drawings(record: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    """Every picture of a record by file name, as a function that draws it."""
    out: dict[str, Callable[[], Any]] = {}
    for kind, layers in record["attention"].items():
        for layer, heads in enumerate(layers):
            out[f"{kind}_layer{layer}.png"] = partial(
                attention_figure, heads, _queries(record, kind), _keys(record, kind),
                title=f"{NAMES[kind]}, layer {layer}")
        if kind == "cross":
            for layer, heads in enumerate(layers):
                out[f"alignment_layer{layer}.png"] = partial(
                    matrix_figure, torch.tensor(heads).mean(0), record["tokens"]["decoder"],
                    record["tokens"]["encoder"],
                    title=f"alignment: target over source, layer {layer}, mean of heads")
    for kind, mask in record["masks"].items():
        out[f"mask_{kind}.png"] = partial(matrix_figure, mask, _queries(record, kind), _keys(record, kind),
                                          cmap="Greys", value_range=(0.0, 1.0),
                                          title=f"{NAMES[kind]} mask: {record['mask_notes'][kind]}")
    for stack, pos in record["positions"].items():
        if "table" in pos:
            out[f"positions_{stack}.png"] = partial(matrix_figure, pos["table"], cmap="RdBu_r", symmetric=True,
                                                    title=f"{pos['scheme']} position encodings", xlabel="dimension",
                                                    ylabel="position")
        if "angles" in pos:
            out[f"positions_{stack}.png"] = partial(matrix_figure, pos["angles"], cmap="RdBu_r", symmetric=True,
                                                    title="RoPE: cos(position x frequency)", xlabel="rotated pair",
                                                    ylabel="position")
        for head, bias in enumerate(pos.get("bias", [])):
            kind = "encoder" if stack == "encoder" else "decoder"
            out[f"positions_{stack}_head{head}.png"] = partial(
                matrix_figure, bias, _queries(record, kind), _keys(record, kind), cmap="RdBu_r", symmetric=True,
                title=f"{pos['scheme']} bias, {stack} head {head}")
    return out


def write_pictures(record: dict[str, Any], directory: str | Path) -> list[Path]:
    """Write every picture of ``record`` into ``directory``; returns the files in the order written."""
    folder = Path(directory)
    return [save_figure(fig, folder / name) for name, fig in figures(record)]


def save_pictures(record: dict[str, Any], directory: str | os.PathLike, *, overwrite: bool = False,
                  sources: Iterable[str | os.PathLike] = (),
                  more: Callable[[dict[str, Any], Path], list[Path]] | None = None) -> list[Path]:
    """Write every picture of ``record`` (and those ``more(record, folder)`` draws) into the folder ``directory``
    as ``aiayn inspect --png`` does; returns the files.

    Args:
        record: an inspection record.
        directory: a new or empty folder, or one an earlier call wrote (its pictures are replaced).
        overwrite: also write into a folder that holds other things (pictures of the same names are replaced;
            nothing else there is changed or removed).
        sources: the inputs (the checkpoint); ``directory`` may not be, hold or lie inside one.
        more: draws further pictures into the folder it is given (e.g. :func:`aiayn.inspect.image.image_pictures`).

    Raises:
        AiaynError: the folder may not be written (:func:`aiayn.output_folder.check_output_folder`), or writing
            failed.
    """
    into = check_output_folder(directory, PICTURES, overwrite=overwrite, sources=sources)
    tmp = staging_folder(into.path)
    try:
        files = write_pictures(record, tmp) + (more(record, tmp) if more is not None else [])
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    install(tmp, into)
    return [into.path / f.relative_to(tmp) for f in files]
