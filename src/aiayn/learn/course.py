"""The learner's entry points: check one function, pass a lesson (its final check, gated on the earlier lessons), and
the course's status."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from aiayn.errors import AiaynError
from aiayn.learn.checking import CheckResult, check_function
from aiayn.learn.exercises import EXERCISES
from aiayn.learn.lessons import LESSONS, Lesson, find_lesson
from aiayn.learn.progress import load_progress, progress_path, record_exercise, record_lesson


def exercise_named(name: str) -> Any:
    """The exercise called ``name`` (an AiaynError listing them otherwise)."""
    if name not in EXERCISES:
        raise AiaynError(f"no exercise named {name!r}; the exercises are {', '.join(EXERCISES)}")
    return EXERCISES[name]


def check(name: str, fn: Callable[..., Any], *, seed: int | None = None, record: bool = True) -> CheckResult:
    """Check the learner's function ``fn`` for exercise ``name`` against aiayn's reference.

    It runs on random shapes and on the edge cases that catch real mistakes; a wrong answer comes with a diagnosis
    (the mistake, and how to fix it). The result's ``repr`` is that report, so a notebook cell that ends with this
    call shows it; ``bool(result)`` says whether it passed.

    Args:
        name: the exercise, e.g. ``"attention"`` (``aiayn.learn.EXERCISES`` lists them).
        fn: the learner's function.
        seed: the random cases' seed (default: a new one, named in the report).
        record: mark the exercise passed in the progress file when it passes.
    """
    exercise = exercise_named(name)
    if not callable(fn):
        raise AiaynError(f"check({name!r}, ...) needs the function itself, got {type(fn).__name__}: pass "
                         f"{name}, not {name}(...)")
    result = check_function(exercise, fn, seed)
    if result.passed and record:
        record_exercise(name)
    return result


@dataclass
class LessonResult:
    """A lesson's final check: each exercise's result, and whether the lesson is now passed."""

    lesson: Lesson
    results: list[CheckResult] = field(default_factory=list)
    absent: list[str] = field(default_factory=list)  # exercises without a function
    source: str = "your functions"

    @property
    def passed(self) -> bool:
        return not self.absent and all(r.passed for r in self.results)

    def __bool__(self) -> bool:
        return self.passed

    def report(self) -> str:
        """The lesson's verdict, each exercise's report, and what comes next."""
        n = len(self.lesson.exercises)
        good = sum(r.passed for r in self.results)
        if self.passed:
            lines = [f"{self.lesson.name}: passed ({n} of {n} exercises)"]
        else:
            lines = [f"{self.lesson.name}: not passed yet ({good} of {n} exercises pass)"]
        lines += [r.report() for r in self.results]
        lines += [f"{name}: no function named {name} in {self.source}" for name in self.absent]
        if self.passed:
            later = [lesson for lesson in LESSONS if lesson.number > self.lesson.number]
            lines.append(f"next: {later[0].name}, {later[0].notebook}" if later else
                         "that was the last lesson: the course is passed")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.report()


def check_lesson(lesson: str | int, functions: Mapping[str, Any] | ModuleType, *, seed: int | None = None,
                 record: bool = True, source: str = "your functions") -> LessonResult:
    """A lesson's final check: every exercise of the lesson, from ``functions``; the lesson is passed when all pass.

    Args:
        lesson: its number (3, "03") or slug ("masks").
        functions: where the learner's functions are, by exercise name: ``globals()`` in a notebook, a module, or
            a dict.
        seed: the random cases' seed.
        record: record passed exercises and the lesson in the progress file.
        source: how the report names where the functions came from.
    Raises:
        AiaynError: an earlier lesson is not passed yet (the message names each, and how to pass it).
    """
    found = find_lesson(lesson)
    missing = load_progress().missing_before(found)
    if missing:
        names = ", ".join(m.name for m in missing)
        raise AiaynError(f"{found.name} needs the lessons before it passed first; not passed yet: {names}. Pass "
                         f"them in order: the last cell of {missing[0].notebook}, or aiayn learn check "
                         f"{missing[0].number} FILE.py")
    space = vars(functions) if isinstance(functions, ModuleType) else functions
    result = LessonResult(found, source=source)
    for name in found.exercises:
        fn = space.get(name)
        if fn is None:
            result.absent.append(name)
        else:
            result.results.append(check(name, fn, seed=seed, record=record))
    if result.passed and record:
        record_lesson(found)
    return result


def status() -> str:
    """Which lessons are passed, which exercises of the open ones pass, and what to do next."""
    progress = load_progress()
    lines = [f"course progress ({progress_path()}):"]
    next_lesson = None
    for lesson in LESSONS:
        marks = " ".join(f"{name}{'+' if name in progress.exercises else '-'}" for name in lesson.exercises)
        if lesson.number in progress.lessons:
            state = f"passed {progress.lessons[lesson.number].replace('T', ' ')}"
        elif progress.missing_before(lesson):
            state = "locked"
        else:
            state = "open"
            next_lesson = next_lesson or lesson
        lines.append(f"  {lesson.number} {lesson.slug:<19} {state:<27} {marks}")
    lines.append("  (+ passed, - not yet; a lesson opens when the lessons before it are passed)")
    if next_lesson is not None:
        lines.append(f"next: {next_lesson.name}: {next_lesson.notebook}, then aiayn learn check "
                     f"{next_lesson.number} FILE.py")
    elif len(progress.lessons) >= len(LESSONS):
        lines.append("every lesson is passed")
    return "\n".join(lines)
