"""Metrics log (JSONL and CSV) and the learning-curve plot."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from aiayn.errors import AiaynError
from aiayn.train.metrics_log import MetricsLogger, drop_rows_after, read_metrics
from aiayn.viz.curves import plot_learning_curves


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_round_trip_flush_and_resume(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / "run" / f"metrics{suffix}"
    log = MetricsLogger(path)
    log.log({"step": 1, "train_loss": torch.tensor(2.5)}, lr=np.float64(1e-4))
    # Flushed at once: readable while the logger is still open.
    assert read_metrics(path) == [{"step": 1, "train_loss": 2.5, "lr": 1e-4}]
    log.log(step=2, train_loss=2.25, lr=2e-4)
    log.close()
    with MetricsLogger(path) as resumed:  # a resumed run appends
        resumed.log(step=3, train_loss=2.0, lr=3e-4, note="resumed")
    records = read_metrics(path)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert records[2] == {"step": 3, "train_loss": 2.0, "lr": 3e-4, "note": "resumed"}


def test_csv_new_keys_widen_the_header(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    with MetricsLogger(path) as log:
        log.log(step=1, train_loss=3.0)
        log.log(step=2, val_loss=2.5, bleu=10.0)
        log.log(step=3, train_loss=2.0)
    assert path.read_text().splitlines()[0] == "step,train_loss,val_loss,bleu"
    assert read_metrics(path) == [
        {"step": 1, "train_loss": 3.0},
        {"step": 2, "val_loss": 2.5, "bleu": 10.0},
        {"step": 3, "train_loss": 2.0},
    ]
    with MetricsLogger(path) as log:  # the widened header is picked up on resume
        log.log(step=4, bleu=11.5)
    assert read_metrics(path)[-1] == {"step": 4, "bleu": 11.5}


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_line_cut_by_crash_is_skipped_then_dropped_on_resume(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"m{suffix}"
    with MetricsLogger(path) as log:
        log.log(step=1, train_loss=1.5)
    with path.open("a") as f:
        f.write('{"step": 2, "train_lo' if suffix == ".jsonl" else "2,1.2")
    assert read_metrics(path) == [{"step": 1, "train_loss": 1.5}]
    with MetricsLogger(path) as log:
        log.log(step=3, train_loss=1.0)
    assert read_metrics(path) == [{"step": 1, "train_loss": 1.5}, {"step": 3, "train_loss": 1.0}]


def test_errors_name_file_and_line(tmp_path: Path) -> None:
    with pytest.raises(AiaynError, match=r"\.jsonl or \.csv"):
        MetricsLogger(tmp_path / "m.txt")
    with pytest.raises(AiaynError, match="not found"):
        read_metrics(tmp_path / "absent.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(AiaynError, match=r"bad\.jsonl:2"):
        read_metrics(bad)


def test_plot_writes_png_from_sparse_records(tmp_path: Path) -> None:
    records = [{"step": s, "train_loss": 5.0 / s} for s in range(1, 40)]
    records += [{"step": s, "val_loss": 6.0 / s} for s in (10, 20, 30)]
    out = plot_learning_curves(records, tmp_path / "plots" / "curves.png", title="run", logy=True)
    data = out.read_bytes()
    assert len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(AiaynError, match="available keys"):
        plot_learning_curves(records, tmp_path / "x.png", ys=("bleu",))


def test_plot_without_matplotlib_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(sys.modules):
        if name == "matplotlib" or name.startswith("matplotlib."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib...` fail
    with pytest.raises(AiaynError, match=r"pip install aiayn\[plot\]"):
        plot_learning_curves([{"step": 1, "train_loss": 1.0}], tmp_path / "c.png")


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_drop_rows_after_keeps_earlier_steps_and_rows_without_a_step(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"m{suffix}"
    with MetricsLogger(path) as log:
        for step in (1, 2, 3, 4):
            log.log({"step": step, "train_loss": float(step)})
        log.log({"note": "kept"})
    assert drop_rows_after(path, 2) == 2
    assert read_metrics(path) == [{"step": 1, "train_loss": 1.0}, {"step": 2, "train_loss": 2.0}, {"note": "kept"}]
    assert drop_rows_after(path, 2) == 0 and drop_rows_after(tmp_path / f"absent{suffix}", 0) == 0
