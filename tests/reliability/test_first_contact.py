"""What a new user meets in a first run: a progress line as soon as the first step is done, a training loss that
says it is label-smoothed, a resumed run's summary that tells this process's steps and time from the whole run's,
and a Python program calling the trainer that gets the command's thread choice (not torch's default, which on a
busy machine ran about 13x slower) and its own thread count back afterwards."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from test_training_runs import _run, _said

from aiayn import threads
from aiayn.tasks.registry import run_recipe


def test_a_log_gets_a_line_after_the_first_step(recipe_file: Path, capsys: pytest.CaptureFixture) -> None:
    _run(recipe_file, "train.progress=true", "train.log_every=50", "train.max_steps=8")
    said = _said(capsys)
    assert "step 1/8 (to step 8)" in said  # not 50 steps of silence


def test_the_training_loss_says_it_is_label_smoothed(recipe_file: Path, capsys: pytest.CaptureFixture) -> None:
    _run(recipe_file, "train.progress=true", "train.label_smoothing=0.1")
    said = _said(capsys)
    assert "loss (label smoothing 0.1) " in said and ", nll " in said
    _run(recipe_file, "train.progress=true", "train.label_smoothing=0.0", f"train.out_dir={recipe_file.parent / 'b'}")
    assert "label smoothing" not in _said(capsys)


def test_a_resumed_runs_summary_says_this_process_and_the_whole_run(recipe_file: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    run_recipe(recipe_file, ["train.max_steps=4"])
    said = capsys.readouterr().out
    assert "trained 4 steps in " in said and " min with start-up and the last validation and save)" in said
    run_recipe(recipe_file, ["train.max_steps=8"], resume=True)
    said = capsys.readouterr().out
    assert "trained steps 5-8 in " in said and "8 steps and " in said and " min of training in the whole run" in said


def test_a_program_calling_the_trainer_gets_the_commands_thread_choice(recipe_file: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    if cores < 2:
        pytest.skip("needs 2 CPUs")
    # a Python program: nothing chose at start-up (earlier tests ran `aiayn --threads 1`, which sets both), and torch
    # has its default (this suite's conftest set 1)
    monkeypatch.setattr(threads, "_explicit", None)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "_adaptive", False)
    monkeypatch.setattr(threads, "_torch_default", cores)
    before = cores
    torch.set_num_threads(before)
    seen = []

    def record(call: int, loss: torch.Tensor) -> torch.Tensor:
        seen.append(torch.get_num_threads())
        return loss

    try:
        _run(recipe_file, "train.threads=none", patch_loss=record)
    finally:
        torch.set_num_threads(before)
    # a step this small runs on one thread (threads.SMALL_STEP_FLOPS) from the first re-check, after step 1
    assert seen[0] == before and set(seen[1:]) == {1}
    assert torch.get_num_threads() == before  # the program's count back
