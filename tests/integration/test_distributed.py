"""Data-parallel training (``aiayn train --nproc 2``, gloo on CPU) against the single-process trainer:
2 ranks == 1 process accumulating 2 micro-batches, resume on 2 ranks == uninterrupted, and the errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_translation import _recipe

from aiayn.cli.main import main
from aiayn.pretrained import load_pretrained
from aiayn.tasks.registry import run_recipe
from aiayn.train.metrics_log import read_metrics

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch built without distributed")

# gloo on the CPU even where a GPU is present (a one-GPU machine cannot host two CUDA ranks)
QUIET = ["train.eval_every=100", "train.save_every=4", "train.average_last=0", "train.device=cpu"]


def _losses(run: Path) -> list[float]:
    return [r["train_loss"] for r in read_metrics(run / "metrics.jsonl") if "train_loss" in r]


def _weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return load_pretrained(checkpoint).model.state_dict()


def test_two_ranks_make_the_updates_of_one_process_accumulating_two(tmp_path: Path, corpus_dir: Path) -> None:
    # without dropout the only difference is the order of floating-point sums in the gradient
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    run_recipe(_recipe(one, corpus_dir), [*QUIET, "model.dropout=0.0", "train.accum=2"])
    assert main(["train", str(_recipe(two, corpus_dir)), *QUIET, "model.dropout=0.0", "--nproc", "2"]) == 0
    a, b = _losses(one / "run"), _losses(two / "run")
    assert len(a) == len(b) == 12
    assert b == pytest.approx(a, rel=1e-5, abs=1e-6)
    wa, wb = _weights(one / "run" / "last"), _weights(two / "run" / "last")
    assert all(torch.allclose(wa[k], wb[k], atol=1e-5) for k in wa)
    # and it is not the same as one process without accumulation (the test can tell the runs apart)
    solo = tmp_path / "solo"
    solo.mkdir()
    run_recipe(_recipe(solo, corpus_dir), [*QUIET, "model.dropout=0.0"])
    ws = _weights(solo / "run" / "last")
    assert max(float((wa[k] - ws[k]).abs().max()) for k in wa) > 1e-3


def test_resume_on_two_ranks_matches_uninterrupted(tmp_path: Path, corpus_dir: Path,
                                                   capfd: pytest.CaptureFixture) -> None:
    # with dropout: each rank's RNG state must come back from the checkpoint
    full, part = tmp_path / "full", tmp_path / "part"
    full.mkdir(), part.mkdir()
    assert main(["train", str(_recipe(full, corpus_dir)), *QUIET, "--nproc", "2"]) == 0
    recipe = _recipe(part, corpus_dir)
    assert main(["train", str(recipe), *QUIET, "train.max_steps=8", "--nproc", "2"]) == 0
    assert main(["train", str(recipe), *QUIET, "--resume"]) == 2  # another number of processes is refused
    assert "resume it with --nproc 2" in capfd.readouterr().err
    assert main(["train", str(recipe), *QUIET, "--resume", "--nproc", "2"]) == 0
    a, b = _losses(full / "run"), _losses(part / "run")
    assert len(a) == len(b) == 12
    assert a == pytest.approx(b, abs=1e-6)
    wa, wb = _weights(full / "run" / "last"), _weights(part / "run" / "last")
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)


def test_an_error_in_the_ranks_is_one_clear_message(tmp_path: Path, corpus_dir: Path,
                                                    capfd: pytest.CaptureFixture) -> None:
    assert main(["train", str(_recipe(tmp_path, corpus_dir)), "model.d_modle=64", "--nproc", "2"]) == 2
    err = capfd.readouterr().err
    assert "d_modle" in err and "Traceback" not in err
    assert "of 2 stopped with exit code 2" in err
