"""Training runs that go wrong: non-finite losses, damaged or edited training states, changed recipes on
resume, interrupts, time limits, resumed metrics logs. Each run is a tiny character LM (a few seconds)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from aiayn.checkpoint import STATE_FILE, load_training_state, read_state_dict
from aiayn.errors import AiaynError
from aiayn.tasks.registry import build_task, train_config
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
    with pytest.raises(AiaynError, match=r"diverged: 3 tries in a row at step 5, each on new batches.*"
                                         r"run/last \(step 4\)"):
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
    "step far past the schedule": (lambda s: s.update(step=10**12), "step=1000000000000 but the schedule made 4"),
    "torch generator state damaged": (lambda s: s["rng"].update(torch=torch.zeros(7, dtype=torch.uint8)),
                                      "random-number generator state is damaged"),
    "data sampler state damaged": (
        lambda s: s["position"]["sampler"].update(generator_state=torch.zeros(7, dtype=torch.uint8)),
        "data position does not fit this run's data or is damaged"),
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


@pytest.fixture
def unreadable(monkeypatch: pytest.MonkeyPatch):
    """``unreadable(path)``: make a file unreadable to this process (chmod 000; as root, which reads any file,
    opening it raises the PermissionError a chmod would give another user)."""
    import builtins
    import io
    import os

    blocked: set[str] = set()

    def make(path: Path) -> None:
        path.chmod(0)
        blocked.add(str(path.resolve()))

    if os.geteuid() == 0:
        real_open, real_io_open = builtins.open, io.open

        def guarded(opener):
            def open_(file, *args, **kwargs):
                if isinstance(file, (str, os.PathLike)) and str(Path(file).resolve()) in blocked:
                    raise PermissionError(13, "Permission denied", str(file))
                return opener(file, *args, **kwargs)
            return open_

        real_os_open = os.open

        def os_open(path, flags, mode=0o777, *, dir_fd=None):  # a checkpoint's files are opened inside its folder
            full = Path(os.readlink(f"/proc/self/fd/{dir_fd}")) / path if dir_fd is not None else Path(path)
            if str(full.resolve()) in blocked:
                raise PermissionError(13, "Permission denied", str(path))
            return real_os_open(path, flags, mode, dir_fd=dir_fd)

        monkeypatch.setattr(builtins, "open", guarded(real_open))
        monkeypatch.setattr(io, "open", guarded(real_io_open))
        monkeypatch.setattr(os, "open", os_open)
        monkeypatch.setattr("safetensors.safe_open", _blocked_safe_open(blocked))
    yield make
    for name in blocked:
        Path(name).chmod(0o644)


def _blocked_safe_open(blocked: set[str]):
    import safetensors

    real = safetensors.safe_open

    def safe_open(file, *args, **kwargs):
        if str(Path(file).resolve()) in blocked:
            raise PermissionError(13, "Permission denied", str(file))
        return real(file, *args, **kwargs)
    return safe_open


@pytest.mark.parametrize("name", [STATE_FILE, "model.safetensors", "tokenizer.json", "config.json"])
def test_an_unreadable_checkpoint_file_is_one_message_on_resume_and_generate(
        trained_run: Path, tmp_path: Path, unreadable, capsys: pytest.CaptureFixture, name: str) -> None:
    from aiayn.cli.main import main

    recipe = _copy_run(trained_run, tmp_path)
    last = tmp_path / "copy" / "run" / "last"
    unreadable(last / name)
    capsys.readouterr()
    commands = [["train", str(recipe), "train.max_steps=6", "--resume"]]
    if name != STATE_FILE:  # generate reads no training state
        commands.append(["generate", "--checkpoint", str(last), "--prompt", "the", "--max-new-tokens", "3"])
    for argv in commands:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "Traceback" not in err and err.count("error:") == 1, err
        assert f"{last / name}: cannot read" in err and "Permission denied" in err, err


def test_an_out_dir_under_a_file_names_the_file(recipe_file: Path, capsys: pytest.CaptureFixture) -> None:
    from aiayn.cli.main import main

    blocker = recipe_file.parent / "a" / "file"
    blocker.parent.mkdir()
    blocker.write_text("mine\n")
    assert main(["train", str(recipe_file), f"train.out_dir={blocker / 'sub'}"]) == 2
    err = capsys.readouterr().err
    assert f"error: {blocker}: is a file, not a folder" in err and "Traceback" not in err
    assert blocker.read_text() == "mine\n"


def test_an_edited_tokenizer_file_is_refused_by_its_checksum(trained_run: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    from aiayn.cli.main import main

    recipe = _copy_run(trained_run, tmp_path)
    file = tmp_path / "copy" / "run" / "last" / "tokenizer.json"
    data = json.loads(file.read_text(encoding="utf-8"))
    data["chars"][2], data["chars"][3] = data["chars"][3], data["chars"][2]  # same size, valid JSON, other ids
    file.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    capsys.readouterr()
    for argv in (["generate", "--checkpoint", str(file.parent), "--prompt", "the", "--max-new-tokens", "3"],
                 ["train", str(recipe), "train.max_steps=6", "--resume"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert f"{file}: checksum mismatch" in err and "Traceback" not in err, err


def test_every_checkpoint_file_gets_the_umask_mode(trained_run: Path) -> None:
    import os
    import stat

    mask = os.umask(0o022)
    os.umask(mask)
    for directory in (trained_run / "run" / "last", trained_run / "run" / "best"):
        for f in directory.iterdir():
            assert stat.S_IMODE(f.stat().st_mode) == 0o666 & ~mask, f


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


# ------------------------------------------------------------------------------------------ resumed settings


def _rows_after(out: Path, step: int, key: str) -> list[dict]:
    return [r for r in read_metrics(out / "metrics.jsonl") if r["step"] > step and key in r]


@pytest.mark.parametrize("schedule", ["constant_warmup", "warmup_cosine", "inverse_sqrt_warmup"])
def test_a_resumed_run_trains_at_its_new_learning_rate_and_schedule(trained_run: Path, tmp_path: Path,
                                                                   schedule: str) -> None:
    from aiayn.train.schedules import build_schedule

    recipe = _copy_run(trained_run, tmp_path)
    _, out = _run(recipe, "train.lr=0.02", f"train.schedule={schedule}", "train.warmup=6", "train.max_steps=8",
                  resume=True)
    kw = {"warmup": 6, **({"total": 8} if schedule == "warmup_cosine" else {}),
          **({"d_model": 16} if schedule == "inverse_sqrt_warmup" else {})}
    multiplier = build_schedule(schedule, **kw).multiplier
    rows = _rows_after(out, 4, "lr")
    assert [r["step"] for r in rows] == [5, 6, 7, 8]
    for r in rows:  # the lr logged after step k is the one step k + 1 uses
        assert r["lr"] == pytest.approx(0.02 * multiplier(r["step"] + 1), rel=1e-12)


def test_the_first_resumed_step_uses_the_new_learning_rate(trained_run: Path, tmp_path: Path) -> None:
    recipe = _copy_run(trained_run, tmp_path)
    out = tmp_path / "copy" / "run"
    before = read_state_dict(out / "last")
    state = load_training_state(out / "last")
    _run(recipe, "train.lr=0.5", "train.weight_decay=0.25", "train.max_steps=5", resume=True)
    after = read_state_dict(out / "last")
    # Adam's first moments are ~gradient-sized, so a step moves weights by about lr: 0.5 (new), not 3e-3 (saved)
    moved = max(float((after[k] - before[k]).abs().max()) for k in before if before[k].is_floating_point())
    assert moved > 0.1
    groups = load_training_state(out / "last")["optimizer"]["param_groups"]
    assert all(g["initial_lr"] == 0.5 for g in groups)
    assert sorted(g["weight_decay"] for g in groups) == [0.0, 0.25]
    assert state["optimizer"]["param_groups"][0]["initial_lr"] == 3e-3


def test_a_huge_new_learning_rate_takes_effect_and_diverges(trained_run: Path, tmp_path: Path) -> None:
    recipe = _copy_run(trained_run, tmp_path)
    with pytest.raises(AiaynError, match="diverged"):
        _run(recipe, "train.lr=1e30", "train.clip_norm=None", "train.max_steps=30", resume=True)


def test_a_resumed_run_uses_its_new_label_smoothing(trained_run: Path, tmp_path: Path) -> None:
    recipe = _copy_run(trained_run, tmp_path)
    _, out = _run(recipe, "train.label_smoothing=0.5", "train.max_steps=6", resume=True)
    before = [r for r in read_metrics(out / "metrics.jsonl") if "train_loss" in r and r["step"] <= 4]
    after = _rows_after(out, 4, "train_loss")
    assert all(r["train_loss"] == pytest.approx(r["train_nll"]) for r in before)  # trained without smoothing
    assert after and all(abs(r["train_loss"] - r["train_nll"]) > 1e-3 for r in after)


def test_a_resumed_run_uses_its_new_clip_norm(trained_run: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from aiayn.train import parallel

    seen: list = []
    real = torch.nn.utils.clip_grads_with_norm_

    def spy(params, max_norm, total_norm, *args, **kwargs):
        seen.append(max_norm)
        return real(params, max_norm, total_norm, *args, **kwargs)

    monkeypatch.setattr(parallel.torch.nn.utils, "clip_grads_with_norm_", spy)
    recipe = _copy_run(trained_run, tmp_path)
    _run(recipe, "train.clip_norm=0.125", "train.max_steps=6", resume=True)
    assert seen == [0.125, 0.125]


def test_a_resumed_run_uses_its_new_batch_size_and_cadence(trained_run: Path, tmp_path: Path) -> None:
    recipe = _copy_run(trained_run, tmp_path)
    sizes: list[int] = []
    recipe_obj = load_recipe(recipe, ["data.batch_size=7", "train.max_steps=10", "train.eval_every=3",
                                      "train.save_every=2", "train.log_every=2"])
    cfg = train_config(recipe_obj)
    task = build_task(recipe_obj, cfg, True)
    original = task.loss

    def loss(batch, smoothing):
        sizes.append(int(batch["ids"].shape[0]))
        return original(batch, smoothing)

    task.loss = loss
    train(task, cfg, resume=True, recipe=recipe_obj)
    out = Path(cfg.out_dir)
    assert sizes == [7] * 6
    assert [r["step"] for r in _rows_after(out, 4, "val_loss")] == [6, 9, 10]
    assert [r["step"] for r in _rows_after(out, 4, "train_loss")] == [6, 8, 10]
    assert sorted(p.name for p in out.glob("step-*")) == ["step-10", "step-6", "step-8"]


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


def _interrupt_at(n: int):
    """A ``patch_loss`` that raises KeyboardInterrupt in the ``n``-th micro-batch's loss."""
    def interrupt(call: int, loss: torch.Tensor) -> torch.Tensor:
        if call == n:
            raise KeyboardInterrupt
        return loss
    return interrupt


def test_an_interrupt_saves_the_last_whole_step(recipe_file: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(KeyboardInterrupt):
        _run(recipe_file, patch_loss=_interrupt_at(6))  # in step 6: steps 1-5 done, step 4 saved
    last = recipe_file.parent / "run" / "last"
    assert f"interrupted at step 5; last saved: step 5 in {last}" in _said(capsys)
    assert load_training_state(last)["step"] == 5


@pytest.mark.parametrize("where", ["mid-step", "mid-validation"])
def test_a_run_resumed_after_an_interrupt_equals_an_uninterrupted_one(tmp_path: Path, recipe_file: Path,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      where: str) -> None:
    settings = ("model.dropout=0.2", "train.eval_every=3")
    _, out = _run(recipe_file, *settings)
    whole = read_state_dict(out / "last")
    recipe = tmp_path / "again.toml"
    recipe.write_text(recipe_file.read_text().replace(str(out), str(tmp_path / "again")), encoding="utf-8")
    if where == "mid-step":
        with pytest.raises(KeyboardInterrupt):
            _run(recipe, *settings, patch_loss=_interrupt_at(5))  # step 4 done, not saved (eval_every=3)
    else:
        from aiayn.tasks.lm import LMTask

        real, calls = LMTask.evaluate, [0]

        def evaluate(self):
            calls[0] += 1
            if calls[0] == 2:  # the validation of step 6, after step 6's update
                raise KeyboardInterrupt
            return real(self)

        monkeypatch.setattr(LMTask, "evaluate", evaluate)
        with pytest.raises(KeyboardInterrupt):
            _run(recipe, *settings)
        monkeypatch.setattr(LMTask, "evaluate", real)
    saved = load_training_state(tmp_path / "again" / "last")["step"]
    assert saved == (4 if where == "mid-step" else 6)
    _run(recipe, *settings, resume=True)
    resumed = read_state_dict(tmp_path / "again" / "last")
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)


def test_the_cli_says_how_to_continue_after_an_interrupt(recipe_file: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture) -> None:
    from aiayn.cli.main import main
    from aiayn.train import step as trainer  # the step calls _grad_norm

    real, calls = trainer._grad_norm, [0]

    def interrupted(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer, "_grad_norm", interrupted)
    assert main(["train", str(recipe_file), "train.lr=0.002"]) == 130
    said = _said(capsys)
    assert f"{recipe_file}: reading the data, preparing the tokenizer and the lm model" in said  # start-up is said
    assert "last saved: step 2" in said
    assert f"continue with: aiayn train {recipe_file} train.lr=0.002 --resume" in said


def test_an_interrupt_before_the_first_step_suggests_no_resume(recipe_file: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture) -> None:
    from aiayn.cli.main import main
    from aiayn.train import step as trainer  # the step calls _grad_norm

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer, "_grad_norm", interrupted)
    assert main(["train", str(recipe_file)]) == 130
    said = _said(capsys)
    assert "interrupted at step 0; nothing saved" in said and "--resume" not in said
    assert not (recipe_file.parent / "run" / "last").exists()


def test_a_finished_run_resumed_says_there_is_nothing_to_train(trained_run: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    recipe = _copy_run(trained_run, tmp_path)
    result, _ = _run(recipe, "train.max_steps=4", resume=True)  # read and saved again (resharding does this)
    assert result.steps == 4 and "at train.max_steps=4: nothing to train" in _said(capsys)
    with pytest.raises(AiaynError, match=r"at step 4, past train.max_steps=3; raise train.max_steps"):
        _run(recipe, "train.max_steps=3", resume=True)


def test_a_time_limited_run_says_the_limit_stopped_it(recipe_file: Path, capsys: pytest.CaptureFixture) -> None:
    result, _ = _run(recipe_file, "train.max_minutes=0.0001", "train.max_steps=1000")
    assert result.steps < 1000
    assert f"stopped by train.max_minutes=0.0001 at step {result.steps} of max_steps 1000" in _said(capsys)


def test_averaging_too_few_checkpoints_says_so(recipe_file: Path, capsys: pytest.CaptureFixture) -> None:
    result, out = _run(recipe_file, "train.average_last=3", "train.save_every=6")
    assert result.averaged_dir is None and not (out / "averaged").exists()
    assert "no averaged/: train.average_last=3 needs at least 2 periodic checkpoints, this run has 1" \
        in _said(capsys)


def test_progress_in_a_log_is_plain_lines(recipe_file: Path, capsys: pytest.CaptureFixture) -> None:
    _run(recipe_file, "train.progress=true")  # captured output is not a terminal, as a log file is not
    said = _said(capsys)
    assert "\r" not in said
    assert "step 8/8 (to step 8), loss " in said and "step 4: validating" in said
    assert "step 8: val_loss=" in said and " s)" in said  # each validation's time


def test_a_time_limited_run_validates_and_says_what_the_limit_counted(recipe_file: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    result, _ = _run(recipe_file, "train.max_minutes=0.0001", "train.max_steps=1000", "train.eval_every=1000")
    said = _said(capsys)
    assert "min of steps, validations and saves; start-up before them and the last validation and save after " \
           "them are not counted" in said
    assert f"step {result.steps}: validating and saving before stopping" in said
    assert 0 < result.trained_seconds <= result.wall_seconds


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
