"""The checker: run a learner's function against aiayn's reference, and name the mistake when it differs.

An :class:`Exercise` holds aiayn's reference, the cases to run (random shapes and fixed edge cases that tell
mistakes apart), and its known :class:`Mistake` s. Each mistake is a setting of one knob of the exercise's
``variant``: a deliberately wrong implementation (``variant()`` with no knob set is the reference's behaviour). When
the learner's outputs differ from the reference's, the checker runs every wrong variant, then every pair of them
on different knobs, and names those whose outputs equal the learner's on every case (raising where the learner
raised): that is the diagnosis. Without one it shows the first case that differs and where.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import random
import secrets
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

import aiayn


@dataclass(frozen=True)
class Case:
    """One input of an exercise.

    Args:
        label: what the case is ("2 heads, 4 queries over 6 keys, one query with no allowed key").
        args, kwargs: what the function is called with (tensors are cloned before each call).
        info: anything the exercise's ``prepare`` needs to know about the case (e.g. which queries are padding).
    """

    label: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Mistake:
    """A known wrong way to write the exercise: ``variant(**{knob: value})``.

    Args:
        knob, value: the variant's setting that makes the mistake.
        title: its short name ("missing scale").
        hint: what the mistake does and how to fix it.
    """

    knob: str
    value: Any
    title: str
    hint: str


@dataclass(frozen=True)
class Exercise:
    """A function the learner writes, checked against aiayn's reference.

    Args:
        name: the function's name (``attention``); also its name in ``aiayn learn check``'s file.
        signature: how it is called, with shapes ("attention(q, k, v): q (..., T, Dh), ... -> (..., T, Dv)").
        reference: aiayn's own implementation, with the learner's signature.
        variant: ``variant(**knobs)`` -> a function; every :class:`Mistake` is one knob setting.
        mistakes: the known mistakes.
        cases: ``cases(rng)`` -> the fixed edge cases and a few random ones drawn from ``rng``.
        invoke: how a function is run on a case (default: ``fn(*case.args, **case.kwargs)``).
        prepare: ``prepare(output, case)`` -> what is compared (e.g. rows that do not matter set to a constant).
        broadcast: a tensor output may have any shape that broadcasts to the reference's (masks).
        rtol, atol: tolerance of a float comparison.
        lesson: the lesson the exercise belongs to ("03").
    """

    name: str
    signature: str
    reference: Callable[..., Any]
    variant: Callable[..., Callable[..., Any]]
    mistakes: tuple[Mistake, ...]
    cases: Callable[[random.Random], list[Case]]
    invoke: Callable[[Callable[..., Any], Case], Any] | None = None
    prepare: Callable[[Any, Case], Any] | None = None
    broadcast: bool = False
    rtol: float = 1e-4
    atol: float = 1e-5
    lesson: str = ""

    def run(self, fn: Callable[..., Any], case: Case) -> Outcome:
        """``fn`` on ``case``: its value (after ``prepare``) or the exception it raised."""
        args, kwargs = _cloned(case.args), _cloned(case.kwargs)
        try:
            with torch.no_grad():
                value = self.invoke(fn, _with(case, args, kwargs)) if self.invoke else fn(*args, **kwargs)
            if self.prepare is not None:
                value = self.prepare(value, case)
        except Exception as e:  # the learner's code may raise anything; that is an outcome to report
            return Outcome(error=e, where=_learner_line(e))
        names = _parameter_names(self.reference)
        changed = [name for name, before, after in _inputs(case, args, kwargs, names)
                   if not _same_input(before, after)]
        return Outcome(value=value, changed=changed)


@dataclass
class Outcome:
    """What a function did on one case: its value or its exception, and the inputs it changed in place."""

    value: Any = None
    error: BaseException | None = None
    where: str = ""
    changed: list[str] = field(default_factory=list)


@dataclass
class CheckResult:
    """The verdict on one learner's function. ``bool(result)`` is whether it passed; ``repr`` is the report."""

    exercise: Exercise
    passed: bool
    n_cases: int
    failures: list[tuple[str, str]] = field(default_factory=list)  # (case label, what differs)
    diagnoses: list[tuple[Mistake, ...]] = field(default_factory=list)  # each: one mistake, or two together
    notes: list[str] = field(default_factory=list)
    seed: int = 0
    not_written: bool = False  # every case raised NotImplementedError: the exercise's stub

    def __bool__(self) -> bool:
        return self.passed

    @property
    def titles(self) -> list[str]:
        """The diagnoses' short names (``"missing scale"``; two mistakes together as ``"a + b"``)."""
        return [" + ".join(m.title for m in d) for d in self.diagnoses]

    def report(self) -> str:
        """The verdict as text: passed, or what is wrong, where, and the fix."""
        name = self.exercise.name
        if self.passed:
            lines = [f"{name}: passed ({self.n_cases} cases, random shapes and edge cases, seed {self.seed})"]
        elif self.not_written:
            lines = [f"{name}: not written yet (it raises NotImplementedError); write it, then check again",
                     f"  how it is called: {self.exercise.signature}"]
        else:
            lines = [f"{name}: differs from aiayn's reference on {len(self.failures)} of {self.n_cases} cases "
                     f"(seed {self.seed})"]
            for d in self.diagnoses:
                title = " + ".join(m.title for m in d)
                lines.append(f"  diagnosis: {title}")
                lines += [f"    {m.hint}" for m in d]
            if self.failures:
                label, what = self.failures[0]
                lines.append(f"  first case that differs: {label}")
                lines.append(f"    {what}")
            if not self.diagnoses:
                lines.append("  no known mistake does exactly this; compare your function with what it should do:")
                lines.append(f"    {self.exercise.signature}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.report()


# ---------------------------------------------------------------------------------------------- comparing
def difference(expected: Any, got: Any, *, rtol: float, atol: float, broadcast: bool = False,
               equal_nan: bool = False, path: str = "output") -> str | None:
    """What differs between two outputs (tensors, numbers, or tuples and lists of them), or None when equal.

    A float tensor must have the expected shape and values within ``rtol``/``atol``; a bool tensor (a mask) must be
    bool, of a shape that broadcasts to the expected one when ``broadcast``, with equal values.
    """
    if isinstance(expected, (tuple, list)):
        if not isinstance(got, (tuple, list)):
            return f"{path} is a {type(got).__name__}; expected a {type(expected).__name__} of {len(expected)} items"
        if len(got) != len(expected):
            return f"{path} has {len(got)} items; expected {len(expected)}"
        for i, (e, g) in enumerate(zip(expected, got)):
            found = difference(e, g, rtol=rtol, atol=atol, broadcast=broadcast, equal_nan=equal_nan,
                               path=f"{path}[{i}]")
            if found:
                return found
        return None
    if isinstance(expected, (int, float)) and not isinstance(expected, bool):
        expected = torch.tensor(float(expected), dtype=torch.float64)
    if not isinstance(expected, Tensor):
        return None if got == expected else f"{path} is {got!r}; expected {expected!r}"
    if isinstance(got, (int, float)) and not isinstance(got, bool) and expected.dim() == 0:
        got = torch.tensor(float(got), dtype=torch.float64)
    if not isinstance(got, Tensor):
        return f"{path} is a {type(got).__name__}; expected a tensor of shape {tuple(expected.shape)}"
    if expected.dtype == torch.bool and got.dtype != torch.bool:
        return f"{path} has dtype {got.dtype}; a mask is a bool tensor (True = may attend)"
    if not expected.is_floating_point() and expected.dtype != torch.bool and got.is_floating_point():
        return f"{path} has dtype {got.dtype}; expected whole numbers ({expected.dtype})"
    shape = tuple(expected.shape)
    if broadcast and got.dim() <= expected.dim():
        try:
            fits = torch.broadcast_shapes(got.shape, expected.shape) == expected.shape
        except RuntimeError:
            fits = False
        if not fits:
            return f"{path} has shape {tuple(got.shape)}, which does not broadcast to {shape}"
        got = got.expand(expected.shape)
    elif tuple(got.shape) != shape:
        return f"{path} has shape {tuple(got.shape)}; expected {shape}"
    if expected.dtype == torch.bool or not expected.is_floating_point():
        wrong = (got != expected).nonzero()
        if not len(wrong):
            return None
        at = tuple(wrong[0].tolist())
        return f"{path}{list(at)} is {got[at].item()}; expected {expected[at].item()} ({len(wrong)} entries differ)"
    e, g = expected.double(), got.detach().double()
    nan_e, nan_g = e.isnan(), g.isnan()
    if (nan_g & ~nan_e).any():
        at = tuple((nan_g & ~nan_e).nonzero()[0].tolist())
        if not equal_nan:
            return f"{path}{list(at)} is NaN; expected {e[at].item():.4g}"
    close = torch.isclose(g, e, rtol=rtol, atol=atol, equal_nan=equal_nan)
    if bool(close.all()):
        return None
    gap = (g - e).abs().masked_fill(close, 0).nan_to_num(float("inf"))
    at = tuple(int(i) for i in torch.unravel_index(gap.argmax(), gap.shape))
    return (f"{path}{list(at)} is {g[at].item():.4g}; expected {e[at].item():.4g} "
            f"({int((~close).sum())} of {close.numel()} values differ)")


def _same(a: Outcome, b: Outcome, exercise: Exercise) -> bool:
    """Whether two outcomes agree: both raised, or equal values (NaN equal to NaN), at a looser tolerance."""
    if (a.error is None) != (b.error is None):
        return False
    if a.error is not None:
        return True
    return difference(a.value, b.value, rtol=max(exercise.rtol, 1e-3), atol=max(exercise.atol, 1e-4),
                      broadcast=exercise.broadcast, equal_nan=True) is None


# ---------------------------------------------------------------------------------------------- checking
def check_function(exercise: Exercise, fn: Callable[..., Any], seed: int | None = None) -> CheckResult:
    """Run ``fn`` and aiayn's reference on the exercise's cases; diagnose a difference.

    Args:
        exercise: what is checked.
        fn: the learner's function.
        seed: the random cases' seed (None: a new one, named in the report).
    """
    seed = secrets.randbelow(10_000) if seed is None else seed
    with one_thread(), torch.random.fork_rng(devices=[]):  # the learner's random state is left as it was
        return _check(exercise, fn, seed)


def _check(exercise: Exercise, fn: Callable[..., Any], seed: int) -> CheckResult:
    torch.manual_seed(seed)
    cases = exercise.cases(random.Random(seed))
    expected = [exercise.run(exercise.reference, c) for c in cases]
    for c, e in zip(cases, expected):
        if e.error is not None:  # the reference raising is aiayn's bug, not the learner's
            raise RuntimeError(f"{exercise.name}: the reference failed on {c.label!r}") from e
    mine = [exercise.run(fn, c) for c in cases]
    failures, notes = [], []
    for c, e, m in zip(cases, expected, mine):
        if m.error is not None:
            failures.append((c.label, _raised(m)))
            continue
        what = difference(e.value, m.value, rtol=exercise.rtol, atol=exercise.atol, broadcast=exercise.broadcast)
        if what:
            failures.append((c.label, what))
    changed = sorted({name for m in mine for name in m.changed})
    if changed:
        notes.append(f"your function changed its input {', '.join(changed)} in place; work on a copy (the caller "
                     "still needs it)")
    result = CheckResult(exercise, not failures, len(cases), failures, notes=notes, seed=seed)
    if failures:
        if all(isinstance(m.error, NotImplementedError) for m in mine):
            result.not_written = True
        else:
            result.diagnoses = diagnose(exercise, cases, mine)
    return result


def diagnose(exercise: Exercise, cases: Sequence[Case], mine: Sequence[Outcome]) -> list[tuple[Mistake, ...]]:
    """The known mistakes (one, else two on different knobs) whose wrong variant does what ``mine`` did on every
    case."""
    def matches(knobs: dict[str, Any]) -> bool:
        try:
            wrong = exercise.variant(**knobs)
        except Exception:  # a combination the variant does not build
            return False
        return all(_same(exercise.run(wrong, c), m, exercise) for c, m in zip(cases, mine))

    singles = [(m,) for m in exercise.mistakes if matches({m.knob: m.value})]
    if singles:
        return singles
    pairs = [(a, b) for a, b in itertools.combinations(exercise.mistakes, 2)
             if a.knob != b.knob and matches({a.knob: a.value, b.knob: b.value})]
    return pairs[:3]


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread for the block: the course's tensors are tiny, and threads cost more than they buy (on a
    busy machine, many times more)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _raised(outcome: Outcome) -> str:
    e = outcome.error
    text = f"raised {type(e).__name__}: {e}".strip()
    return f"{text} ({outcome.where})" if outcome.where else text


def _learner_line(e: BaseException) -> str:
    """``file:line`` of the last frame of the traceback outside aiayn and torch: the learner's line that raised.

    aiayn's and torch's frames are told by the packages' real folders, so a learner's file under any folder that
    happens to be named ``aiayn`` (a clone of this repository, say) keeps its line."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not _in_packages(f.filename)]
    if not frames:
        return ""
    f = frames[-1]
    return f"{f.filename}:{f.lineno}: {f.line}" if f.line else f"{f.filename}:{f.lineno}"


_PACKAGES = tuple(Path(m.__file__).resolve().parent for m in (aiayn, torch))


def _in_packages(filename: str) -> bool:
    """Whether a traceback's file lies inside the installed aiayn or torch package."""
    try:
        path = Path(filename).resolve()
    except (OSError, ValueError):  # "<string>", a name the OS cannot resolve
        return False
    return any(path.is_relative_to(p) for p in _PACKAGES)


def _cloned(x: Any) -> Any:
    if isinstance(x, Tensor):
        return x.clone()
    if isinstance(x, tuple):
        return tuple(_cloned(i) for i in x)
    if isinstance(x, list):
        return [_cloned(i) for i in x]
    if isinstance(x, dict):
        return {k: _cloned(v) for k, v in x.items()}
    return x


def _with(case: Case, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Case:
    return Case(case.label, args, kwargs, case.info)


def _parameter_names(fn: Callable[..., Any]) -> list[str]:
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return []


def _inputs(case: Case, args: tuple[Any, ...], kwargs: dict[str, Any],
            names: list[str]) -> list[tuple[str, Any, Any]]:
    """(name, original, after the call) of each tensor argument."""
    pairs = [(names[i] if i < len(names) else f"#{i + 1}", a, b) for i, (a, b) in enumerate(zip(case.args, args))]
    pairs += [(k, case.kwargs[k], kwargs[k]) for k in case.kwargs]
    return [(n, a, b) for n, a, b in pairs if isinstance(a, Tensor)]


def _same_input(before: Tensor, after: Tensor) -> bool:
    if before.shape != after.shape or before.dtype != after.dtype:
        return False
    same = before == after
    if before.is_floating_point():
        same = same | (before.isnan() & after.isnan())
    return bool(same.all())
