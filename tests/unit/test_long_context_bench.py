"""Smoke test of ``bench/long_context.py`` at toy sizes: every measurement of every method runs, stops at its caps,
and the JSON and the plot are written, so the long-context benchmark cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
pytest.importorskip("matplotlib")
import long_context  # noqa: E402


@pytest.fixture(autouse=True)
def eager_flex(monkeypatch: pytest.MonkeyPatch) -> None:
    from aiayn.nn import flex

    monkeypatch.setattr(flex.SETTINGS, "compile", False)


def test_every_method_is_measured_in_every_mode_it_supports(tmp_path: Path) -> None:
    payload = long_context.run("tiny", threads=1, compiled=False, isolated=False)
    size = long_context.SIZES["tiny"]
    measured = {(r["mode"], r["method"]) for r in payload["rows"]}
    for mode in long_context.MODES:
        for method in long_context.METHODS:
            assert ((mode, method) in measured) != ((method, mode) in long_context.SKIPPED), (mode, method)
    for row in payload["rows"]:
        assert size["start"] <= row["length"] <= size["max_len"] and row["ms"] > 0 and row["peak_mib"] >= 0
    decode = {r["method"]: r for r in payload["rows"] if r["mode"] == "decode" and r["length"] == 256}
    assert decode["linear"]["state_mib"] < decode["sdpa"]["state_mib"]  # a constant state against a KV cache
    assert {(s["mode"], s["method"]) for s in payload["stops"]} >= {("train", "flex"), ("decode", "flex")}
    payload["machine"] = {"threads": 1, "cpu_model": "test"}
    long_context.plot(payload, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 10_000


def test_a_method_stops_where_it_would_pass_a_cap() -> None:
    size = {**long_context.SIZES["tiny"], "max_mib": 0.0}  # any growth passes the memory cap
    rows = list(long_context.sweep("train", "reference", size,
                                   lambda n: long_context.measure("train", "reference", n, size, compiled=False)))
    assert rows[-1]["why"] in ("passed a cap", "predicted past a cap") and len(rows) <= 4


def test_an_isolated_child_measures_one_length() -> None:
    """The fresh process that the full run starts for each (mode, method, length)."""
    out = subprocess.run([sys.executable, str(BENCH / "long_context.py"), "--child", "decode", "linear", "128",
                          "--size", "tiny", "--threads", "1"], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(BENCH), "PATH": "/usr/bin:/bin"})
    row = json.loads(out.stdout.splitlines()[-1])
    assert (row["mode"], row["method"], row["length"]) == ("decode", "linear", 128) and row["ms"] > 0
