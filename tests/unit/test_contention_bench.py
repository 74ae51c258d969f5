"""Smoke tests of bench/contention.py: its summary's ratios, its competitors, and one short child run."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import contention  # noqa: E402


def run(rate: float, threads: int = 1) -> dict:
    return {"units_per_s": rate, "threads": threads, "others_busy": 0.0}


def test_summary_divides_each_condition_by_the_same_systems_idle_rate():
    got = {("idle", "aiayn", "train"): [run(10.0, 2), run(12.0, 2)], ("busy", "aiayn", "train"): [run(6.0)],
           ("idle", "transformers", "train"): [run(8.0, 2)], ("busy", "transformers", "train"): [run(2.0, 2)]}
    rows = contention.summarize(got, contention.SYSTEMS, ("train",), ("idle", "busy"))["rows"]
    by = {(r["condition"], r["system"]): r for r in rows}
    assert by[("idle", "aiayn")]["ratio_vs_idle"] == 1.0
    assert by[("busy", "aiayn")]["ratio_vs_idle"] == pytest.approx(6.0 / 11.0)
    assert by[("busy", "transformers")]["ratio_vs_idle"] == pytest.approx(0.25)
    assert by[("idle", "aiayn")]["threads"] == "2" and by[("busy", "aiayn")]["threads"] == "1"


def test_a_run_disturbed_from_outside_is_left_out_of_the_medians():
    disturbed = {"units_per_s": 1.0, "threads": 2, "others_busy": 0.98}  # an idle run beside a stranger's job
    got = {("idle", "aiayn", "decode"): [run(500.0, 2), disturbed], ("busy", "aiayn", "decode"): [run(400.0)]}
    rows = contention.summarize(got, ("aiayn",), ("decode",), ("idle", "busy"))["rows"]
    by = {r["condition"]: r for r in rows}
    assert by["idle"]["rate"] == 500.0 and by["idle"]["runs_used"] == "1/2"
    assert by["busy"]["ratio_vs_idle"] == pytest.approx(0.8)


def test_the_busy_competitor_burns_a_core_and_stops():
    from aiayn import threads

    assert contention.start_competitor("idle", Path("unused")) is None
    proc = contention.start_competitor("busy", Path("unused"))
    try:
        start = threads.sample()
        time.sleep(0.5)
        busy = threads.others_busy(start, threads.sample())
    finally:
        contention.stop(proc)
    assert proc.returncode is not None
    if busy is not None:  # where /proc/stat exists
        assert busy > 0.5


@pytest.mark.slow
def test_one_short_child_run_of_each_system(tmp_path):
    pytest.importorskip("transformers")
    corpus = tmp_path / "corpus.json"
    contention.write_corpus(corpus, n_train=300)
    for system in contention.SYSTEMS:
        for workload in contention.WORKLOADS:
            res = contention.child(system, workload, corpus, warmup=0.0, seconds=0.2)
            assert res["units_per_s"] > 0 and res["threads"] >= 1, (system, workload)
