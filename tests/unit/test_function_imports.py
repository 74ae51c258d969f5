"""Imports inside functions under src/aiayn, each with its reason. An import belongs at the top of its module unless
an optional dependency (matplotlib, transformers, starlette, ...), a lazy load (``aiayn --help`` answers without a
command's modules; the accelerator's entry point loads no kernels) or an import cycle keeps it in a function; such an
import says why in a trailing comment (``# optional: matplotlib``, ``# lazy: loaded when the command runs``,
``# cycle: aiayn.x imports this module``). A run of imports one after another in the same block shares the comment of
its first. Read with ``ast`` and ``tokenize``, so methods and nested functions count too."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "src" / "aiayn"

#: comments that are tool pragmas, not reasons
PRAGMAS = ("noqa", "type:", "pragma:", "fmt:", "isort:")


def _reason_lines(source: str) -> set[int]:
    """The lines of ``source`` that carry a comment other than a tool pragma."""
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and not tok.string.lstrip("#").strip().startswith(PRAGMAS):
            lines.add(tok.start[0])
    return lines


def _blocks(node: ast.AST):
    """Every statement list under ``node`` (bodies, else and finally branches, handlers, match cases)."""
    for child in ast.walk(node):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(child, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block


def unexplained_imports(source: str, name: str = "<source>") -> list[str]:
    """``name:line`` of each import inside a function of ``source`` with no reason: no comment on its lines, and not
    right after an import of the same block that has one (directly or through the imports between them)."""
    reasons = _reason_lines(source)
    found: set[int] = set()
    for func in ast.walk(ast.parse(source)):
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for block in _blocks(func):
            explained = False  # whether the run of imports just above has a reason
            for stmt in block:
                if not isinstance(stmt, ast.Import | ast.ImportFrom):
                    explained = False
                    continue
                explained = explained or any(line in reasons for line in range(stmt.lineno, stmt.end_lineno + 1))
                if not explained:
                    found.add(stmt.lineno)
    return [f"{name}:{line}" for line in sorted(found)]


def test_every_import_inside_a_function_says_why() -> None:
    offenders = [o for path in sorted(PKG.rglob("*.py"))
                 for o in unexplained_imports(path.read_text(), str(path.relative_to(PKG.parents[1])))]
    assert not offenders, ("imports inside functions without a reason (move them to the top of the module, or say "
                           "why in a trailing comment: optional, lazy or cycle):\n  " + "\n  ".join(offenders))


@pytest.mark.parametrize(("source", "expected"), [
    ("def f():\n    import json\n", ["<source>:2"]),
    ("def f():\n    import json  # lazy: for a reason\n", []),
    ("def f():\n    import json  # noqa: F401\n", ["<source>:2"]),
    ("def f():\n    import json  # optional: x\n    import csv\n\n    import io\n", []),
    ("def f():\n    import json  # optional: x\n    x = 1\n    import csv\n", ["<source>:4"]),
    ("class A:\n    def f(self):\n        def g():\n            import json\n", ["<source>:4"]),
    ("def f():\n    try:\n        import json\n    except ImportError:\n        pass\n", ["<source>:3"]),
    ("def f():\n    from a import (  # cycle: a imports this\n        b,\n    )\n", []),
    ("import json\n\nclass A:\n    import csv\n", []),
    ("async def f():\n    if x:\n        import json\n", ["<source>:3"]),
])
def test_the_checker(source: str, expected: list[str]) -> None:
    """The checker itself: what it flags and what it lets pass."""
    assert unexplained_imports(source) == expected
