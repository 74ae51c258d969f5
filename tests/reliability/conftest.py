"""The training runs' shared fixture: a tiny character-LM recipe over a generated text (test_training_runs.py's)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_training_runs import RECIPE, WORDS


@pytest.fixture
def recipe_file(tmp_path: Path) -> Path:
    lines = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(6 + i % 5)) for i in range(200)]
    (tmp_path / "text.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    path = tmp_path / "lm.toml"
    path.write_text(RECIPE.format(path=tmp_path / "text.txt", out=tmp_path / "run"), encoding="utf-8")
    return path
