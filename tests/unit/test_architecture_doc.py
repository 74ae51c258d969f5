"""docs/architecture.md's layout names the tree as it is: every module of src/aiayn and of each of its packages is
named (``name.py``) in its package's entry, every file and folder an entry names exists, and every folder of tests/
is listed. A module added, moved or deleted without the layout changing fails here, naming it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
SRC = ROOT / "src" / "aiayn"
ENTRY = re.compile(r"^(?P<indent> {2,4})(?P<name>[a-z0-9_]+(?:\.py|/))(?: |$)")


def layout_entries(text: str | None = None) -> tuple[dict[str, str], list[str]]:
    """The layout block's entries in ``text`` (default: docs/architecture.md), package path (``""`` for top-level
    modules, ``"nn/"``, ``"accel/cpu/"``) -> their text, and the folder names on its ``tests/`` line."""
    text = DOC.read_text(encoding="utf-8") if text is None else text
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    entries: dict[str, str] = {}
    tests: list[str] = []
    parents: list[str] = []
    current = None
    for line in block.splitlines():
        if line.startswith("tests/"):
            tests = re.findall(r"([a-z_]+)/", line.split("bench/")[0])[1:]
            current = None
            continue
        m = ENTRY.match(line)
        if m:
            depth = (len(m["indent"]) - 2) // 2
            parents = parents[:depth]
            name = m["name"]
            prefix = "".join(parents)
            if name.endswith("/"):
                parents.append(name)
                current = prefix + name
                entries[current] = line[m.end():]
            else:
                current = prefix
                entries[current] = entries.get(current, "") + " " + line
        elif current is not None:
            entries[current] += " " + line.strip()
    return entries, tests


def _modules(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if p.suffix == ".py" and p.name != "__init__.py"}


def _subpackages(folder: Path) -> set[str]:
    return {p.name + "/" for p in folder.iterdir() if (p / "__init__.py").exists()}


def test_every_module_of_every_package_is_named_in_the_layout() -> None:
    entries, _ = layout_entries()
    missing = []
    for package, text in entries.items():
        folder = SRC / package
        names = set(re.findall(r"\b([a-z0-9_]+\.py)\b", text)) | set(re.findall(r"\b([a-z0-9_]+/)", text))
        if package and package.count("/") > 2:
            continue
        for module in sorted(_modules(folder)):
            if module not in names:
                missing.append(f"src/aiayn/{package}{module}")
    for package in sorted(_subpackages(SRC)):
        if package not in entries:
            missing.append(f"src/aiayn/{package} (no entry)")
    for package in list(entries):
        for sub in sorted(_subpackages(SRC / package)) if package else []:
            if sub not in entries[package] and package + sub not in entries:
                missing.append(f"src/aiayn/{package}{sub}")
    assert not missing, f"docs/architecture.md's layout does not name: {', '.join(missing)}"


def test_every_name_in_the_layout_exists() -> None:
    entries, _ = layout_entries()
    absent = []
    for package, text in entries.items():
        folder = SRC / package
        if not folder.is_dir():
            absent.append(f"src/aiayn/{package}")
            continue
        for name in sorted(set(re.findall(r"(?<![\w./`])([a-z0-9_]+\.py)\b", text))):
            if not (folder / name).exists():
                absent.append(f"src/aiayn/{package}{name}")
    assert not absent, f"docs/architecture.md's layout names what is not there: {', '.join(absent)}"


def test_the_layout_lists_every_test_folder() -> None:
    _, listed = layout_entries()
    folders = sorted(p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and p.name != "__pycache__")
    assert listed == folders or sorted(listed) == folders, (listed, folders)


def test_the_layout_reader_finds_entries_at_every_depth() -> None:
    entries, tests = layout_entries("## Layout\n\n```\nsrc/aiayn/\n  errors.py   x\n  nn/         attention.py (one),\n"
                                    "              cache.py\n    deep/     a.py\ntests/  unit/ parity/   bench/\n```\n")
    assert set(entries) == {"", "nn/", "nn/deep/"}
    assert "attention.py" in entries["nn/"] and "cache.py" in entries["nn/"] and "errors.py" in entries[""]
    assert tests == ["unit", "parity"]
