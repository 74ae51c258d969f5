"""Checkpoint directories: round trip, ties, crash safety, averaging, pruning, RNG."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import subprocess
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from aiayn.checkpoint import (
    CONFIG_FILE,
    MANIFEST_FILE,
    MODEL_FILE,
    STATE_FILE,
    average_checkpoints,
    capture_rng,
    checkpoint_dir,
    checkpoint_file,
    keep_last,
    load_config,
    load_model_state,
    load_training_state,
    read_state_dict,
    recovered_file,
    restore_rng,
    save_checkpoint,
)
from aiayn.errors import AiaynError
from aiayn.train.restore import recover_checkpoint
from aiayn.train.schedules import build_scheduler


class Tiny(nn.Module):
    def __init__(self, vocab: int = 13, d: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.norm = nn.LayerNorm(d)
        self.ff = nn.Linear(d, d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.register_buffer("counter", torch.tensor([3, 4], dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.ff(self.norm(self.embed(x)))))


def _trained(seed: int) -> tuple[Tiny, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(seed)
    m = Tiny()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    sched = build_scheduler(opt, "warmup_cosine", warmup=2, total=10)
    for _ in range(3):
        loss = m(torch.randint(0, 13, (2, 5))).logsumexp(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return m, opt, sched


def test_round_trip_is_bit_exact_and_ties_survive(tmp_path: Path) -> None:
    m, opt, sched = _trained(0)
    cfg = {"d_model": 8, "vocab": 13, "name": "tiny"}
    ck = save_checkpoint(
        tmp_path / "step_3",
        m,
        cfg,
        optimizer=opt,
        scheduler=sched,
        train_state={"step": 3, "epoch": 0, "data": {"offset": 17}, "extra": {"best": 1.5}},
    )
    assert sorted(p.name for p in ck.iterdir()) == ["config.json", MANIFEST_FILE, MODEL_FILE, STATE_FILE]
    assert load_config(ck) == cfg

    torch.manual_seed(99)
    m2 = Tiny()
    load_model_state(ck, m2)
    for (k, a), (_, b) in zip(m.state_dict().items(), m2.state_dict().items()):
        assert torch.equal(a, b), k
    assert m2.head.weight is m2.embed.weight
    with torch.no_grad():
        m2.embed.weight[0, 0] = 123.0
    assert m2.head.weight[0, 0] == 123.0

    state = load_training_state(ck)
    assert state is not None
    assert state["step"] == 3 and state["data"] == {"offset": 17} and state["extra"] == {"best": 1.5}
    opt2 = torch.optim.AdamW(m2.parameters(), lr=1e-2)
    sched2 = build_scheduler(opt2, "warmup_cosine", warmup=2, total=10)
    opt2.load_state_dict(state["optimizer"])
    sched2.load_state_dict(state["scheduler"])
    assert sched2.last_epoch == 3 and opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    s1, s2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert s1.keys() == s2.keys()
    for k in s1:
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(s1[k][name], s2[k][name])


def test_tied_tensor_stored_once_and_restored_by_name(tmp_path: Path) -> None:
    m = Tiny()
    ck = save_checkpoint(tmp_path / "c", m, {})
    from safetensors import safe_open

    with safe_open(str(ck / MODEL_FILE), framework="pt") as f:
        stored = set(f.keys())
    assert len(stored) == len(m.state_dict()) - 1
    sd = read_state_dict(ck)
    assert sd.keys() == m.state_dict().keys()
    assert sd["head.weight"] is sd["embed.weight"]


def test_overwrite_keeps_one_checkpoint_and_no_leftovers(tmp_path: Path) -> None:
    m0, _, _ = _trained(0)
    m1, _, _ = _trained(1)
    target = tmp_path / "latest"
    save_checkpoint(target, m0, {"v": 0})
    save_checkpoint(target, m1, {"v": 1})
    assert load_config(target) == {"v": 1}
    assert torch.equal(read_state_dict(target)["ff.weight"], m1.ff.weight.detach())
    assert [p.name for p in tmp_path.iterdir()] == ["latest"]


def test_crash_leftovers_still_load(tmp_path: Path) -> None:
    m0, _, _ = _trained(0)
    target = tmp_path / "latest"
    save_checkpoint(target, m0, {"v": 0})
    # Crash while writing: a half-written temporary sibling is left behind.
    dead = subprocess.Popen(["true"])
    dead.wait()
    tmp = tmp_path / f".latest.tmp-{dead.pid}-deadbeef"  # as older versions named it: no host
    tmp.mkdir()
    (tmp / "config.json").write_text("{broken")
    assert load_config(target) == {"v": 0}
    # Crash between the two renames: only latest.old exists.
    target.rename(tmp_path / "latest.old")
    assert not target.exists()
    assert load_config(target) == {"v": 0}
    m = Tiny()
    load_model_state(target, m)
    assert torch.equal(m.ff.weight, m0.ff.weight)
    # The next save recovers: leftovers are cleaned up and the new checkpoint is in place.
    m1, _, _ = _trained(1)
    save_checkpoint(target, m1, {"v": 1})
    assert load_config(target) == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest"]


def test_failed_save_leaves_previous_checkpoint(tmp_path: Path) -> None:
    m, _, _ = _trained(0)
    target = tmp_path / "ck"
    save_checkpoint(target, m, {"v": 0})

    def bad_writer(directory: Path) -> None:
        raise OSError("disk full")

    with pytest.raises(AiaynError, match="disk full; cannot save the checkpoint"):
        save_checkpoint(target, m, {"v": 1}, tokenizer_writer=bad_writer)
    with pytest.raises(AiaynError, match="not JSON-serializable"):
        save_checkpoint(target, m, {"v": object()})
    with pytest.raises(AiaynError, match=r"train_state\['bad'\]"):
        save_checkpoint(target, m, {"v": 2}, train_state={"bad": {1, 2}})
    assert load_config(target) == {"v": 0}
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]


def test_tokenizer_files_copied_or_written(tmp_path: Path) -> None:
    m = Tiny()
    tok = tmp_path / "tokenizer.json"
    tok.write_text('{"model": "bpe"}')
    ck = save_checkpoint(tmp_path / "a", m, {}, tokenizer_writer=[tok])
    assert (ck / "tokenizer.json").read_text() == '{"model": "bpe"}'
    ck = save_checkpoint(tmp_path / "b", m, {}, tokenizer_writer=lambda d: (d / "vocab.txt").write_text("x"))
    assert (ck / "vocab.txt").read_text() == "x"
    clash = tmp_path / "tok" / "config.json"
    clash.parent.mkdir()
    clash.write_text("{}")
    with pytest.raises(AiaynError, match="may not be named config.json"):
        save_checkpoint(tmp_path / "c", m, {}, tokenizer_writer=[clash])
    with pytest.raises(AiaynError, match="missing.json"):
        save_checkpoint(tmp_path / "c", m, {}, tokenizer_writer=[tmp_path / "missing.json"])


def test_missing_or_corrupt_checkpoints_raise_naming_the_path(tmp_path: Path) -> None:
    m = Tiny()
    with pytest.raises(AiaynError, match="no checkpoint directory"):
        load_config(tmp_path / "nope")
    ck = save_checkpoint(tmp_path / "ck", m, {"a": 1}, train_state={"step": 1})
    (ck / MODEL_FILE).write_bytes(b"\x00\x01garbage")
    with pytest.raises(AiaynError, match=f"{MODEL_FILE}.*corrupt"):
        load_model_state(ck, m)
    (ck / MODEL_FILE).unlink()
    with pytest.raises(AiaynError, match=f"no {MODEL_FILE}"):
        load_model_state(ck, m)
    (ck / "config.json").write_text('{\n  "a": 1,\n  oops\n}')
    with pytest.raises(AiaynError, match=r"config.json:3: invalid JSON"):
        load_config(ck)
    (ck / STATE_FILE).write_bytes(b"not a zip")
    with pytest.raises(AiaynError, match=f"{STATE_FILE}: checksum mismatch"):
        load_training_state(ck)
    (ck / STATE_FILE).unlink()
    with pytest.raises(AiaynError, match=f"{STATE_FILE}: missing, though {MANIFEST_FILE} lists it"):
        load_training_state(ck)
    (ck / MANIFEST_FILE).unlink()  # a checkpoint from before manifests: read unverified
    assert load_training_state(ck) is None
    (ck / STATE_FILE).write_bytes(b"not a zip")
    with pytest.raises(AiaynError, match=f"{STATE_FILE}: cannot read training state"):
        load_training_state(ck)
    # Weights of another shape: a clear error, not a raw RuntimeError.
    good = save_checkpoint(tmp_path / "other", Tiny(vocab=20), {})
    with pytest.raises(AiaynError, match="do not fit the model"):
        load_model_state(good, Tiny())


def test_training_state_refuses_pickled_objects(tmp_path: Path) -> None:
    ck = save_checkpoint(tmp_path / "ck", Tiny(), {}, train_state={"step": 1})

    torch.save({"format_version": 1, "x": Fraction(1, 3)}, ck / STATE_FILE)  # needs unpickling
    with pytest.raises(AiaynError, match="checksum mismatch"):  # the manifest catches the edit first
        load_training_state(ck)
    (ck / MANIFEST_FILE).unlink()
    with pytest.raises(AiaynError) as e:
        load_training_state(ck)
    said = str(e.value)  # one line, not torch's seven: the file, what it holds, why refused, the fix
    assert said.startswith(f"{ck / STATE_FILE}: holds objects other than tensors and plain values (it names "
                           "fractions.Fraction); refused for safety, since loading it could run code: ")
    assert "\n" not in said and "train.out_dir" in said and "weights_only" not in said


def test_refuses_to_overwrite_a_non_checkpoint_directory(tmp_path: Path) -> None:
    precious = tmp_path / "data"
    precious.mkdir()
    (precious / "corpus.txt").write_text("keep me")
    with pytest.raises(AiaynError, match="not a checkpoint"):
        save_checkpoint(precious, Tiny(), {})
    assert (precious / "corpus.txt").read_text() == "keep me"


def test_average_of_two_is_the_mean(tmp_path: Path) -> None:
    m0, _, _ = _trained(0)
    m1, _, _ = _trained(1)
    a = save_checkpoint(tmp_path / "a", m0, {})
    b = save_checkpoint(tmp_path / "b", m1, {})
    avg = average_checkpoints([a, b])
    for k, v in m0.state_dict().items():
        w = m1.state_dict()[k]
        if v.is_floating_point():
            torch.testing.assert_close(avg[k], (v + w) / 2, rtol=0, atol=1e-7)
        else:
            assert torch.equal(avg[k], w)
    assert avg["head.weight"] is avg["embed.weight"]
    m = Tiny()
    m.load_state_dict(avg)
    assert torch.equal(average_checkpoints([a])["ff.weight"], m0.ff.weight.detach())
    other = save_checkpoint(tmp_path / "c", Tiny(vocab=20), {})
    with pytest.raises(AiaynError, match="not the same model"):
        average_checkpoints([a, other])
    with pytest.raises(AiaynError, match="no checkpoints"):
        average_checkpoints([])


def test_write_average_and_the_average_command(tmp_path: Path, capsys) -> None:
    from aiayn.checkpoint import periodic_checkpoints, write_average
    from aiayn.cli.main import main

    run = tmp_path / "run"
    models = {step: _trained(seed)[0] for seed, step in enumerate((200, 1000, 400))}
    for step, m in models.items():
        save_checkpoint(run / f"step-{step}", m, {"model": {"d": 4}}, tokenizer_writer=[_tok_file(tmp_path)])
    (run / "step-x").mkdir()  # not a periodic checkpoint
    assert [p.name for p in periodic_checkpoints(run)] == ["step-200", "step-400", "step-1000"]

    out = write_average([run / "step-400", run / "step-1000"], tmp_path / "avg")
    assert sorted(f.name for f in out.iterdir()) == ["config.json", MANIFEST_FILE, "model.safetensors", "tok.json"]
    got = read_state_dict(out)
    want = average_checkpoints([run / "step-400", run / "step-1000"])
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert got["head.weight"] is got["embed.weight"]  # the tie survives
    assert load_config(out) == {"model": {"d": 4}}

    assert main(["average", "--run", str(run), "--last", "2", "--out", str(tmp_path / "cli")]) == 0
    assert "averaged 2 checkpoints (step-400 .. step-1000)" in capsys.readouterr().out
    cli = read_state_dict(tmp_path / "cli")
    assert all(torch.equal(cli[k], want[k]) for k in want)
    assert main([
        "average", str(run / "step-200"), str(run / "step-400"), str(run / "step-1000"), "--out", str(tmp_path / "all")
    ]) == 0
    every = average_checkpoints(periodic_checkpoints(run))
    assert all(torch.equal(read_state_dict(tmp_path / "all")[k], every[k]) for k in every)

    save_checkpoint(tmp_path / "other", models[200], {"model": {"d": 8}})
    for argv, message in [
        (["average", "--out", str(tmp_path / "x")], "not both or neither"),
        (["average", str(run / "step-200"), "--last", "1", "--out", str(tmp_path / "x")], "--last needs --run"),
        (["average", "--run", str(run), "--last", "0", "--out", str(tmp_path / "x")], "at least 1"),
        (["average", "--run", str(tmp_path), "--out", str(tmp_path / "x")], "no step-N checkpoints"),
        (["average", str(run / "step-200"), "--out", str(run / "step-200")], "one of the checkpoints"),
        (["average", str(run / "step-200"), str(tmp_path / "other"), "--out", str(tmp_path / "x")],
         "model config differs"),
    ]:
        assert main(argv) == 2
        assert message in capsys.readouterr().err
    assert (run / "step-200" / "model.safetensors").is_file()  # nothing overwritten
    assert not (tmp_path / "x").exists()


def _tok_file(tmp_path: Path) -> Path:
    file = tmp_path / "tok.json"
    file.write_text("{}")
    return file


def test_keep_last_prunes_by_natural_order(tmp_path: Path) -> None:
    m = Tiny()
    for step in (900, 1000, 50, 2000):
        save_checkpoint(tmp_path / f"step_{step}", m, {"step": step})
    shutil.copytree(tmp_path / "step_50", tmp_path / "step_10.old")  # crash leftover: only .old
    (tmp_path / "notes.txt").write_text("x")
    removed = keep_last(tmp_path, "step_*", 2)
    assert sorted(p.name for p in removed) == ["step_10.old", "step_50", "step_900"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "step_1000", "step_2000"]
    assert keep_last(tmp_path, "step_*", 5) == []


def test_rng_capture_restore_reproduces_all_generators(tmp_path: Path) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    random.gauss(0, 1)  # leaves a cached gaussian in Python's state
    np.random.standard_normal()
    # Round trip through a checkpoint's safe loader, as a resume does.
    ck = save_checkpoint(tmp_path / "ck", Tiny(), {}, train_state={"step": 0})
    state = load_training_state(ck)
    assert state is not None
    expected = (torch.rand(4), random.random(), random.gauss(0, 1), np.random.rand(3), np.random.randn())
    restore_rng(state["rng"])
    got = (torch.rand(4), random.random(), random.gauss(0, 1), np.random.rand(3), np.random.randn())
    assert torch.equal(expected[0], got[0])
    assert expected[1:3] == got[1:3]
    assert np.array_equal(expected[3], got[3]) and expected[4] == got[4]
    direct = capture_rng()
    a = torch.randn(3)
    restore_rng(direct)
    assert torch.equal(a, torch.randn(3))
    json.dumps(state["step"])  # train_state values stay plain


@pytest.mark.parametrize("mode,avg,note", [("min", 4.40, True), ("min", 2.9, False), ("max", 4.8, True),
                                           ("max", 23.5, False)])
def test_an_averaged_checkpoint_worse_than_best_is_reported(mode: str, avg: float, note: bool,
                                                            capsys: pytest.CaptureFixture) -> None:
    """The trainer prints the averaged checkpoint's validation metrics and, where they are worse than best/'s (a
    short run averaging its first checkpoints), says so and what to use instead."""
    from types import SimpleNamespace

    from aiayn.train.checkpoint_policy import report_average as _report_average

    task = SimpleNamespace(select_metric="loss" if mode == "min" else "bleu", select_mode=mode)
    best = {"value": 3.01 if mode == "min" else 22.99, "step": 879}
    dirs = [Path("run/step-200"), Path("run/step-800")]
    _report_average(task, dirs, {task.select_metric: avg}, best)
    out = capsys.readouterr().out
    assert f"averaged 2 checkpoints (step-200 .. step-800): val_{task.select_metric}=" in out
    assert ("averaged/ is worse than best/" in out) == note
    if note:
        assert "reaches back to step-200" in out and "train.average_last" in out
    _report_average(task, dirs, {task.select_metric: avg}, None)  # no best/ (no evaluation): nothing to compare
    assert "worse" not in capsys.readouterr().out


# ------------------------------------------------------------------------- manifest, recovery, format


FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoint-format-1"


def test_the_format_1_fixture_loads_forever() -> None:
    """A checkpoint written by format 1 (tests/fixtures/make_checkpoint_fixture.py) loads: a format change must
    bring a migration that keeps this test passing, not a new fixture."""
    from aiayn.config import ModelConfig
    from aiayn.models.build import build_model
    from aiayn.pretrained import load_pretrained

    manifest = json.loads((FIXTURE / MANIFEST_FILE).read_text())
    assert manifest["format_version"] == 1
    assert sorted(manifest["files"]) == ["config.json", MODEL_FILE, "tokenizer.json", STATE_FILE]
    for name, entry in manifest["files"].items():  # the manifest itself is in today's layout
        data = (FIXTURE / name).read_bytes()
        assert len(data) == entry["size"] and hashlib.sha256(data).hexdigest() == entry["sha256"], name
    meta = load_config(FIXTURE)
    model = build_model(ModelConfig.from_dict(meta["model"]), init=False)
    load_model_state(FIXTURE, model)
    total = sum(float(t.double().sum()) for t in model.state_dict().values() if t.is_floating_point())
    state = load_training_state(FIXTURE)
    assert state is not None and state["format_version"] == 1 and state["step"] == 1
    assert state["position"] == {"epoch": 0, "batch": 1}
    assert abs(total - state["weight_sum"]) < 1e-6 * max(1.0, abs(total))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    optimizer.load_state_dict(state["optimizer"])
    scheduler = build_scheduler(optimizer, "warmup_cosine", warmup=2, total=10)
    scheduler.load_state_dict(state["scheduler"])
    assert scheduler.last_epoch == 1
    restore_rng(state["rng"])
    loaded = load_pretrained(FIXTURE)
    text = "to be"
    assert loaded.tokenizers["text"].decode(loaded.tokenizers["text"].encode(text)) == text


def test_the_manifest_lists_every_other_file(tmp_path: Path) -> None:
    tok = tmp_path / "tok.json"
    tok.write_text("{}")
    ck = save_checkpoint(tmp_path / "ck", Tiny(), {"a": 1}, train_state={"step": 1}, tokenizer_writer=[tok])
    manifest = json.loads((ck / MANIFEST_FILE).read_text())
    assert manifest["format_version"] == 1
    assert sorted(manifest["files"]) == sorted(p.name for p in ck.iterdir() if p.name != MANIFEST_FILE)
    for name, entry in manifest["files"].items():
        data = (ck / name).read_bytes()
        assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (ck / "notes.txt").write_text("added later")  # not listed: readers of other files do not mind
    assert load_config(ck) == {"a": 1}
    bare = save_checkpoint(tmp_path / "bare", Tiny(), {})
    assert load_training_state(bare) is None
    shutil.copy(ck / STATE_FILE, bare / STATE_FILE)  # a training state slipped into a checkpoint saved without one
    with pytest.raises(AiaynError, match=f"{STATE_FILE}: not part of this checkpoint"):
        load_training_state(bare)


def test_a_checkpoint_from_before_manifests_still_loads(tmp_path: Path) -> None:
    m, opt, _ = _trained(0)
    ck = save_checkpoint(tmp_path / "ck", m, {"v": 0}, optimizer=opt)
    (ck / MANIFEST_FILE).unlink()
    assert checkpoint_dir(ck) == ck
    assert load_config(ck) == {"v": 0} and load_training_state(ck) is not None
    m2 = Tiny()
    load_model_state(ck, m2)
    assert torch.equal(m2.ff.weight, m.ff.weight)
    save_checkpoint(ck, m2, {"v": 1})  # and is replaced by a save as before
    assert load_config(ck) == {"v": 1} and (ck / MANIFEST_FILE).is_file()


def test_every_reader_finds_the_old_copy_of_a_save_cut_between_its_renames(tmp_path: Path) -> None:
    from aiayn.pretrained import load_pretrained
    from aiayn.tokenize import load_tokenizer

    fixture = tmp_path / "run" / "last"
    shutil.copytree(FIXTURE, fixture)
    fixture.rename(fixture.with_name("last.old"))  # a kill after `last -> last.old`, before `tmp -> last`
    assert checkpoint_dir(fixture) == fixture.with_name("last.old")
    assert checkpoint_file(fixture, "tokenizer.json") == fixture.with_name("last.old") / "tokenizer.json"
    assert load_tokenizer(fixture / "tokenizer.json").vocab_size > 5  # a path built by hand
    assert load_pretrained(fixture).tokenizers["text"].vocab_size > 5
    assert load_training_state(fixture)["step"] == 1
    assert recover_checkpoint(fixture) == fixture and fixture.is_dir()
    assert not fixture.with_name("last.old").exists() and load_config(fixture)["task"] == "lm"


def test_an_incomplete_checkpoint_gives_way_to_a_complete_old_one(tmp_path: Path) -> None:
    m0, _, _ = _trained(0)
    target = save_checkpoint(tmp_path / "last", m0, {"v": 0})
    old = target.with_name("last.old")
    shutil.copytree(target, old)
    (target / MODEL_FILE).write_bytes(b"short")  # not the size the manifest says
    assert checkpoint_dir(target) == old and recovered_file(target / CONFIG_FILE) == old / CONFIG_FILE
    assert torch.equal(read_state_dict(target)["ff.weight"], m0.ff.weight)
    m1, _, _ = _trained(1)
    save_checkpoint(target, m1, {"v": 1})  # keeps the good copy until the new one is in place
    assert load_config(target) == {"v": 1} and sorted(p.name for p in tmp_path.iterdir()) == ["last"]
    assert recovered_file(tmp_path / "elsewhere" / "x.json") == tmp_path / "elsewhere" / "x.json"


def test_leftover_old_copies_never_block_a_save_but_a_users_folder_does(tmp_path: Path) -> None:
    m = Tiny()
    target = save_checkpoint(tmp_path / "last", m, {"v": 0}, tokenizer_writer=[_tok_file(tmp_path)])
    old = target.with_name("last.old")
    shutil.copytree(target, old)  # a stale .old beside a complete checkpoint
    save_checkpoint(target, m, {"v": 1}, tokenizer_writer=[_tok_file(tmp_path)])
    assert not old.exists()
    old.mkdir()  # a .old half deleted by an older version: only the tokenizer file is left
    (old / "tok.json").write_text("{}")
    save_checkpoint(target, m, {"v": 2}, tokenizer_writer=[_tok_file(tmp_path)])
    assert not old.exists() and load_config(target) == {"v": 2}
    old.mkdir()
    (old / "thesis.tex").write_text("keep me")
    with pytest.raises(AiaynError, match=r"last.old: exists and is not a checkpoint; refusing to overwrite it"):
        save_checkpoint(target, m, {"v": 3}, tokenizer_writer=[_tok_file(tmp_path)])
    assert (old / "thesis.tex").read_text() == "keep me" and load_config(target) == {"v": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last", "last.old", "tok.json"]


def test_periodic_and_keep_last_see_through_interrupted_saves(tmp_path: Path) -> None:
    from aiayn.checkpoint import periodic_checkpoints

    m = Tiny()
    for step in (100, 200, 300):
        save_checkpoint(tmp_path / f"step-{step}", m, {"step": step})
    (tmp_path / "step-300").rename(tmp_path / "step-300.old")  # cut between its renames
    (tmp_path / ".step-400.tmp-host-1-0123abcd").mkdir()  # another run's save in progress
    assert [p.name for p in periodic_checkpoints(tmp_path)] == ["step-100", "step-200", "step-300"]
    assert load_config(periodic_checkpoints(tmp_path)[-1]) == {"step": 300}
    assert [p.name for p in keep_last(tmp_path, "step-*", 1)] == ["step-100", "step-200"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".step-400.tmp-host-1-0123abcd", "step-300.old"]
