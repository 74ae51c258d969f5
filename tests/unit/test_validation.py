"""The one way settings are checked (aiayn.validation), and the tasks' recipe checks registered from above
(aiayn.train reads no task module)."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

from aiayn.errors import AiaynError
from aiayn.validation import Problems, above, at_least, choice, first, of_type, rule, type_problem, within

TRAIN = Path(__file__).resolve().parents[2] / "src" / "aiayn" / "train"


def test_each_rule_says_what_is_wrong_and_passes_good_values() -> None:
    assert at_least(1)(0) == "must be >= 1" and at_least(1)(1) is None
    assert at_least(1, whole=True, note=", e.g. 8")(0) == "must be a whole number >= 1, e.g. 8"
    assert at_least(0, finite=True)(math.inf) == "must be a finite number >= 0"
    assert at_least(1, unset="none (no limit)")(None) is None
    assert at_least(1, unset="none (no limit)")(0) == "must be >= 1, or none (no limit)"
    assert above(0)(0) == "must be > 0" and above(0)(1e-9) is None
    assert above(0, finite=True)(math.nan) == "must be a finite number > 0"
    assert within(0, 1)(1) == "must be in [0, 1)" and within(0, 1, closed_high=True)(1) is None
    assert within(0, 1, open_low=True)(0) == "must be in (0, 1)"
    assert choice(("a", "b"))("c") == "unknown; choose one of a, b" and choice(("a", "b"))(None) is not None
    assert choice(("a", "b"), optional=True, note=" (x)")(None) is None
    assert rule(lambda v: v % 2 == 0, "must be even")(3) == "must be even"
    whole_from_two = first(of_type("int"), at_least(2))
    assert whole_from_two(1.5) == "must be a whole number" and whole_from_two(1) == "must be >= 2"


def test_types_follow_the_annotation() -> None:
    assert type_problem(True, "int") == "must be a whole number"  # a bool is never a number
    assert type_problem(3, "float") is None  # an int is a fine float
    assert type_problem(None, "int | None") is None
    assert type_problem("x", "int | None") == "must be a whole number, or null (left out)"
    assert type_problem("x", "int | None", none="none (every block)") == "must be a whole number, or none (every block)"
    assert type_problem([1, 2], "tuple[float, float]") is None
    assert type_problem([1], "tuple[float, float]") == "must be a list of 2 numbers"


def test_problems_lists_every_problem_and_checks_a_wrong_type_once() -> None:
    p = Problems({"steps": "many", "rate": -1.0, "mode": "x", "extra": 1}, prefix="[s] ")
    p.unknown(("steps", "rate", "mode"))
    p.check_types({"steps": "int", "rate": "float", "mode": "str"}, {"steps": 10, "rate": 0.5})
    p.check_all({"steps": at_least(1), "rate": above(0), "mode": choice(("a", "b"))}, {"rate": 0.5, "mode": "a"})
    if p.ok("steps", "rate"):
        p.add("rate", "never reached: steps has the wrong type")
    assert p.lines == [
        "[s] extra=1: unknown key; valid keys: mode, rate, steps",
        "[s] steps='many': must be a whole number, e.g. steps = 10",
        "[s] rate=-1.0: must be > 0, e.g. rate = 0.5",
        "[s] mode='x': unknown; choose one of a, b",  # the choices say it: no example
    ]
    assert p.keys == {"extra", "steps", "rate", "mode"} and p.wrong_type == {"steps"}


def test_every_task_registers_its_recipe_checks() -> None:
    import aiayn.tasks.registry  # noqa: F401 - registers the tasks' checks
    from aiayn.train.recipe import TASKS, task_checks

    for task in TASKS:
        checks = task_checks(task)
        assert checks.arch in ("encoder", "decoder", "encoder-decoder") and "data" in checks.sections
    assert "decode" in task_checks("translation").sections and "tokenizer" not in task_checks(
        "image_classification").sections
    with pytest.raises(AiaynError, match="'speech': its recipe checks are not registered"):
        task_checks("speech")


def test_nothing_under_aiayn_train_imports_the_tasks() -> None:
    """The tasks sit above training: they register their checks with aiayn.train.recipe, never the reverse (imports
    inside functions count)."""
    offenders = []
    for path in sorted(TRAIN.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name}: {n}" for n in names if n == "aiayn.tasks" or n.startswith("aiayn.tasks.")]
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
                offenders.append(f"{path.name}: importlib.import_module")
    assert not offenders
