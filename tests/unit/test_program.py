"""The commands aiayn prints to be copied (``continue with: ...``) start as the user started aiayn."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from aiayn import program


@pytest.fixture(autouse=True)
def _no_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)


def test_a_path_as_typed_stays_a_path_and_a_name_on_path_stays_a_name(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "venv dir" / "bin"
    bin_dir.mkdir(parents=True)
    script = bin_dir / "aiayn"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(sys, "argv", [str(script), "train"])
    assert program.program() == f"'{script}'"  # quoted: the folder has a space
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin")
    assert program.program() == "aiayn"
    assert program.command("train", "r.toml", "a b=1", "--resume") == "aiayn train r.toml 'a b=1' --resume"


def test_the_module_a_program_and_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", [str(Path(program.__file__).parent / "__main__.py"), "train"])
    assert program.program().endswith(" -m aiayn")
    monkeypatch.setattr(sys, "argv", ["my_script.py"])
    assert program.program() == "aiayn"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    assert program.program() == "torchrun ... -m aiayn"
