"""The project describes its present: no development-history narration, no benchmark figures in docstrings.

Docs, recipes, benchmark scripts and source say what the code does now; dated measurements live in
docs/performance.md and docs/results.md, and the past in git. These checks fail listing ``file:line`` for every hit.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: What the history check reads: these folders (recursively) and files, text files only.
HISTORY_AREAS = ("src", "docs", "recipes", "bench", "README.md")
TEXT_SUFFIXES = {".py", ".md", ".toml", ".sh", ".c", ".h", ".txt", ".cfg", ".ini", ".yaml", ".yml", ".json", ".rst"}
SKIP_DIRS = {"__pycache__", ".pytest_cache", "quick"}

_UNITS = "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth"
_TEENS = "tenth|eleventh|twelfth|thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth"
_TENS = "twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety"
_TENTHS = "twentieth|thirtieth|fortieth|fiftieth|sixtieth|seventieth|eightieth|ninetieth"
_ORDINAL = rf"(?:(?:{_TENS})-(?:{_UNITS})|{_TENTHS}|{_TEENS}|{_UNITS}|\d+(?:st|nd|rd|th))"

#: (name, pattern) of each history marker.
HISTORY_MARKERS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("ordinal session", re.compile(rf"\b{_ORDINAL}[\s-]+sessions?\b", re.IGNORECASE)),
    ("session", re.compile(r"\bsessions?\b", re.IGNORECASE)),
    ("sNN- prefix", re.compile(r"\bs\d{2}-")),
    ("issue number", re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE)),
)

#: The only uses of the word that are not history: pytest's fixture scope and ``requests.Session``-like classes
#: reached through a module (``requests.Session``, ``aiohttp.ClientSession``). Removed from a line before the check.
ALLOWED = (
    re.compile(r"""\bscope\s*=\s*["']session["']"""),
    re.compile(r"\b[A-Za-z_]\w*\.(?:[A-Z]\w*)?Session\b"),
)

#: What a docstring under src/ must not hold: measurements belong in docs/performance.md.
DOCSTRING_FIGURES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("'Nx faster' claim", re.compile(r"\b\d+(?:\.\d+)?\s*x\s+(?:faster|slower|as fast)\b", re.IGNORECASE)),
    ("speed-up ratio", re.compile(r"\b\d+\.\d+x\b")),
    ("benchmark log reference", re.compile(r"docs/(?:BENCHMARKS|RESULTS)\.md")),
)


def _markdown_table_row(line: str) -> bool:
    """A line starting with ``|`` and holding at least two more ``|``."""
    stripped = line.strip()
    return stripped.startswith("|") and stripped.count("|") >= 3


def text_files(root: Path, areas: tuple[str, ...]) -> Iterator[Path]:
    """Every text file under ``areas`` (folders or files relative to ``root``), sorted."""
    for area in areas:
        path = root / area
        if path.is_file():
            yield path
        elif path.is_dir():
            for f in sorted(path.rglob("*")):
                rel = f.relative_to(root).parts
                if f.is_file() and f.suffix in TEXT_SUFFIXES and not SKIP_DIRS.intersection(rel) \
                        and not any(p.startswith(".") or p.endswith(".egg-info") for p in rel):
                    yield f


def history_hits(root: Path, areas: tuple[str, ...]) -> list[str]:
    """``file:line: marker: text`` for every history marker in the text files of ``areas``."""
    hits = []
    for f in text_files(root, areas):
        text = f.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            checked = line
            for allowed in ALLOWED:
                checked = allowed.sub("", checked)
            for name, pattern in HISTORY_MARKERS:
                if pattern.search(checked):
                    hits.append(f"{f.relative_to(root)}:{number}: {name}: {line.strip()[:120]}")
                    break
    return hits


def _docstring_nodes(tree: ast.AST) -> Iterator[ast.Constant]:
    """The string constant of every module, class and function docstring in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                yield first.value


def docstring_hits(root: Path, folder: str = "src") -> list[str]:
    """``file:line: what: text`` for every markdown table row or benchmark figure in a docstring under ``folder``."""
    hits = []
    for f in sorted((root / folder).rglob("*.py")):
        if "__pycache__" in f.parts:
            continue
        tree = ast.parse(f.read_text(encoding="utf-8"), filename=str(f))
        for doc in _docstring_nodes(tree):
            for offset, line in enumerate(doc.value.splitlines()):
                where = f"{f.relative_to(root)}:{doc.lineno + offset}"
                if _markdown_table_row(line):
                    hits.append(f"{where}: markdown table: {line.strip()[:120]}")
                    continue
                for name, pattern in DOCSTRING_FIGURES:
                    if pattern.search(line):
                        hits.append(f"{where}: {name}: {line.strip()[:120]}")
                        break
    return hits


@pytest.mark.parametrize("area", HISTORY_AREAS)
def test_no_development_history(area: str) -> None:
    hits = history_hits(ROOT, (area,))
    assert not hits, (f"{len(hits)} development-history marker(s) in {area} (say what is true now; use a date or a "
                      "commit where one matters):\n" + "\n".join(hits))


def test_docstrings_hold_no_benchmark_figures() -> None:
    hits = docstring_hits(ROOT)
    assert not hits, (f"{len(hits)} benchmark table(s) or figure(s) in docstrings under src/ (they belong in "
                      "docs/performance.md):\n" + "\n".join(hits))


# The checks themselves, on planted files.

def test_history_check_finds_planted_markers(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(
        "clean line\n"
        "measured in the forty-second session\n"
        "see bench/results/s38-fewer-ops.json\n"
        "Issue 5's targets\n"
        "as in the 21st session\n"
        "this session only\n"
        "@pytest.fixture(scope=\"session\")\n"
        "s = requests.Session()\n"
        "sessions of tmux\n", encoding="utf-8")
    hits = history_hits(tmp_path, ("docs",))
    assert [h.split(":")[1] for h in hits] == ["2", "3", "4", "5", "6", "9"]
    assert "ordinal session" in hits[0] and "sNN- prefix" in hits[1] and "issue number" in hits[2]


def test_history_check_passes_clean_text(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("fixture scope='session'; aiohttp.ClientSession; requests.Session()\n"
                                        "ids like s1-x, s123-y, as38-z; sessionid; pytest_sessionstart\n"
                                        "tissue 3; issues fixed\n", encoding="utf-8")
    assert history_hits(tmp_path, ("README.md",)) == []


def test_docstring_check_finds_planted_figures(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "m.py").write_text(
        '"""Module.\n\n| a | b |\n| --- | --- |\n"""\n\n'
        'def f() -> None:\n    """Fast: 1.36x the reference (docs/BENCHMARKS.md)."""\n\n\n'
        'class C:\n    """Runs 2x faster."""\n\n\n'
        'def g() -> None:\n    """Shape (B, T, D); a 3 x 4 grid; | not a table."""\n'
        '    x = "1.5x"  # not a docstring\n',
        encoding="utf-8")
    hits = docstring_hits(tmp_path)
    assert [h.split(": ")[0] for h in hits] == ["src/m.py:3", "src/m.py:4", "src/m.py:8", "src/m.py:12"]
    assert "markdown table" in hits[0] and "speed-up ratio" in hits[2] and "'Nx faster' claim" in hits[3]


def test_the_install_raises_no_setuptools_deprecation() -> None:
    """pyproject.toml as setuptools reads it during `pip install -e .`: no warning (a `license` table printed a
    deprecation banner three times inside a quiet install)."""
    import warnings

    config = pytest.importorskip("setuptools.config.pyprojecttoml")
    from setuptools.dist import Distribution

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = config.apply_configuration(Distribution(), str(ROOT / "pyproject.toml"))
    assert [str(w.message) for w in caught] == []
    assert dist.metadata.license_expression == "MIT"
