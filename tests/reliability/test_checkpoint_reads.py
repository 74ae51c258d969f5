"""Reading a checkpoint while training saves it again and again: every read gets one whole save.

A writer process saves ``last/`` of a tiny language model in a loop with the project's own
:func:`~aiayn.checkpoint.save_checkpoint` (a new version each time: every weight, the config's ``version`` and
the training state's ``step`` equal it), and this process reads it 100 times through the public loading paths
(:func:`aiayn.pretrained.load_pretrained`, which ``aiayn generate`` uses, and ``read_state_dict`` + ``load_config`` +
``load_training_state``). Every read must succeed and hold one version in all its files: never "checksum mismatch",
never advice to delete ``manifest.json``. A file edited while no writer runs is still reported as corrupt, and a
checkpoint that keeps moving while it is being pinned is said to be rewritten while read, naming the path.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from aiayn.checkpoint import load_config, load_training_state, read_state_dict, save_checkpoint
from aiayn.checkpoint.layout import CheckpointRead
from aiayn.errors import AiaynError
from aiayn.pretrained import load_pretrained

READS = 100
COUNTS: Counter = Counter()

WRITER = r"""
import sys, time
from pathlib import Path
import torch
torch.set_num_threads(1)
from aiayn import ModelConfig, build_model
from aiayn.tokenize import CharTokenizer
from aiayn.checkpoint import save_checkpoint

target, stop = Path(sys.argv[1]), Path(sys.argv[2])
tok = CharTokenizer.train(["abcdefgh ijk"])
config = ModelConfig(vocab_size=tok.vocab_size, d_model=8, n_heads=2, n_layers=1, d_ff=16, max_len=16, dropout=0.0,
                     arch="decoder", position="learned", tie_embeddings=True)
model = build_model(config)
version = 0
while not stop.exists():
    version += 1
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float(version))
    meta = {"task": "lm", "model": config.to_dict(), "tokenizers": {"text": "tokenizer.json"}, "block_size": 16,
            "version": version}
    save_checkpoint(target, model, meta, train_state={"step": version},
                    tokenizer_writer=lambda d: tok.save(d / "tokenizer.json"))
    print(version, flush=True)
"""


def _start_writer(target: Path, stop: Path) -> subprocess.Popen:
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(target), str(stop)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (target / "manifest.json").exists():  # the first save is in place
        assert writer.poll() is None, writer.stderr.read()
        assert time.monotonic() < deadline, "the writer saved nothing within 60 s"
        time.sleep(0.01)
    return writer


def _stop(writer: subprocess.Popen, stop: Path) -> int:
    stop.touch()
    out, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err
    return int(out.split()[-1])


class MixedRead(Exception):
    """One read returned the files of several saves."""


def _one_version(*values: torch.Tensor | int) -> int:
    """The version all ``values`` hold (tensors: every element), or :class:`MixedRead`."""
    seen = {int(v) if isinstance(v, int) else int(v.flatten()[0]) for v in values}
    seen |= {int(x) for v in values if isinstance(v, torch.Tensor) for x in v.unique()}
    if len(seen) != 1:
        raise MixedRead(f"one read mixed the files of saves {sorted(seen)}")
    return seen.pop()


def _read_pretrained(target: Path) -> int:
    loaded = load_pretrained(target, accel="none")
    assert loaded.tokenizers["text"].vocab_size == loaded.config.vocab_size
    return _one_version(loaded.meta["version"], *loaded.model.state_dict().values())


def _read_parts(target: Path) -> int:
    with CheckpointRead(target) as ck:  # one pinned read of three files
        config, weights, state = load_config(ck), read_state_dict(ck), load_training_state(ck)
    return _one_version(config["version"], state["step"], *weights.values())


@pytest.mark.parametrize("read", [_read_pretrained, _read_parts], ids=["load_pretrained", "read_state_dict+config"])
def test_every_read_racing_a_save_every_step_gets_one_whole_save(tmp_path: Path, read,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    target, stop = tmp_path / "runs" / "x" / "last", tmp_path / "stop"
    pins = Counter()
    pin = CheckpointRead._pin

    def counted(self: CheckpointRead) -> None:
        pins["tries"] += 1
        pin(self)
    monkeypatch.setattr(CheckpointRead, "_pin", counted)
    writer = _start_writer(target, stop)
    failures: list[str] = []  # an error, or files of several saves in one read
    versions = []
    try:
        for _ in range(READS):
            try:
                versions.append(read(target))
            except (AiaynError, MixedRead) as e:
                failures.append(f"{type(e).__name__}: {e}")
    finally:
        saves = _stop(writer, stop)
    COUNTS["reads racing a save"] += READS
    COUNTS["reads that got one whole save"] += len(versions)
    COUNTS["saves during the reads"] += saves
    COUNTS["pins tried again (the directory moved while pinned)"] += pins["tries"] - READS
    kinds = Counter(f.split(":")[0] for f in failures)
    assert not failures, (f"{len(failures)} of {READS} reads failed while {saves} saves ran ({dict(kinds)}); "
                          f"first: {failures[0]}")
    assert len(set(versions)) > 1, "the writer never replaced the checkpoint during the reads: no race was tried"


def _save_once(target: Path) -> None:
    stop = target.parent / "stop"
    stop.touch()
    subprocess.run([sys.executable, "-c", WRITER.replace("while not stop.exists():", "for _ in range(1):"),
                    str(target), str(stop)], check=True, capture_output=True)


def test_a_file_edited_while_no_save_runs_is_still_corrupt(tmp_path: Path) -> None:
    target = tmp_path / "last"
    _save_once(target)
    config = target / "config.json"
    config.write_text(config.read_text().replace('"version": 1', '"version": 7'))
    with pytest.raises(AiaynError, match="checksum mismatch: the file is corrupt or was edited"):
        load_pretrained(target, accel="none")


def _save_in_process(target: Path, version: int) -> None:
    save_checkpoint(target, {"w": torch.full((4, 4), float(version))}, {"version": version},
                    train_state={"step": version}, tokenizer_writer=lambda d: (d / "tokenizer.json").write_text("{}"))


def _parts(ck: CheckpointRead) -> int:
    return _one_version(load_config(ck)["version"], load_training_state(ck)["step"], *read_state_dict(ck).values())


def test_a_pinned_checkpoint_reads_one_save_after_two_more_replaced_and_deleted_it(tmp_path: Path) -> None:
    target = tmp_path / "last"
    _save_in_process(target, 1)
    with CheckpointRead(target) as ck:
        _save_in_process(target, 2)
        _save_in_process(target, 3)  # save 1's folder is gone from the disk now
        assert not (tmp_path / "last.old").exists() and load_config(target)["version"] == 3
        assert _parts(ck) == 1
    COUNTS["reads pinned before two saves"] += 1
    COUNTS["reads that got one whole save"] += 1


def test_a_save_that_commits_while_the_checkpoint_is_pinned_makes_the_read_pin_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "last"
    _save_in_process(target, 1)
    pin, tries = CheckpointRead._pin, []

    def pin_during_a_save(self: CheckpointRead) -> None:
        tries.append(self.directory)
        pin(self)
        if len(tries) == 1:
            _save_in_process(target, 2)  # the directory just pinned moves away: last -> last.old -> trash
    monkeypatch.setattr(CheckpointRead, "_pin", pin_during_a_save)
    with CheckpointRead(target) as ck:
        assert _parts(ck) == 2
    assert tries == [target, target]
    COUNTS["reads whose pin a save moved"] += 1
    COUNTS["reads that got one whole save"] += 1


def test_a_checkpoint_that_keeps_moving_while_pinned_is_rewritten_while_read(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A save that commits during every try of the pin (forced here): one message naming the path and the advice,
    never 'corrupt', never 'delete manifest.json'."""
    target = tmp_path / "last"
    _save_once(target)
    monkeypatch.setattr(CheckpointRead, "_in_place", lambda self: False)
    with pytest.raises(AiaynError) as e:
        load_pretrained(target, accel="none")
    said = str(e.value)
    assert said.startswith(f"{target}: the checkpoint was rewritten while being read")
    assert "retry" in said and "best/" in said and "step-N/" in said
    assert "corrupt" not in said and "delete" not in said
    COUNTS["reads of a checkpoint moving at every try"] += 1
    COUNTS["said rewritten while read"] += 1


def test_zz_counts(capsys: pytest.CaptureFixture) -> None:
    with capsys.disabled():
        print("\nchecking reads:", dict(COUNTS))
