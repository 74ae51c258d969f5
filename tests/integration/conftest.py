"""Fixtures shared by the integration tests."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from aiayn.data.synthetic import generate_corpus


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("corpus")
    c = generate_corpus(300, 20, 20, seed=3)
    (d / "train.src").write_text("\n".join(s for s, _ in c["train"]) + "\n", encoding="utf-8")
    with gzip.open(d / "train.tgt.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(t for _, t in c["train"]) + "\n")
    (d / "valid.src").write_text("\n".join(s for s, _ in c["valid"]) + "\n", encoding="utf-8")
    (d / "valid.tgt").write_text("\n".join(t for _, t in c["valid"]) + "\n", encoding="utf-8")
    return d
