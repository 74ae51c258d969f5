"""The course's notebooks: built from their sources, and copied for a learner with the solutions blanked.

Each lesson's source is ``docs/course/source/NN-slug.py`` in the percent format (cells start at ``# %%``; a
``# %% [markdown]`` cell's lines drop their leading ``# ``). ``python -m aiayn.learn.notebooks`` writes
``docs/course/NN-slug.ipynb`` from them, without outputs. An exercise's solution sits between ``# BEGIN SOLUTION``
and ``# END SOLUTION``: the committed notebooks run top to bottom with the solutions (the tests execute them), and
``aiayn learn start DIR`` copies them with each solution replaced by ``raise NotImplementedError``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from aiayn.errors import AiaynError
from aiayn.files import atomic_write_text

BEGIN, END = "# BEGIN SOLUTION", "# END SOLUTION"
STUB = 'raise NotImplementedError("your turn: write this, then run the check below it")'
METADATA = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"}}


def course_dir() -> Path:
    """``docs/course`` of the source tree aiayn runs from."""
    return Path(__file__).resolve().parents[3] / "docs" / "course"


def _cell(kind: str, lines: list[str], index: int) -> dict[str, Any]:
    while lines and not lines[0].strip():
        lines = lines[1:]
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    text = "\n".join(lines)
    source = [line + "\n" for line in text.split("\n")]
    source[-1] = source[-1].removesuffix("\n")
    cell: dict[str, Any] = {"cell_type": kind, "id": f"cell-{index:02d}", "metadata": {}, "source": source}
    if kind == "code":
        cell.update(execution_count=None, outputs=[])
    return cell


def notebook_from_percent(text: str) -> dict[str, Any]:
    """A notebook (nbformat 4.5, as a dict) from percent-format source."""
    cells: list[dict[str, Any]] = []
    kind, lines = None, []
    for line in text.splitlines():
        if line.startswith("# %%"):
            if kind is not None:
                cells.append(_cell(kind, lines, len(cells)))
            kind, lines = ("markdown" if "[markdown]" in line else "code"), []
            continue
        if kind is None:  # text before the first cell (a module docstring for editors) is not part of it
            continue
        if kind == "markdown":
            line = line[2:] if line.startswith("# ") else line.removeprefix("#")
        lines.append(line)
    if kind is not None:
        cells.append(_cell(kind, lines, len(cells)))
    return {"cells": cells, "metadata": METADATA, "nbformat": 4, "nbformat_minor": 5}


def notebook_text(notebook: dict[str, Any]) -> str:
    """The notebook as the ``.ipynb`` file's text (one-space indent, as Jupyter writes it)."""
    return json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"


def blank_solutions(source: str) -> str:
    """``source`` (one cell's code) with each ``# BEGIN SOLUTION`` .. ``# END SOLUTION`` block replaced by a
    ``raise NotImplementedError`` at the block's indentation."""
    out, inside = [], False
    for line in source.split("\n"):
        stripped = line.strip()
        if stripped == BEGIN:
            inside = True
            out.append(line[: len(line) - len(line.lstrip())] + STUB)
        elif stripped == END:
            inside = False
        elif not inside:
            out.append(line)
    return "\n".join(out)


def exercise_notebook(notebook: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``notebook`` with every solution blanked."""
    cells = []
    for cell in notebook["cells"]:
        cell = dict(cell)
        if cell["cell_type"] == "code":
            text = blank_solutions("".join(cell["source"]))
            cell["source"] = [line + "\n" for line in text.split("\n")]
            cell["source"][-1] = cell["source"][-1].removesuffix("\n")
        cells.append(cell)
    return {**notebook, "cells": cells}


def build(source_dir: Path | None = None, out_dir: Path | None = None) -> list[Path]:
    """Write ``out_dir/NN-slug.ipynb`` from every ``source_dir/NN-slug.py`` (default: ``docs/course``)."""
    out_dir = course_dir() if out_dir is None else out_dir
    source_dir = out_dir / "source" if source_dir is None else source_dir
    written = []
    for src in sorted(source_dir.glob("[0-9][0-9]-*.py")):
        path = out_dir / f"{src.stem}.ipynb"
        atomic_write_text(path, notebook_text(notebook_from_percent(src.read_text(encoding="utf-8"))))
        written.append(path)
    return written


def start(dest: str | Path, overwrite: bool = False) -> list[Path]:
    """Copy the course's notebooks into ``dest`` with the solutions blanked, for the learner to fill in.

    Raises:
        AiaynError: the notebooks are not found (aiayn is not run from its source tree), or ``dest`` already holds
            one of them (unless ``overwrite``).
    """
    notebooks = sorted(course_dir().glob("[0-9][0-9]-*.ipynb"))
    if not notebooks:
        raise AiaynError(f"the course's notebooks are not in {course_dir()}: they live in docs/course of aiayn's "
                         "source tree; clone it and install it with pip install -e .")
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise AiaynError(f"{dest}: not a folder; give a new or existing folder for the notebooks")
    there = [dest / nb.name for nb in notebooks if (dest / nb.name).exists()]
    if there and not overwrite:
        raise AiaynError(f"{there[0]} already exists (your work?); give another folder, or --overwrite to replace "
                         f"the {len(there)} notebook(s) of the course there")
    written = []
    for nb in notebooks:
        path = dest / nb.name
        atomic_write_text(path, notebook_text(exercise_notebook(json.loads(nb.read_text(encoding="utf-8")))))
        written.append(path)
    return written


if __name__ == "__main__":  # python -m aiayn.learn.notebooks: rebuild docs/course/*.ipynb from their sources
    for p in build():
        print(f"wrote {p}", file=sys.stderr)
