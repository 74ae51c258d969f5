"""Checking settings: rules that judge one value, and a collector that lists every problem of a section at once.

Every section of settings is checked the same way: :class:`~aiayn.config.ModelConfig`,
:class:`~aiayn.train.train_config.TrainConfig`, and a recipe's task sections (``[data]``, ``[tokenizer]``,
``[decode]``, ``[eval]``; :mod:`aiayn.train.recipe`):

1. unknown keys, each with the closest known key (:func:`unknown_key`);
2. types: a value of the wrong type gets one problem (``must be a whole number``) and no further check
   (:func:`type_problem`: from a dataclass field's annotation, or a task section's default);
3. a table of :data:`Rule` s, at most one per key: each takes a value and says what is wrong with it and the fix
   (``must be >= 1``), or None when the value is fine;
4. checks across keys (``warmup`` below ``max_steps``), each made only when the keys it reads have good types
   (:meth:`Problems.ok`).

:class:`Problems` collects the lines, each ``key=value: problem; fix``, so that the caller raises one
:class:`~aiayn.errors.AiaynError` that lists them all. This module imports nothing of aiayn but its errors, so that
every layer can use it.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, fields
from typing import Any

Rule = Callable[[Any], "str | None"]  # a value -> what is wrong with it and the fix, or None when it is fine

_WORDS = {"int": "a whole number", "float": "a number", "bool": "true or false", "str": "a string in quotes"}


# ------------------------------------------------------------------------------------------------ types
def type_problem(value: Any, annotation: str, none: str = "null (left out)") -> str | None:
    """Why ``value`` does not fit the type ``annotation`` (``"int"``, ``"float | None"``, ``"bool"``, ``"str"``,
    ``"tuple[float, float]"``), or None when it does. An int is fine for a float; a bool is never a number.
    ``none``: what None means where the annotation allows it (said in the message)."""
    kinds = [k.strip() for k in annotation.split("|")]
    if value is None:
        return None if "None" in kinds else "must be set (null is not allowed here)"
    for kind in kinds:
        if kind == "bool" and isinstance(value, bool):
            return None
        if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
            return None
        if kind == "float" and isinstance(value, (int, float)) and not isinstance(value, bool):
            return None
        if kind == "str" and isinstance(value, str):
            return None
        if kind.startswith("tuple[") and isinstance(value, (list, tuple)):
            inner = [k.strip() for k in kind[len("tuple["):-1].split(",")]
            if len(value) == len(inner) and all(type_problem(v, k) is None for v, k in zip(value, inner)):
                return None
    wanted = [_WORDS.get(k, f"a list of {len(k.split(','))} numbers" if k.startswith("tuple[") else k)
              for k in kinds if k != "None"]
    return "must be " + " or ".join(wanted) + (f", or {none}" if "None" in kinds else "")


def of_type(annotation: str, none: str = "null (left out)") -> Rule:
    """:func:`type_problem` as a rule."""
    return lambda value: type_problem(value, annotation, none)


def type_of(default: Any) -> str | None:
    """The annotation a default value implies (``3`` -> ``"int"``), or None for a default of another kind."""
    for kind in (bool, int, float, str):
        if isinstance(default, kind):
            return kind.__name__
    return None


def unknown_key(key: str, value: Any, known: Iterable[str]) -> str:
    """``key=value: unknown key; did you mean ...`` (or the valid keys when none is close)."""
    known = list(known)
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(sorted(known))}"
    return f"{key}={value!r}: unknown key; {hint}"


def toml_value(value: Any) -> str:
    """A value as a recipe writes it (``true``, ``"bpe"``, ``[0.9, 0.98]``, ``1e-09``)."""
    return json.dumps(list(value) if isinstance(value, tuple) else value)


# ------------------------------------------------------------------------------------------------ rules
def rule(good: Callable[[Any], bool], problem: str, *, unset: str | None = None) -> Rule:
    """The rule ``good(value) or problem``. ``unset``: None is allowed and means this (``"none (no limit)"``),
    said after the problem as ``, or none (no limit)``."""
    tail = f", or {unset}" if unset else ""

    def check(value: Any) -> str | None:
        if value is None and unset:
            return None
        return None if good(value) else problem + tail
    return check


def at_least(low: float, *, whole: bool = False, finite: bool = False, note: str = "",
             unset: str | None = None) -> Rule:
    """Not below ``low``: ``must be >= low``, or with ``whole`` ``must be a whole number >= low``, with ``finite``
    (which also refuses inf and nan) ``must be a finite number >= low``; ``note`` follows (``", e.g. 8"``)."""
    what = "a whole number " if whole else "a finite number " if finite else ""
    return rule(lambda v: not v < low and (not finite or math.isfinite(v)), f"must be {what}>= {_show(low)}{note}",
                unset=unset)


def above(low: float, *, finite: bool = False, note: str = "", unset: str | None = None) -> Rule:
    """Not at or below ``low``: ``must be > low``, or with ``finite`` (which also refuses inf and nan) ``must be a
    finite number > low``; ``note`` follows."""
    what = "a finite number " if finite else ""
    return rule(lambda v: not v <= low and (not finite or math.isfinite(v)), f"must be {what}> {_show(low)}{note}",
                unset=unset)


def within(low: float, high: float, *, open_low: bool = False, closed_high: bool = False) -> Rule:
    """``low <= value < high`` (``open_low``: ``low <`` ; ``closed_high``: ``<= high``): ``must be in [low, high)``."""
    def good(v: Any) -> bool:
        return (v > low if open_low else v >= low) and (v <= high if closed_high else v < high)
    span = f"{'(' if open_low else '['}{_show(low)}, {_show(high)}{']' if closed_high else ')'}"
    return rule(good, f"must be in {span}")


def choice(options: Iterable[str], *, note: str = "", optional: bool = False) -> Rule:
    """One of ``options`` (``optional``: or None): ``unknown; choose one of a, b``; ``note`` follows."""
    options = tuple(options)
    return rule(lambda v: (optional and v is None) or (isinstance(v, str) and v in options),
                f"unknown; choose one of {', '.join(options)}{note}")


def _show(bound: float) -> str:
    """A bound as a message writes it: ``1``, ``0.5``, ``1e-05``."""
    return str(bound) if isinstance(bound, int) else f"{bound:g}"


def first(*rules: Rule) -> Rule:
    """The first problem of ``rules``, checked in order (a type rule, then a range rule)."""
    def check(value: Any) -> str | None:
        for r in rules:
            problem = r(value)
            if problem is not None:
                return problem
        return None
    return check


# ------------------------------------------------------------------------------------------------ the collector
class Problems:
    """Every problem of one section of settings, as ``key=value: problem; fix`` lines (:attr:`lines`).

    Args:
        values: the section's values by key.
        prefix: written before each line (``"[data] "``).
    """

    def __init__(self, values: Mapping[str, Any], prefix: str = "") -> None:
        self.values, self.prefix = values, prefix
        self.lines: list[str] = []
        self.keys: set[str] = set()  # keys with a problem
        self.wrong_type: set[str] = set()  # keys whose value has the wrong type: no further rule checks them

    def ok(self, *names: str) -> bool:
        """True when none of ``names`` has a value of the wrong type (a check that reads them may run)."""
        return not self.wrong_type.intersection(names)

    def add(self, name: str, problem: str) -> None:
        """The problem ``problem`` of key ``name``: ``name=value: problem``."""
        self.line(f"{name}={self.values[name]!r}: {problem}", name)

    def line(self, text: str, *names: str) -> None:
        """A problem written out (of the keys ``names``)."""
        self.lines.append(self.prefix + text)
        self.keys.update(names)

    def unknown(self, known: Iterable[str]) -> None:
        """A problem for each key of the section that is not in ``known``."""
        known = list(known)
        for key in self.values:
            if key not in known:
                self.line(unknown_key(key, self.values[key], known), key)

    def check(self, name: str, rule: Rule, example: Any = None) -> str | None:
        """Apply ``rule`` to key ``name`` (unless its type is wrong) and return its problem, added with
        ``, e.g. name = example`` where ``example`` passes the rule and the problem gives no example or choices."""
        if not self.ok(name):
            return None
        problem = rule(self.values[name])
        if problem is None:
            return None
        if example is not None and rule(example) is None and "e.g." not in problem and "choose one of" not in problem:
            problem += f", e.g. {name} = {toml_value(example)}"
        self.add(name, problem)
        return problem

    def check_all(self, rules: Mapping[str, Rule], examples: Mapping[str, Any] | None = None) -> None:
        """:meth:`check` every key of ``rules`` present in the section, in the table's order."""
        for name, r in rules.items():
            if name in self.values:
                self.check(name, r, (examples or {}).get(name))

    def check_types(self, annotations: Mapping[str, str], examples: Mapping[str, Any] | None = None) -> None:
        """Check each key's type against its annotation (``"int | None"``); a key of the wrong type is left out of
        every later check."""
        for name, annotation in annotations.items():
            if name in self.values and self.check(name, of_type(annotation), (examples or {}).get(name)):
                self.wrong_type.add(name)


def dataclass_types(config: Any) -> tuple[dict[str, str], dict[str, Any]]:
    """A dataclass instance's (annotations by field, defaults by field) for :meth:`Problems.check_types`."""
    annotations = {f.name: str(f.type) for f in fields(config)}
    defaults = {f.name: f.default for f in fields(config) if f.default is not MISSING}
    return annotations, defaults
