"""The course around the checker: progress and mastery gates, ``aiayn learn`` on the command line, ``assemble``
(the learner's pieces trained on the copy task), and the notebooks (in step with their sources, each lesson's
exercises in its notebook, the copies with the solutions blanked)."""

from __future__ import annotations

import json
import math
import re
import types
from pathlib import Path

import pytest
import torch

from aiayn import learn
from aiayn.cli.main import main
from aiayn.errors import AiaynError
from aiayn.learn import notebooks
from aiayn.learn.assemble import REFERENCE_PIECES, PieceError
from aiayn.learn.progress import ENV_VAR, load_progress, progress_path

ROOT = Path(__file__).resolve().parents[2]
COURSE = ROOT / "docs" / "course"

GOOD = '''
import math
import torch

def soft_lookup(query, keys, values):
    return torch.softmax(keys @ query, dim=-1) @ values

def attention(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1) @ v
'''
NO_SCALE = GOOD.replace(" / math.sqrt(q.shape[-1])", "")


@pytest.fixture(autouse=True)
def learn_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test keeps its progress in its own folder."""
    home = tmp_path / "learn-home"
    monkeypatch.setenv(ENV_VAR, str(home))
    return home


def namespace(source: str) -> dict:
    space: dict = {}
    exec(compile(source, "<learner>", "exec"), space)  # noqa: S102 (the test's own code)
    return space


# ---------------------------------------------------------------------------------------------- progress and gates
def test_progress_lives_where_the_environment_says(learn_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert progress_path() == learn_home / "progress.json"
    monkeypatch.delenv(ENV_VAR)
    monkeypatch.setenv("XDG_DATA_HOME", "/somewhere")
    assert progress_path() == Path("/somewhere/aiayn/learn/progress.json")


def test_a_passed_check_is_recorded_and_a_failed_one_is_not() -> None:
    good, bad = namespace(GOOD), namespace(NO_SCALE)
    assert not learn.check("attention", bad["attention"], seed=0)
    assert "attention" not in load_progress().exercises
    assert learn.check("attention", good["attention"], seed=0)
    assert "attention" in load_progress().exercises
    assert learn.check("soft_lookup", good["soft_lookup"], seed=0, record=False)
    assert "soft_lookup" not in load_progress().exercises


def test_check_names_an_unknown_exercise_and_a_call_instead_of_a_function() -> None:
    with pytest.raises(AiaynError, match="no exercise named 'atention'.*attention"):
        learn.check("atention", print)
    with pytest.raises(AiaynError, match="needs the function itself"):
        learn.check("attention", 3)


def test_a_lesson_needs_the_lessons_before_it() -> None:
    good = namespace(GOOD)
    with pytest.raises(AiaynError, match=r"lesson 03 .* not passed yet: lesson 01 .*, lesson 02 .*01-why-attention"):
        learn.check_lesson("03", good)
    assert learn.check_lesson("01", good, seed=0).passed
    with pytest.raises(AiaynError, match=r"not passed yet: lesson 02 \("):
        learn.check_lesson("masks", good)
    result = learn.check_lesson(2, good, seed=0)
    assert result.passed and "next: lesson 03" in result.report()
    assert set(load_progress().lessons) == {"01", "02"}


def test_a_lesson_is_not_passed_with_a_wrong_or_missing_function() -> None:
    assert learn.check_lesson("01", namespace(GOOD), seed=0)
    result = learn.check_lesson("02", namespace(NO_SCALE), seed=0)
    assert not result.passed and "missing scale" in result.report()
    assert "02" not in load_progress().lessons
    empty = learn.check_lesson("02", {}, seed=0, source="mine.py")
    assert not empty.passed and "no function named attention in mine.py" in empty.report()


def test_a_check_lesson_takes_a_module() -> None:
    module = types.ModuleType("mine")
    exec(compile(GOOD, "<mine>", "exec"), vars(module))  # noqa: S102
    assert learn.check_lesson("01", module, seed=0).passed


def test_status_shows_passed_open_and_locked_lessons() -> None:
    learn.check_lesson("01", namespace(GOOD), seed=0)
    learn.check("attention", namespace(GOOD)["attention"], seed=0)
    text = learn.status()
    assert re.search(r"01 why-attention\s+passed \d{4}-\d\d-\d\d", text)
    assert re.search(r"02 scaled-dot-product\s+open\s+attention\+", text)
    assert re.search(r"03 masks\s+locked", text)
    assert "next: lesson 02" in text


def test_a_damaged_progress_file_is_named(learn_home: Path) -> None:
    learn_home.mkdir(parents=True)
    (learn_home / "progress.json").write_text("{not json")
    with pytest.raises(AiaynError, match="progress.json: not a course progress file.*delete it"):
        learn.status()


def test_lessons_are_found_by_number_or_name() -> None:
    assert learn.find_lesson(3).slug == learn.find_lesson("03").slug == learn.find_lesson("masks").slug == "masks"
    assert learn.find_lesson("03-masks.ipynb").number == "03"
    with pytest.raises(AiaynError, match="no lesson '11'; the lessons are 01 .*10 \\(explorer\\)"):
        learn.find_lesson("11")


def test_every_exercise_belongs_to_exactly_one_lesson() -> None:
    in_lessons = [name for lesson in learn.LESSONS for name in lesson.exercises]
    assert sorted(in_lessons) == sorted(learn.EXERCISES)
    assert [lesson.number for lesson in learn.LESSONS] == [f"{i:02d}" for i in range(1, 11)]
    for lesson in learn.LESSONS:
        assert all(learn.EXERCISES[name].lesson == lesson.number for name in lesson.exercises)


# ---------------------------------------------------------------------------------------------- the command line
def write(tmp_path: Path, text: str, name: str = "mine.py") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_cli_status(capsys: pytest.CaptureFixture) -> None:
    assert main(["learn", "status"]) == 0
    out = capsys.readouterr().out
    assert "01 why-attention" in out and "next: lesson 01" in out


def test_cli_check_passes_fails_and_gates(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    good, bad = write(tmp_path, GOOD), write(tmp_path, NO_SCALE, "bad.py")
    assert main(["learn", "check", "02", good]) == 2  # lesson 01 first
    assert "needs the lessons before it passed first; not passed yet: lesson 01" in capsys.readouterr().err
    assert main(["learn", "check", "1", good, "--seed", "3"]) == 0
    assert "lesson 01 (why attention: the path length problem): passed" in capsys.readouterr().out
    assert main(["learn", "check", "02", bad]) == 1
    out = capsys.readouterr().out
    assert "not passed yet" in out and "diagnosis: missing scale" in out
    assert main(["learn", "check", "attention", bad]) == 1  # one exercise, no gate
    assert "diagnosis: missing scale" in capsys.readouterr().out
    assert main(["learn", "check", "02", good]) == 0
    assert main(["learn", "status"]) == 0
    assert re.search(r"02 scaled-dot-product\s+passed", capsys.readouterr().out)


def test_cli_check_names_user_mistakes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["learn", "check", "01", str(tmp_path / "absent.py")]) == 2
    assert "absent.py: no such file" in capsys.readouterr().err
    broken = write(tmp_path, "def soft_lookup(q, k, v):\n    return (\n", "broken.py")
    assert main(["learn", "check", "01", broken]) == 2
    assert re.search(r"broken\.py:\d+: syntax error", capsys.readouterr().err)
    raising = write(tmp_path, "import torch\nx = 1 / 0\n", "raising.py")
    assert main(["learn", "check", "01", raising]) == 2
    assert "raising.py:2: running it raised ZeroDivisionError" in capsys.readouterr().err
    assert main(["learn", "check", "rope", write(tmp_path, GOOD)]) == 2
    assert "no function named rope" in capsys.readouterr().err
    assert main(["learn", "check", "eleven", write(tmp_path, GOOD)]) == 2
    assert "no lesson 'eleven'" in capsys.readouterr().err


def test_cli_start_writes_the_notebooks_without_solutions(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    dest = tmp_path / "course"
    assert main(["learn", "start", str(dest)]) == 0
    written = sorted(p.name for p in dest.glob("*.ipynb"))
    assert written == sorted(p.name for p in COURSE.glob("*.ipynb")) and len(written) == 10
    nb = json.loads((dest / "03-masks.ipynb").read_text())
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert notebooks.BEGIN not in code and code.count(notebooks.STUB) == 3 and "torch.finfo" not in code
    assert main(["learn", "start", str(dest)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["learn", "start", str(dest), "--overwrite"]) == 0


# ---------------------------------------------------------------------------------------------- assemble
def peeking_causal_mask(t: int, s: int | None = None) -> torch.Tensor:
    s = t if s is None else s
    return torch.arange(s)[None, :] <= torch.arange(s - t, s)[:, None] + 1


def test_the_reference_pieces_learn_to_copy() -> None:
    result = learn.assemble(REFERENCE_PIECES, steps=300)
    assert result.yours == list(REFERENCE_PIECES) and all(r.passed for r in result.checks.values())
    assert result.learned and result.exact_match >= 0.95, result.report()
    assert "your Transformer learned to copy" in result.report()


def test_a_decoder_that_sees_the_next_token_is_diagnosed_and_fails_to_decode() -> None:
    result = learn.assemble(causal_mask=peeking_causal_mask, steps=300)
    assert result.checks["causal_mask"].titles == ["causal mask off by one: sees the next token"]
    assert not result.learned and result.exact_match < 0.2
    assert math.isfinite(result.losses[-1]) and result.losses[-1] < 1.0  # it learned to read the answer
    assert "read the answer while training" in result.report()


def test_a_piece_that_raises_is_named() -> None:
    def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
        return x.view(x.shape[0], n_heads, -1, 7)

    with pytest.raises(PieceError, match="your split_heads raised RuntimeError"):
        learn.assemble(split_heads=split_heads, steps=5, check=False)
    with pytest.raises(AiaynError, match="assemble\\(\\) got attention; the pieces it takes are masked_attention"):
        learn.assemble(attention=split_heads)


def test_cli_assemble(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = write(tmp_path, "import torch\n\n" + "\n".join([
        "def causal_mask(t, s=None):",
        "    s = t if s is None else s",
        "    return torch.arange(s)[None, :] <= torch.arange(s - t, s)[:, None] + 1"]) + "\n")
    assert main(["learn", "assemble", path, "--steps", "40"]) == 1
    out = capsys.readouterr().out
    assert "your pieces: causal_mask" in out and "causal mask off by one" in out


# ---------------------------------------------------------------------------------------------- the notebooks
def test_the_notebooks_are_built_from_their_sources() -> None:
    sources = sorted((COURSE / "source").glob("[0-9][0-9]-*.py"))
    assert [s.stem for s in sources] == [f"{lesson.number}-{lesson.slug}" for lesson in learn.LESSONS]
    for src in sources:
        built = notebooks.notebook_text(notebooks.notebook_from_percent(src.read_text(encoding="utf-8")))
        committed = (COURSE / f"{src.stem}.ipynb").read_text(encoding="utf-8")
        assert built == committed, f"{src.stem}.ipynb differs from its source: run python -m aiayn.learn.notebooks"


@pytest.mark.parametrize("lesson", learn.LESSONS, ids=lambda lesson: lesson.number)
def test_each_notebook_holds_its_exercises_and_links_the_explorer(lesson: learn.Lesson) -> None:
    nb = json.loads((ROOT / lesson.notebook).read_text(encoding="utf-8"))
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    text = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    for name in lesson.exercises:
        cell = next((c for c in code if f"def {name}(" in c), None)
        assert cell is not None and notebooks.BEGIN in cell and notebooks.END in cell, name
        assert f'learn.check("{name}", {name})' in "\n".join(code), name
        blank = notebooks.blank_solutions(cell)
        assert notebooks.STUB in blank and notebooks.BEGIN not in blank
        compile(blank, name, "exec")  # the learner's copy is still valid Python
    assert code[-1].strip() == f'learn.check_lesson("{lesson.number}", globals())'
    assert "](../inspect.md)" in text and "aiayn inspect" in text
    assert not any(o for c in nb["cells"] if c["cell_type"] == "code" for o in c["outputs"])


def test_blank_solutions_keeps_the_indentation() -> None:
    source = "def f(x):\n    # BEGIN SOLUTION\n    y = x + 1\n    return y\n    # END SOLUTION\n\n\nprint(f)"
    assert notebooks.blank_solutions(source) == f"def f(x):\n    {notebooks.STUB}\n\n\nprint(f)"


def test_the_notebooks_are_valid_nbformat() -> None:
    nbformat = pytest.importorskip("nbformat", reason="nbformat (a dev dependency) is not installed")
    for path in sorted(COURSE.glob("*.ipynb")):
        nbformat.validate(nbformat.read(path, as_version=4))


def test_the_course_readme_lists_every_lesson_and_diagnosis() -> None:
    readme = " ".join((COURSE / "README.md").read_text(encoding="utf-8").split())
    for lesson in learn.LESSONS:
        assert f"({lesson.number}-{lesson.slug}.ipynb)" in readme
    for name, exercise in learn.EXERCISES.items():
        for mistake in exercise.mistakes:
            assert mistake.title in readme, f"docs/course/README.md does not list {name}'s {mistake.title!r}"
