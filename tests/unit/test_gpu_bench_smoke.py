"""Smoke test of ``bench/gpu.py`` at its ``--tiny`` setting on this machine's device (the CPU without a GPU): every
case runs, the contenders share weights (greedy decoding gives the same tokens) and the JSON is written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

pytest.importorskip("transformers")
import gpu  # noqa: E402


def test_the_gpu_bench_runs_tiny_and_writes_its_results(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    result = gpu.main(["--tiny", "--no-compile", "--out", str(tmp_path)])
    rows = {(r["case"], r["contender"]): r for r in result["rows"]}
    assert set(rows) == {("train", "aiayn"), ("train", "transformers"), ("greedy", "aiayn"),
                         ("greedy", "transformers"), ("beam4", "aiayn"), ("beam4", "transformers")}
    assert all(r["tokens_per_s"] > 0 for k, r in rows.items() if k[0] in ("train", "greedy"))
    assert all(r["sentences_per_s"] > 0 for k, r in rows.items() if k[0] == "beam4")
    assert rows[("greedy", "aiayn")]["same_tokens"] is True
    saved = json.loads((tmp_path / "gpu.json").read_text())
    assert saved["tiny"] is True and saved["dtype"] == "float32" and len(saved["rows"]) == 6
    assert "tokens_per_s" in capsys.readouterr().out


def test_mfu_uses_the_named_gpus_dense_bf16_peak() -> None:
    assert gpu.peak_tflops(torch.device("cpu")) is None
    assert gpu.peak_tflops(torch.device("cpu"), 100.0) == 100.0
    assert gpu.PEAK_BF16_TFLOPS["H100 SXM"] == gpu.PEAK_BF16_TFLOPS["H200"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_gpu_bench_runs_tiny_on_cuda(tmp_path: Path) -> None:
    result = gpu.main(["--tiny", "--device", "cuda", "--no-compile", "--out", str(tmp_path)])
    assert all(r["peak_memory_mb"] > 0 for r in result["rows"])
