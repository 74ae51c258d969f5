"""Stop signals (SIGTERM, SIGHUP, SIGUSR1, SIGINT) end a training run as Ctrl-C does: the last whole step is saved,
the command says so and how to continue, exits with 128 + the signal's number, and the resumed run equals one that
was never stopped, bit for bit. In-process runs send the signal from inside a step or a validation (deterministic);
subprocess runs get it from outside at whatever moment it lands, as a scheduler sends it. Data-parallel runs are in
tests/integration/test_distributed.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from test_training_runs import _run, _said

from aiayn.checkpoint import load_training_state, read_state_dict
from aiayn.train.metrics_log import read_metrics
from aiayn.train.stop_signals import STOP_SIGNALS, Stopped, stop_signals

SETTINGS = ("model.dropout=0.2", "train.eval_every=3")  # dropout: the random generators must come back too


@pytest.fixture(autouse=True)
def hang_ups_not_ignored() -> Iterator[None]:
    """SIGHUP at its default for each test, as a terminal leaves it; a suite started under ``nohup`` inherits it
    ignored, which the handlers then leave ignored (tested on its own below)."""
    before = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, before)


def _again(recipe_file: Path, tmp_path: Path, name: str) -> Path:
    """The same recipe writing to ``tmp_path / name``."""
    recipe = tmp_path / f"{name}.toml"
    recipe.write_text(recipe_file.read_text().replace(str(tmp_path / "run"), str(tmp_path / name)), encoding="utf-8")
    return recipe


def _same_weights(a: Path, b: Path) -> bool:
    x, y = read_state_dict(a), read_state_dict(b)
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1], ids=lambda s: s.name)
@pytest.mark.parametrize("where", ["mid-step", "mid-update", "mid-validation"])
def test_a_stop_signal_saves_the_last_whole_step_and_resuming_equals_no_stop(
        tmp_path: Path, recipe_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
        sig: signal.Signals, where: str) -> None:
    _, out = _run(recipe_file, *SETTINGS)
    recipe = _again(recipe_file, tmp_path, "again")
    if where == "mid-step":
        def send(call: int, loss: torch.Tensor) -> torch.Tensor:
            if call == 5:  # in step 5: step 4 done, not saved (eval_every=3)
                os.kill(os.getpid(), sig)
            return loss

        with pytest.raises(Stopped) as stopped:
            _run(recipe, *SETTINGS, patch_loss=send)
    elif where == "mid-update":
        from aiayn.train.precision import Precision

        real_step, updates = Precision.step, [0]

        def step_between(self, optimizer):  # between step 5's optimizer update and its schedule step
            real_step(self, optimizer)
            updates[0] += 1
            if updates[0] == 5:
                os.kill(os.getpid(), sig)

        monkeypatch.setattr(Precision, "step", step_between)
        with pytest.raises(Stopped) as stopped:
            _run(recipe, *SETTINGS)
        monkeypatch.setattr(Precision, "step", real_step)
    else:
        from aiayn.tasks.lm import LMTask

        real, calls = LMTask.evaluate, [0]

        def evaluate(self):
            calls[0] += 1
            if calls[0] == 2:  # the validation of step 6, after step 6's update
                os.kill(os.getpid(), sig)
            return real(self)

        monkeypatch.setattr(LMTask, "evaluate", evaluate)
        with pytest.raises(Stopped) as stopped:
            _run(recipe, *SETTINGS)
        monkeypatch.setattr(LMTask, "evaluate", real)
    step = {"mid-step": 4, "mid-update": 5, "mid-validation": 6}[where]  # an update begun is finished
    assert stopped.value.signum == sig and stopped.value.exit_code == 128 + sig
    last = tmp_path / "again" / "last"
    assert f"stopped by {sig.name} at step {step}; last saved: step {step} in {last}" in _said(capsys)
    assert load_training_state(last)["step"] == step
    assert not (tmp_path / "again" / ".lock").exists()
    _run(recipe, *SETTINGS, resume=True)
    assert _same_weights(out / "last", last)


def test_the_handlers_are_put_back_after_a_run(recipe_file: Path) -> None:
    before = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    _run(recipe_file)
    assert {s: signal.getsignal(s) for s in STOP_SIGNALS} == before


def test_an_ignored_sigint_is_handled_and_an_ignored_sighup_stays_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(signal, "getsignal", lambda s: signal.SIG_IGN)  # as a shell's `&` and nohup leave them
    installed: dict[int, object] = {}
    monkeypatch.setattr(signal, "signal", lambda s, h: installed.__setitem__(s, h))
    with stop_signals(deferred=False):
        pass
    assert signal.SIGINT in installed and signal.SIGTERM in installed and signal.SIGUSR1 in installed
    assert signal.SIGHUP not in installed


def test_a_held_block_runs_to_its_end_and_the_stop_follows_it() -> None:
    ran = []
    with stop_signals(deferred=False) as handlers:
        with pytest.raises(Stopped) as stopped:
            with handlers.held():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.2)
                ran.append("the rest of the block")
            ran.append("after the block")
        assert ran == ["the rest of the block"] and stopped.value.signum == signal.SIGTERM
        with handlers.held():  # a later SIGTERM is ignored, as during the save that follows a stop
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
        with pytest.raises(Stopped) as again:  # and a later Ctrl-C is not
            with handlers.held():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.2)
    assert again.value.signum == signal.SIGINT and handlers.received == [signal.SIGTERM] * 2 + [signal.SIGINT]


def test_a_second_sigterm_does_not_cut_the_save_short_and_a_second_ctrl_c_does() -> None:
    with stop_signals(deferred=False) as handlers:
        with pytest.raises(Stopped):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        os.kill(os.getpid(), signal.SIGTERM)  # ignored: the save under way is what the sender waits for
        with pytest.raises(Stopped) as again:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    assert again.value.signum == signal.SIGINT and handlers.signum == signal.SIGTERM


# ------------------------------------------------------------------------------------------ from outside, a CLI run


def _start(recipe: Path, *args: str, ignore_sigint: bool = False) -> subprocess.Popen:
    def preexec() -> None:
        if ignore_sigint:  # as a non-interactive shell starts a job with `&`
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "aiayn", "train", str(recipe), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=preexec, env=env)


def _wait_for_step(run: Path, process: subprocess.Popen, step: int, seconds: float = 120) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        assert process.poll() is None, process.communicate()
        rows = read_metrics(run / "metrics.jsonl") if (run / "metrics.jsonl").is_file() else []
        if any(r.get("step", 0) >= step and "train_loss" in r for r in rows):
            return
        time.sleep(0.02)
    raise AssertionError(f"no step {step} within {seconds} s")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_cli_run_sent_a_signal_saves_says_how_to_continue_and_resumes_exactly(
        tmp_path: Path, recipe_file: Path, sig: signal.Signals) -> None:
    recipe = _again(recipe_file, tmp_path, "cli")
    run = tmp_path / "cli"
    # a run with no end in sight, stopped from outside; SIGINT as a job started with `&` inherits it: ignored
    process = _start(recipe, *SETTINGS, "train.max_steps=100000", ignore_sigint=sig == signal.SIGINT)
    try:
        _wait_for_step(run, process, 5)
        process.send_signal(sig)
        out, err = process.communicate(timeout=120)
        err = out + err  # the trainer prints to stdout, the command to stderr
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 128 + sig, err
    assert "Traceback" not in err
    step = load_training_state(run / "last")["step"]
    assert f"stopped by {sig.name} at step {step}; last saved: step {step} in {run / 'last'}" in err
    assert f"continue with: {sys.executable} -m aiayn train {recipe} " in err  # the command as it was run
    assert err.rstrip().endswith(f"aiayn train: stopped by {sig.name}")
    assert not (run / ".lock").exists()
    # resumed to step + 3, against a run never stopped
    end = f"train.max_steps={step + 3}"
    done = subprocess.run([sys.executable, "-m", "aiayn", "train", str(recipe), *SETTINGS, end, "--resume"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"trained steps {step + 1}-{step + 3} in " in done.stdout and f"{step + 3} steps and " in done.stdout
    _, whole = _run(_again(recipe_file, tmp_path, "whole"), *SETTINGS, end)
    assert _same_weights(whole / "last", run / "last")
