"""The layering rule, checked on the source: the reference core never imports an accelerator, and the packages form a
ladder with no cycles. Imports are read with ``ast`` (module level, inside functions and under ``TYPE_CHECKING``
alike), so a lazy import counts too."""

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

#: the packages from the bottom rung up (a package is ``aiayn.X``; a top-level module such as ``aiayn.errors``
#: is a node of its own, and ``aiayn`` is the package's lazy facade). A package imports only packages on lower
#: rungs, anywhere in its files. ``aiayn.accel`` stands beside the core: it may import the core, and the core reaches
#: it only through the entry point ``aiayn.accel`` at :data:`CALL_SITES` (checked by the accelerator tests below).
LADDER: tuple[tuple[str, ...], ...] = (
    # the standard library (and torch) only
    ("aiayn.errors", "aiayn.files", "aiayn.threads", "aiayn.validation", "aiayn.program", "aiayn.devices"),
    ("aiayn.config", "aiayn.output_folder", "aiayn.local_server"),
    ("aiayn.checkpoint",),  # the checkpoint folder: layout, atomic save, verified and pinned load, RNG state
    ("aiayn.nn",),
    ("aiayn.models",),
    ("aiayn.accel",),  # kernels for the core's seams: it imports nn and models only
    ("aiayn",),  # the facade: ModelConfig, build_model, ...
    ("aiayn.tokenize",),
    ("aiayn.data", "aiayn.viz"),
    ("aiayn.generate",),
    ("aiayn.train",),
    ("aiayn.pretrained",),
    ("aiayn.evaluate",),
    ("aiayn.tasks",),
    ("aiayn.hf", "aiayn.inspect", "aiayn.serve"),
    ("aiayn.demos", "aiayn.learn"),  # the offline demos; the course (checks against the reference, assembly)
    ("aiayn.check",),
    ("aiayn.cli",),
    ("aiayn.__main__",),  # python -m aiayn
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every aiayn module ``path`` imports, anywhere in the file (``from a import b`` counts a.b where it exists)."""
    return _imports_of(path.read_text(), _module_name(path), path.name == "__init__.py")


def _is_module(name: str) -> bool:
    where = SRC / Path(*name.split("."))
    return where.with_suffix(".py").exists() or (where / "__init__.py").exists()


def _imports_of(source: str, module: str, is_package: bool = False) -> set[str]:
    """:func:`_imports` of ``source``, the text of ``module``. ``from a import b`` counts ``a.b`` where that is a
    module, and ``a`` itself where some imported name is not a module (``from aiayn import accel`` is the accelerator's
    entry point, not the ``aiayn`` facade)."""
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
            submodules = {f"{base}.{a.name}" for a in node.names if _is_module(f"{base}.{a.name}")}
            found.update(submodules)
            if len(submodules) < len(node.names):
                found.add(base)
    return {m for m in found if m == "aiayn" or m.startswith("aiayn.")}


def _all_modules() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p) for p in sorted(PKG.rglob("*.py"))}


def _is_accel(name: str) -> bool:
    return name == "aiayn.accel" or name.startswith("aiayn.accel.")


def _node(module: str) -> str:
    """The ladder's node of a module: ``aiayn.X`` (a package or a top-level module), or ``aiayn``."""
    return ".".join(module.split(".")[:2])


def _package_graph(modules: dict[str, set[str]]) -> dict[str, dict[str, list[str]]]:
    """node -> the nodes it imports -> the imports that make each edge ("aiayn.a.b imports aiayn.c.d"), without a
    call site's import of the accelerator's entry point."""
    graph: dict[str, dict[str, list[str]]] = {}
    for module, imported in modules.items():
        source = _node(module)
        edges = graph.setdefault(source, {})
        for target in sorted(imported):
            node = _node(target)
            if node == source or (target == "aiayn.accel" and module in CALL_SITES):
                continue
            edges.setdefault(node, []).append(f"{module} imports {target}")
    return graph


def _find_cycle(graph: dict[str, dict[str, list[str]]]) -> list[str] | None:
    """A cycle of ``graph`` as its nodes, the first one repeated at the end; None when there is none."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def _describe(cycle: list[str], graph: dict[str, dict[str, list[str]]]) -> str:
    lines = [" -> ".join(cycle)]
    for a, b in zip(cycle, cycle[1:]):
        lines += [f"  {a} -> {b}:"] + [f"    {why}" for why in graph[a][b]]
    return "\n".join(lines)


def _rungs() -> dict[str, int]:
    return {node: i for i, rung in enumerate(LADDER) for node in rung}


def _upward(graph: dict[str, dict[str, list[str]]]) -> list[str]:
    """Every import of a node on the same or a higher rung, and every node the ladder does not place."""
    rung = _rungs()
    offenders = [f"{node}: not on the ladder; add it to LADDER" for node in sorted(graph) if node not in rung]
    for node, edges in sorted(graph.items()):
        for target, why in sorted(edges.items()):
            if target not in rung:
                offenders.append(f"{target}: not on the ladder; add it to LADDER")
            elif node in rung and rung[target] >= rung[node]:
                offenders += [f"{w} (rung {rung[target]} from rung {rung[node]})" for w in why]
    return sorted(set(offenders))


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


def test_no_import_cycles_between_packages() -> None:
    """The package graph, every import counted wherever it is made, has no cycle."""
    graph = _package_graph(_all_modules())
    cycle = _find_cycle(graph)
    assert cycle is None, "package import cycle: " + _describe(cycle, graph)


def test_packages_import_only_lower_rungs_of_the_ladder() -> None:
    offenders = _upward(_package_graph(_all_modules()))
    assert not offenders, "imports that go up the ladder (move the code down to its users):\n  " + "\n  ".join(
        offenders)


@pytest.mark.parametrize(("module", "planted", "target"), [
    ("aiayn.nn.attention", "def f():\n    from aiayn.tasks.lm import LMTask\n", "aiayn.tasks"),
    ("aiayn.models.heads", "class A:\n    def f(self):\n        from ..train import losses\n", "aiayn.train"),
    ("aiayn.tokenize.base", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import aiayn.pretrained\n",
     "aiayn.pretrained"),
])
def test_the_checker_catches_a_planted_back_edge(module: str, planted: str, target: str) -> None:
    """A low package importing a higher one, even inside a function, closes a cycle and goes up the ladder."""
    modules = _all_modules()
    modules[module] = modules[module] | _imports_of(planted, module)
    graph = _package_graph(modules)
    cycle = _find_cycle(graph)
    assert cycle is not None and _node(module) in cycle and target in cycle, cycle
    assert f"{module} imports" in _describe(cycle, graph)
    assert any(o.startswith(f"{module} imports {target}") for o in _upward(graph))


@pytest.mark.parametrize("planted", ["from aiayn.accel.cpu import native\n", "import aiayn.accel.cpu.packed\n",
                                     "def f():\n    from aiayn.accel import accelerate\n"])
def test_the_rule_catches_a_planted_import(planted: str) -> None:
    """The checker itself: a core module importing the accelerator, even lazily, is an offender."""
    imported = _imports_of(planted, "aiayn.nn.attention")
    assert any(_is_accel(t) for t in imported)
    assert _imports_of("from . import masks\nfrom .cache import DecoderCache\n", "aiayn.nn.attention") >= {
        "aiayn.nn.masks", "aiayn.nn.cache"}


#: loading a model and converting one: none of them reaches the trainer, not even through another package
NO_TRAINER = ("aiayn.pretrained", "aiayn.hf", "aiayn.generate", "aiayn.evaluate", "aiayn.inspect", "aiayn.tokenize",
              "aiayn.checkpoint")


def _reachable(graph: dict[str, dict[str, list[str]]], start: str) -> dict[str, str]:
    """Every node ``start`` imports, directly or through others -> one import that leads there."""
    seen: dict[str, str] = {}
    todo = [start]
    while todo:
        node = todo.pop()
        for target, why in graph.get(node, {}).items():
            if target not in seen:
                seen[target] = why[0]
                todo.append(target)
    return seen


@pytest.mark.parametrize("node", NO_TRAINER)
def test_loading_and_conversion_do_not_reach_into_the_trainer(node: str) -> None:
    reached = _reachable(_package_graph(_all_modules()), node)
    assert "aiayn.train" not in reached, f"{node} reaches aiayn.train ({reached.get('aiayn.train')})"
