"""The layering rule, checked on the source: the reference core never imports an accelerator, and no package imports
form a cycle. Imports are read with ``ast`` (module level and inside functions alike), so a lazy import counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PKG = SRC / "aiayn"

#: where an accelerator is applied (or its switch, train.accel, validated): these may import the entry point
#: ``aiayn.accel`` (never ``aiayn.accel.cpu``)
CALL_SITES = {"aiayn.pretrained", "aiayn.train.trainer", "aiayn.train.train_config", "aiayn.train.distributed",
              "aiayn.cli.main",
              "aiayn.cli.commands", "aiayn.cli.lm_commands", "aiayn.cli.check"}
#: application code above the core (commands, demos): may import the entry point too
APPLICATIONS = ("aiayn.cli.", "aiayn.demos.", "aiayn.check")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every aiayn module ``path`` imports, anywhere in the file (``from a import b`` counts a.b where it exists)."""
    return _imports_of(path.read_text(), _module_name(path), path.name == "__init__.py")


def _imports_of(source: str, module: str, is_package: bool = False) -> set[str]:
    """:func:`_imports` of ``source``, the text of ``module``."""
    tree = ast.parse(source)
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            for a in node.names:
                candidate = f"{base}.{a.name}"
                if (SRC / Path(*candidate.split("."))).with_suffix(".py").exists() or (
                        SRC / Path(*candidate.split(".")) / "__init__.py").exists():
                    found.add(candidate)
    return {m for m in found if m == "aiayn" or m.startswith("aiayn.")}


def _all_modules() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p) for p in sorted(PKG.rglob("*.py"))}


def _is_accel(name: str) -> bool:
    return name == "aiayn.accel" or name.startswith("aiayn.accel.")


def test_the_core_imports_no_accelerator() -> None:
    offenders = []
    for module, imported in _all_modules().items():
        if _is_accel(module):
            continue
        for target in sorted(imported):
            if not _is_accel(target):
                continue
            allowed = target == "aiayn.accel" and (module in CALL_SITES or module.startswith(APPLICATIONS))
            if not allowed:
                offenders.append(f"{module} imports {target}")
    assert not offenders, "the reference core must not import an accelerator:\n  " + "\n  ".join(offenders)


def test_the_accelerator_entry_point_imports_only_the_core_at_module_level() -> None:
    """``aiayn.accel`` is imported by call sites; importing it must not pull in the CPU kernels."""
    tree = ast.parse((PKG / "accel" / "__init__.py").read_text())
    top = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    names = {n.module for n in top if isinstance(n, ast.ImportFrom)} | {a.name for n in top if isinstance(n, ast.Import)
                                                                        for a in n.names}
    assert not any(name and name.startswith("aiayn.accel.") for name in names)


def test_no_import_cycles_between_modules() -> None:
    graph = _all_modules()
    # only module-level imports make a cycle at import time; function-level ones run later
    level: dict[str, set[str]] = {}
    for p in sorted(PKG.rglob("*.py")):
        name = _module_name(p)
        tree = ast.parse(p.read_text())
        found: set[str] = set()
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("aiayn"):
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in graph)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("aiayn"))
        level[name] = {m for m in found if m in graph and m != name}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(level.get(node, ())):
            if nxt.startswith(node + "."):  # a package importing its own submodule is not a cycle
                continue
            if state.get(nxt) == 1 and not node.startswith(nxt + "."):
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for module in sorted(level):
        if module not in state:
            cycle = visit(module)
            assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize("planted", ["from aiayn.accel.cpu import native\n", "import aiayn.accel.cpu.packed\n",
                                     "def f():\n    from aiayn.accel import accelerate\n"])
def test_the_rule_catches_a_planted_import(planted: str) -> None:
    """The checker itself: a core module importing the accelerator, even lazily, is an offender."""
    imported = _imports_of(planted, "aiayn.nn.attention")
    assert any(_is_accel(t) for t in imported)
    assert _imports_of("from . import masks\nfrom .cache import DecoderCache\n", "aiayn.nn.attention") >= {
        "aiayn.nn.masks", "aiayn.nn.cache"}
