"""Every lesson of the course (docs/course/*.ipynb) runs top to bottom with its solutions, in a Jupyter kernel, and
its final check passes.

Each notebook runs in its own kernel, with the progress file in a fresh folder where the lessons before it are
already passed (its final check needs them). The kernel packages (nbclient, nbformat, ipykernel) come with the
``dev`` extra, which ``make test`` installs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from aiayn.learn import LESSONS, Lesson
from aiayn.learn.progress import ENV_VAR, Progress, load_progress, save_progress

nbformat = pytest.importorskip("nbformat", reason="executing the notebooks needs nbformat (pip install -e '.[dev]')")
nbclient = pytest.importorskip("nbclient", reason="executing the notebooks needs nbclient (pip install -e '.[dev]')")
pytest.importorskip("ipykernel", reason="executing the notebooks needs a Python kernel: ipykernel "
                                        "(pip install -e '.[dev]')")

ROOT = Path(__file__).resolve().parents[2]
COURSE = ROOT / "docs" / "course"
KERNEL = "aiayn-course-test"


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda lesson: f"{lesson.number}-{lesson.slug}")
def test_the_notebook_runs_and_passes_its_lesson(lesson: Lesson, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "learn-home"))  # the kernel inherits it
    spec = tmp_path / "jupyter" / "kernels" / KERNEL  # this interpreter's kernel, whatever else is installed
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "aiayn course", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    save_progress(Progress({}, {earlier.number: "2026-01-01T00:00:00" for earlier in LESSONS
                                if earlier.number < lesson.number}))
    notebook = nbformat.read(ROOT / lesson.notebook, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=240, kernel_name=KERNEL,
                                     resources={"metadata": {"path": str(COURSE)}})
    client.execute()  # raises CellExecutionError, with the cell and its traceback, when a cell fails
    assert lesson.number in load_progress().lessons, "the notebook's final check did not pass the lesson"
    last = "".join(o.get("data", {}).get("text/plain", "") for o in notebook.cells[-1].outputs)
    assert f"lesson {lesson.number} ({lesson.title}): passed" in last
