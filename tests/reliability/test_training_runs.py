"""Training runs that go wrong: non-finite losses, damaged or edited training states, changed recipes on
resume, interrupts, time limits, resumed metrics logs. Each run is a tiny character LM (a few seconds)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from aiayn.errors import AiaynError
from aiayn.tasks.registry import build_task, train_config
from aiayn.train.checkpoint import STATE_FILE, load_training_state, read_state_dict
from aiayn.train.metrics_log import read_metrics
from aiayn.train.progress import TrainingProgress
from aiayn.train.recipe import load_recipe
from aiayn.train.trainer import train

RECIPE = """
task = "lm"
[data]
path = "{path}"
block_size = 16
batch_size = 4
eval_max_blocks = 4
[tokenizer]
kind = "char"
[model]
d_model = 16
n_heads = 2
n_layers = 1
d_ff = 32
dropout = 0.0
position = "learned"
[train]
out_dir = "{out}"
max_steps = 8
optimizer = "adamw"
lr = 3e-3
schedule = "constant_warmup"
warmup = 2
label_smoothing = 0.0
eval_every = 4
log_every = 1
progress = false
threads = 1
"""

WORDS = "the king and queen of a fair land walk to sea by night with their old dog".split()


@pytest.fixture
def recipe_file(tmp_path: Path) -> Path:
    lines = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(6 + i % 5)) for i in range(200)]
    (tmp_path / "text.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    path = tmp_path / "lm.toml"
    path.write_text(RECIPE.format(path=tmp_path / "text.txt", out=tmp_path / "run"), encoding="utf-8")
    return path


def _run(recipe_file: Path, *overrides: str, resume: bool = False, patch_loss=None):
    """Train the recipe (with ``overrides``); ``patch_loss(step_call, loss)`` may replace each micro-batch loss."""
    recipe = load_recipe(recipe_file, list(overrides))
    cfg = train_config(recipe)
    task = build_task(recipe, cfg, resume)
    if patch_loss is not None:
        original, calls = task.loss, [0]

        def loss(batch, smoothing):
            calls[0] += 1
            total, n, extra = original(batch, smoothing)
            return patch_loss(calls[0], total), n, extra

        task.loss = loss
    return train(task, cfg, resume=resume, recipe=recipe), Path(cfg.out_dir)


def _said(capsys: pytest.CaptureFixture) -> str:
    """Everything printed (messages go to stdout, the CLI's to stderr)."""
    captured = capsys.readouterr()
    return captured.out + captured.err


def _all_finite(directory: Path) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in read_state_dict(directory).values() if t.is_floating_point())


# ------------------------------------------------------------------------------------------ non-finite steps


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_loss_skips_the_update_and_is_logged(recipe_file: Path, bad: float,
                                                          capsys: pytest.CaptureFixture) -> None:
    result, out = _run(recipe_file, patch_loss=lambda call, loss: loss * bad if call in (3, 6) else loss)
    assert result.steps == 8  # two skipped draws, eight real updates
    rows = read_metrics(out / "metrics.jsonl")
    skips = [r for r in rows if "skipped_update" in r]
    assert [r["nonfinite_skipped"] for r in skips] == [1, 2]
    assert "update skipped" in _said(capsys)
    assert _all_finite(out / "last") and _all_finite(out / "best")
    assert load_training_state(out / "last")["nonfinite_skipped"] == 2


def test_non_finite_steps_in_a_row_end_the_run_naming_the_last_checkpoint(recipe_file: Path) -> None:
    with pytest.raises(AiaynError, match=r"diverged: 3 steps in a row up to step 5.*run/last \(step 4\)"):
        _run(recipe_file, "train.max_nonfinite_steps=3",
             patch_loss=lambda call, loss: loss * float("nan") if call >= 5 else loss)
    out = recipe_file.parent / "run"
    assert _all_finite(out / "last") and load_training_state(out / "last")["step"] == 4


def test_a_huge_learning_rate_never_writes_non_finite_weights(recipe_file: Path) -> None:
    try:
        _run(recipe_file, "train.lr=1e9", "train.clip_norm=None", "train.max_steps=12")
    except AiaynError as e:
        assert "diverged" in str(e)
    out = recipe_file.parent / "run"
    for ckpt in (out / "last", out / "best"):
        if ckpt.exists():
            assert _all_finite(ckpt)


def test_the_non_finite_count_survives_a_resume(recipe_file: Path) -> None:
    _run(recipe_file, "train.max_steps=4", patch_loss=lambda call, loss: loss * float("nan") if call == 2 else loss)
    _run(recipe_file, resume=True)
    assert load_training_state(recipe_file.parent / "run" / "last")["nonfinite_skipped"] == 1


# ------------------------------------------------------------------------------------------ damaged states


DAMAGE = {
    "format from a newer aiayn": (lambda s: s.update(format_version=99), "format_version=99 is newer"),
    "format version missing": (lambda s: s.pop("format_version"), "not an aiayn training state"),
    "step missing": (lambda s: s.pop("step"), "step=None"),
    "negative step": (lambda s: s.update(step=-3), "step=-3"),
    "position None": (lambda s: s.update(position=None), "position=None"),
    "position missing": (lambda s: s.pop("position"), "position=None"),
    "best garbled": (lambda s: s.update(best="good"), "best='good'"),
    "optimizer emptied": (lambda s: s["optimizer"].update(state={}), "optimizer state is empty"),
    "optimizer missing": (lambda s: s.pop("optimizer"), "optimizer must be a state dict"),
    "optimizer moment reshaped": (lambda s: s["optimizer"]["state"][0].update(exp_avg=torch.zeros(3)),
                                  "has shape \\(3,\\)"),
    "optimizer for another model": (lambda s: s["optimizer"]["param_groups"][0]["params"].pop(),
                                    "optimizer covers"),
    "scheduler missing": (lambda s: s.pop("scheduler"), "scheduler must be"),
    "rng missing": (lambda s: s.pop("rng"), "rng must hold"),
    "elapsed not a number": (lambda s: s.update(elapsed="long"), "elapsed='long'"),
}


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One finished 4-step run to copy and damage."""
    base = tmp_path_factory.mktemp("trained")
    lines = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(6 + i % 5)) for i in range(200)]
    (base / "text.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    path = base / "lm.toml"
    path.write_text(RECIPE.format(path=base / "text.txt", out=base / "run"), encoding="utf-8")
    _run(path, "train.max_steps=4")
    return base


def _copy_run(trained_run: Path, tmp_path: Path) -> Path:
    import shutil

    shutil.copytree(trained_run, tmp_path / "copy")
    recipe = tmp_path / "copy" / "lm.toml"
    recipe.write_text(RECIPE.format(path=tmp_path / "copy" / "text.txt", out=tmp_path / "copy" / "run"),
                      encoding="utf-8")
    return recipe


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_training_state_is_one_error_naming_the_file(trained_run: Path, tmp_path: Path,
                                                               damage: str) -> None:
    recipe = _copy_run(trained_run, tmp_path)
    file = tmp_path / "copy" / "run" / "last" / STATE_FILE
    state = torch.load(file, weights_only=True)
    edit, message = DAMAGE[damage]
    edit(state)
    torch.save(state, file)
    _forget_checksums(file.parent)
    with pytest.raises(AiaynError, match=message) as caught:
        _run(recipe, resume=True)
    assert str(file.parent) in str(caught.value)


def _forget_checksums(directory: Path) -> None:
    """Drop the checksum manifest, so the edit reaches the training-state checks (an edit under a manifest is
    refused earlier, as a checksum mismatch)."""
    for name in ("manifest.json",):
        (directory / name).unlink(missing_ok=True)


def test_resume_refuses_a_changed_architecture_listing_the_keys(trained_run: Path, tmp_path: Path) -> None:
    recipe = _copy_run(trained_run, tmp_path)
    with pytest.raises(AiaynError, match=r"(?s)different model.*model\.activation: 'relu' -> 'gelu'.*"
                                         r"\[model\] activation") as caught:
        _run(recipe, "model.activation=gelu", resume=True)
    assert "d_ff" not in str(caught.value)
    with pytest.raises(AiaynError, match=r"\[tokenizer\] vocab_size"):
        _run(recipe, "tokenizer.vocab_size=500", resume=True)


def test_resume_allows_and_reports_training_changes(trained_run: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    recipe = _copy_run(trained_run, tmp_path)
    result, _ = _run(recipe, "train.lr=0.001", "train.max_steps=6", resume=True)
    err = _said(capsys)
    assert result.steps == 6
    assert "resuming from step 4" in err
    assert "changed: train.lr: 0.003 -> 0.001" in err and "train.max_steps: 4 -> 6" in err


# ------------------------------------------------------------------------------------------ logs and messages


def test_metrics_rows_of_re_run_steps_are_replaced(trained_run: Path, tmp_path: Path) -> None:
    recipe = _copy_run(trained_run, tmp_path)
    log = tmp_path / "copy" / "run" / "metrics.jsonl"
    with log.open("a", encoding="utf-8") as f:  # rows a killed run wrote after its last save
        f.write(json.dumps({"step": 5, "train_loss": 9.0}) + "\n" + json.dumps({"step": 6, "train_loss": 9.0}) + "\n")
    _run(recipe, "train.max_steps=6", resume=True)
    steps = [r["step"] for r in read_metrics(log) if "train_loss" in r]
    assert steps == [1, 2, 3, 4, 5, 6]
    assert all(r["train_loss"] != 9.0 for r in read_metrics(log) if "train_loss" in r)


def test_an_interrupt_names_the_last_saved_step(recipe_file: Path, capsys: pytest.CaptureFixture) -> None:
    def interrupt(call: int, loss: torch.Tensor) -> torch.Tensor:
        if call == 6:
            raise KeyboardInterrupt
        return loss

    with pytest.raises(KeyboardInterrupt):
        _run(recipe_file, patch_loss=interrupt)
    assert f"interrupted at step 5; last saved: step 4 in {recipe_file.parent / 'run' / 'last'}" \
        in _said(capsys)


def test_the_cli_says_how_to_continue_after_an_interrupt(recipe_file: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture) -> None:
    from aiayn.cli.main import main
    from aiayn.train import trainer

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer, "_grad_norm", interrupted)
    assert main(["train", str(recipe_file), "train.lr=0.002"]) == 130
    assert f"continue with: aiayn train {recipe_file} train.lr=0.002 --resume" in _said(capsys)


def test_a_time_limited_run_says_the_limit_stopped_it(recipe_file: Path, capsys: pytest.CaptureFixture) -> None:
    result, _ = _run(recipe_file, "train.max_minutes=0.0001", "train.max_steps=1000")
    assert result.steps < 1000
    assert f"stopped by train.max_minutes=0.0001 at step {result.steps} of max_steps 1000" in _said(capsys)


def test_averaging_too_few_checkpoints_says_so(recipe_file: Path, capsys: pytest.CaptureFixture) -> None:
    result, out = _run(recipe_file, "train.average_last=3", "train.save_every=6")
    assert result.averaged_dir is None and not (out / "averaged").exists()
    assert "no averaged/: train.average_last=3 needs at least 2 periodic checkpoints, this run has 1" \
        in _said(capsys)


def test_the_progress_bar_aims_at_the_limit_that_binds(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr("aiayn.train.progress.time.time", lambda: clock[0])
    steps_bound = TrainingProgress(max_steps=100, max_minutes=60, step=0, elapsed_before=0, enabled=False)
    clock[0] += 10
    steps_bound.update(10)  # 1 step/s: 100 steps long before 60 minutes
    assert steps_bound.bar.total == 100 and not steps_bound.time_binds
    time_bound = TrainingProgress(max_steps=10**6, max_minutes=4, step=0, elapsed_before=60, enabled=False)
    clock[0] += 30
    time_bound.update(30)  # 1 step/s; of 4 min, 1 spent before a resume and 0.5 now: ~step 180, not 1e6
    assert time_bound.time_binds and 175 <= time_bound.bar.total <= 185
    remaining = (time_bound.bar.total - 30) / 1.0  # steps left at 1 step/s
    assert math.isclose(remaining, 150, abs_tol=5)  # the ETA is the time left (2.5 min), not 11 days


# ------------------------------------------------------------------------------------------ one run per folder


def test_a_busy_folder_is_refused_and_a_killed_runs_lock_is_taken_over(recipe_file: Path,
                                                                        capsys: pytest.CaptureFixture) -> None:
    import os
    import subprocess
    import sys
    import time

    out = recipe_file.parent / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen([sys.executable, "-m", "aiayn.cli.main", "train", str(recipe_file),
                              "train.max_steps=100000", "train.eval_every=3"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while not (out / "last").is_dir() and time.time() < deadline and first.poll() is None:
            time.sleep(0.1)
        assert (out / "last").is_dir(), first.stderr.read().decode() if first.poll() is not None else "no save"
        for resume in (False, True):  # a fresh run and a resumed one alike
            with pytest.raises(AiaynError, match=rf"{out}: is in use by pid {first.pid} on host .*choose another"):
                _run(recipe_file, resume=resume)
    finally:
        first.kill()
        first.wait()
    reached = load_training_state(out / "last")["step"]
    capsys.readouterr()
    result, _ = _run(recipe_file, f"train.max_steps={reached + 2}", resume=True)
    assert result.steps == reached + 2
    said = _said(capsys)
    assert f"took over the lock of pid {first.pid}" in said
    assert not (out / ".lock").exists()  # released at the end


def test_a_run_whose_save_was_killed_between_its_renames_resumes(trained_run: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    recipe = _copy_run(trained_run, tmp_path)
    out = tmp_path / "copy" / "run"
    (out / "last").rename(out / "last.old")  # what a kill between `last -> last.old` and `tmp -> last` leaves
    with pytest.raises(AiaynError, match="already holds a training run; pass --resume"):
        _run(recipe)
    result, _ = _run(recipe, "train.max_steps=6", resume=True)
    assert result.steps == 6 and (out / "last").is_dir() and not (out / "last.old").exists()
    assert "resuming from step 4" in _said(capsys)
