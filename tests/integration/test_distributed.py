"""Data-parallel training under torch's own launcher and engines (``aiayn train --nproc 2``: torch.distributed.run,
gloo on the CPU) against the single-process trainer: DDP 2 ranks == 1 process accumulating 2 micro-batches, FSDP2
2 ranks == the same, resume on another number of ranks (2 -> 1, 1 -> 2, 2 -> 4 -> 1) through the sharded
checkpoint, a killed rank leaving a resumable checkpoint, and the errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_translation import _recipe

from aiayn.checkpoint import load_training_state, read_state_dict
from aiayn.cli.main import main
from aiayn.errors import AiaynError
from aiayn.pretrained import load_pretrained
from aiayn.tasks.registry import run_recipe
from aiayn.train.dcp_checkpoint import export_sharded, has_sharded
from aiayn.train.metrics_log import read_metrics

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch built without distributed")

# gloo on the CPU even where a GPU is present (a one-GPU machine cannot host two CUDA ranks)
QUIET = ["train.eval_every=100", "train.save_every=4", "train.average_last=0", "train.device=cpu"]
# no dropout: runs differ only in the order of floating-point sums. No biases: a key projection's bias gets a
# gradient of zero up to rounding, which Adam (eps 1e-9) would turn into updates of full size in either direction
EXACT = [*QUIET, "model.dropout=0.0", "model.bias=false"]
FSDP = ["train.parallel=fsdp"]


def _losses(run: Path) -> list[float]:
    return [r["train_loss"] for r in read_metrics(run / "metrics.jsonl") if "train_loss" in r]


def _weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return load_pretrained(checkpoint).model.state_dict()


def _max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _sharded_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    """FSDP's reduce-scatter sums gradients in another order than one process does; Adam turns a last-bit
    difference in a near-zero gradient into a visible one, so a few weights may differ by up to 1e-4 while
    all but 0.1% agree to 1e-5 (the runs told apart differ by over 1e-3)."""
    assert a.keys() == b.keys()
    far = sum(int(((a[k] - b[k]).abs() > 1e-5).sum()) for k in a)
    return _max_difference(a, b) < 1e-4 and far <= 1e-3 * sum(t.numel() for t in a.values())


def _train(folder: Path, corpus: Path, *args: str) -> int:
    folder.mkdir(exist_ok=True)
    return main(["train", str(_recipe(folder, corpus)), *args])


@pytest.fixture(scope="module")
def accumulated(tmp_path_factory: pytest.TempPathFactory, corpus_dir: Path) -> Path:
    """One process accumulating 2 micro-batches a step, 12 steps: the run every data-parallel run must make."""
    folder = tmp_path_factory.mktemp("one")
    run_recipe(_recipe(folder, corpus_dir), [*EXACT, "train.accum=2"])
    return folder / "run"


def test_ddp_on_two_ranks_makes_the_updates_of_one_process_accumulating_two(
        tmp_path: Path, corpus_dir: Path, accumulated: Path) -> None:
    assert _train(tmp_path / "two", corpus_dir, *EXACT, "--nproc", "2") == 0
    run = tmp_path / "two" / "run"
    a, b = _losses(accumulated), _losses(run)
    assert len(a) == len(b) == 12
    assert b == pytest.approx(a, rel=0, abs=1e-6)
    assert _max_difference(_weights(accumulated / "last"), _weights(run / "last")) < 1e-6
    state = load_training_state(run / "last")
    assert (state["world_size"], state["parallel"], len(state["rng_by_rank"])) == (2, "ddp", 2)
    # and it is not the same as one process without accumulation (the test can tell the runs apart)
    solo = tmp_path / "solo"
    solo.mkdir()
    run_recipe(_recipe(solo, corpus_dir), EXACT)
    assert _max_difference(_weights(accumulated / "last"), _weights(solo / "run" / "last")) > 1e-3


def test_fsdp_on_two_ranks_makes_the_updates_of_one_process_and_its_shards_export(
        tmp_path: Path, corpus_dir: Path, accumulated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _train(tmp_path / "two", corpus_dir, *EXACT, *FSDP, "--nproc", "2") == 0
    run = tmp_path / "two" / "run"
    assert _losses(run) == pytest.approx(_losses(accumulated), rel=0, abs=1e-5)
    reference = _weights(accumulated / "last")
    assert _sharded_close(reference, _weights(run / "last"))
    last = run / "last"
    assert has_sharded(last) and sorted(p.name for p in (last / "dcp").iterdir()) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp"]
    manifest = json.loads((last / "manifest.json").read_text())
    assert {"dcp/.metadata", "dcp/__0_0.distcp", "dcp/__1_0.distcp"} <= manifest["files"].keys()
    state = load_training_state(last)
    assert state["sharded"] == "dcp" and state["optimizer"] is None
    # the shards alone, in this one process, make the ordinary checkpoint of the same weights
    exported = export_sharded(last, tmp_path / "exported")
    assert not has_sharded(exported) and (exported / "tokenizer.json").is_file()
    assert _max_difference(read_state_dict(exported), read_state_dict(last)) == 0.0
    assert _max_difference(_weights(exported), _weights(last)) == 0.0
    # shards that do not fit (DCP raises a BaseException, not an Exception) are one clear error
    from torch.distributed.checkpoint.api import CheckpointException

    from aiayn.train import dcp_checkpoint

    def refuse(*args, **kwargs):
        raise CheckpointException("size mismatch", {})

    monkeypatch.setattr(dcp_checkpoint, "_dcp_load", refuse)
    with pytest.raises(AiaynError, match="the shards do not fit the model"):
        export_sharded(last, tmp_path / "exported-again")


def test_a_sharded_run_resumes_on_one_rank_and_on_four(tmp_path: Path, corpus_dir: Path, accumulated: Path,
                                                      capfd: pytest.CaptureFixture) -> None:
    """2 ranks to step 8, resharded onto 4 ranks (which load and save again), then 1 rank accumulating 2 to step
    12: the updates of the uninterrupted single process."""
    folder = tmp_path / "run2"
    assert _train(folder, corpus_dir, *EXACT, *FSDP, "train.max_steps=8", "--nproc", "2") == 0
    recipe = str(folder / "r.toml")
    assert main(["train", recipe, *EXACT, *FSDP, "train.max_steps=8", "--resume", "--nproc", "4"]) == 0
    assert sorted(p.name for p in (folder / "run" / "last" / "dcp").iterdir())[1:] == [
        f"__{r}_0.distcp" for r in range(4)]
    capfd.readouterr()
    assert main(["train", recipe, *EXACT, *FSDP, "train.accum=2", "--resume"]) == 0
    said = capfd.readouterr().out
    assert "processes: 4 -> 1" in said
    assert _losses(folder / "run") == pytest.approx(_losses(accumulated), rel=0, abs=1e-5)
    assert _sharded_close(_weights(accumulated / "last"), _weights(folder / "run" / "last"))


def test_a_single_process_run_resumes_sharded_on_two_ranks(tmp_path: Path, corpus_dir: Path,
                                                           accumulated: Path) -> None:
    folder = tmp_path / "run1"
    folder.mkdir()
    run_recipe(_recipe(folder, corpus_dir), [*EXACT, "train.accum=2", "train.max_steps=8"])
    assert main(["train", str(folder / "r.toml"), *EXACT, *FSDP, "--resume", "--nproc", "2"]) == 0
    assert _losses(folder / "run") == pytest.approx(_losses(accumulated), rel=0, abs=1e-5)
    assert _sharded_close(_weights(accumulated / "last"), _weights(folder / "run" / "last"))


def test_resume_on_two_ranks_matches_uninterrupted_and_another_world_size_continues(
        tmp_path: Path, corpus_dir: Path, capfd: pytest.CaptureFixture) -> None:
    # with dropout: each rank's RNG state must come back from the checkpoint
    full, part = tmp_path / "full", tmp_path / "part"
    assert _train(full, corpus_dir, *QUIET, "--nproc", "2") == 0
    assert _train(part, corpus_dir, *QUIET, "train.max_steps=8", "--nproc", "2") == 0
    recipe = str(part / "r.toml")
    assert main(["train", recipe, *QUIET, "--resume", "--nproc", "2"]) == 0
    a, b = _losses(full / "run"), _losses(part / "run")
    assert len(a) == len(b) == 12
    assert a == pytest.approx(b, abs=1e-6)
    assert _max_difference(_weights(full / "run" / "last"), _weights(part / "run" / "last")) < 1e-6
    # a changed number of processes continues, and says what it changes
    capfd.readouterr()
    assert main(["train", recipe, *QUIET, "train.max_steps=14", "--resume"]) == 0
    said = capfd.readouterr().out
    assert "processes: 2 -> 1" in said and "micro-batches per optimizer step: 2 -> 1" in said
    assert "train.accum=2" in said
    assert len(_losses(part / "run")) == 14


def test_a_rank_killed_mid_run_leaves_the_last_checkpoint_resumable(tmp_path: Path, corpus_dir: Path) -> None:
    folder = tmp_path / "killed"
    folder.mkdir()
    recipe = _recipe(folder, corpus_dir)
    args = [*EXACT, *FSDP, "train.max_steps=400", "train.save_every=2", "train.eval_every=1000"]
    launcher = subprocess.Popen([sys.executable, "-m", "aiayn", "train", str(recipe), *args, "--nproc", "2"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not (folder / "run" / "last" / "manifest.json").exists() and time.time() < deadline:
            time.sleep(0.05)
        assert launcher.poll() is None, launcher.stderr.read()
        time.sleep(0.3)  # into the next steps and saves
        ranks = _children(launcher.pid)
        assert len(ranks) == 2, ranks
        os.kill(ranks[-1], signal.SIGKILL)
        assert launcher.wait(timeout=120) != 0
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    last = folder / "run" / "last"
    state = load_training_state(last)
    saved_step = state["step"]
    assert saved_step >= 2 and saved_step < 400
    weights = read_state_dict(last)
    assert all(bool(torch.isfinite(t).all()) for t in weights.values())
    # on one rank, then sharded again on two
    assert main(["train", str(recipe), *args, f"train.max_steps={saved_step + 2}", "train.accum=2", "--resume"]) == 0
    assert main(["train", str(recipe), *args, f"train.max_steps={saved_step + 4}", "--resume", "--nproc", "2"]) == 0
    assert load_training_state(last)["step"] == saved_step + 4


def _children(pid: int) -> list[int]:
    """The pids of the processes ``pid`` started (the ranks torch.distributed.run launched), in start order."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found += [int(x) for x in text]
    return sorted(found)


def test_an_error_in_the_ranks_is_one_clear_message(tmp_path: Path, corpus_dir: Path,
                                                    capfd: pytest.CaptureFixture) -> None:
    assert main(["train", str(_recipe(tmp_path, corpus_dir)), "model.d_modle=64", "--nproc", "2"]) == 2
    err = capfd.readouterr().err
    assert "d_modle" in err and "Traceback" not in err
    assert "of 2 stopped with exit code 2" in err


def _launch(recipe: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "aiayn", "train", str(recipe), *args, "--nproc", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _after_step(run: Path, launcher: subprocess.Popen, step: int) -> None:
    deadline = time.time() + 120
    while time.time() < deadline:
        assert launcher.poll() is None, launcher.communicate()[0]
        rows = read_metrics(run / "metrics.jsonl") if (run / "metrics.jsonl").is_file() else []
        if any(r.get("step", 0) >= step and "train_loss" in r for r in rows):
            return
        time.sleep(0.05)
    raise AssertionError(f"no step {step} in 120 s")


@pytest.mark.parametrize("to", ["launcher mid-step", "launcher mid-validation", "one rank"])
def test_a_stop_signal_saves_one_step_of_every_rank_and_resuming_equals_no_stop(tmp_path: Path, corpus_dir: Path,
                                                                                to: str) -> None:
    # SIGTERM to the launcher (a scheduler, docker stop), which passes it on; SIGUSR1 to one rank only (Slurm's
    # --signal reaches every process; here only one), which stops the other after the same step
    sig = signal.SIGTERM if to.startswith("launcher") else signal.SIGUSR1
    folder = tmp_path / "stopped"
    folder.mkdir()
    recipe = _recipe(folder, corpus_dir)
    # progress lines (standard output is a pipe) say when a validation starts
    launcher = _launch(recipe, *QUIET, "train.max_steps=100000", "train.eval_every=5", "train.progress=true")
    said = ""
    try:
        if to.endswith("mid-validation"):
            while "validating" not in said:
                line = launcher.stdout.readline()
                assert line, said
                said += line
        else:
            _after_step(folder / "run", launcher, 3)
        os.kill(_children(launcher.pid)[-1] if to == "one rank" else launcher.pid, sig)
        said += launcher.communicate(timeout=150)[0]
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 128 + sig, said
    assert "Traceback" not in said and "SignalException" not in said and "Warning" not in said
    last = folder / "run" / "last"
    state = load_training_state(last)
    step = state["step"]
    assert len(state["rng_by_rank"]) == 2
    assert f"stopped by {sig.name} at step {step}; last saved: step {step} in {last}" in said
    assert f"continue with: {sys.executable} -m aiayn train {recipe} " in said and "--nproc 2 --resume" in said
    assert said.rstrip().endswith(f"aiayn train: stopped by {sig.name}") and said.count("aiayn train: stopped") == 1
    if to == "one rank":
        return
    end = [f"train.max_steps={step + 3}", "train.eval_every=5"]
    assert main(["train", str(recipe), *QUIET, *end, "--resume", "--nproc", "2"]) == 0
    assert _train(tmp_path, corpus_dir, *QUIET, *end, "--nproc", "2") == 0  # never stopped
    a, b = _weights(tmp_path / "run" / "last"), _weights(last)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_timed_checkpoints_are_taken_by_every_rank_together(tmp_path: Path, corpus_dir: Path) -> None:
    """``train.save_every_minutes``: the ranks' clocks are combined (one all-reduce), so every rank takes part in the
    same saves; here every step is due."""
    args = ["train.eval_every=100", "train.save_every=none", "train.save_every_minutes=1e-9", "train.device=cpu",
            "train.keep_checkpoints=3", "train.average_last=0", "train.max_steps=5"]
    assert _train(tmp_path / "timed", corpus_dir, *args, "--nproc", "2") == 0
    run = tmp_path / "timed" / "run"
    assert sorted(p.name for p in run.glob("step-*")) == ["step-3", "step-4", "step-5"]
    assert load_training_state(run / "last")["step"] == 5
