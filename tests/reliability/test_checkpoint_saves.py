"""Checkpoint saves under faults: an exception at every file operation, SIGKILL at random moments, full
and read-only disks, corrupt files, diverged weights, and two runs wanting one folder.

The invariant every test holds: the last checkpoint a save returned (or a newer one) loads, with its
tokenizer, and the next save succeeds. Counters (tried / survived / data lost) are printed with ``-s``.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import safetensors.torch
import torch

from aiayn.checkpoint import (
    CONFIG_FILE,
    MANIFEST_FILE,
    MODEL_FILE,
    STATE_FILE,
    checkpoint_file,
    load_config,
    load_model_state,
    load_training_state,
    read_state_dict,
    save_checkpoint,
)
from aiayn.errors import AiaynError
from aiayn.tokenize import load_tokenizer, train_tokenizer
from aiayn.train.restore import recover_checkpoint
from aiayn.train.run_lock import LOCK_FILE, RunLock, owner

TOKENIZER = "tokenizer.json"


def _state(version: int) -> dict[str, torch.Tensor]:
    """A tiny state dict whose every value is ``version`` (so a load tells which save it came from)."""
    return {"w": torch.full((8, 8), float(version)), "b": torch.full((8,), float(version))}


@pytest.fixture
def tok_file(tmp_path: Path) -> Path:
    file = tmp_path / "src" / TOKENIZER
    file.parent.mkdir()
    train_tokenizer("char", ["abc def"]).save(file)
    return file


def _save(target: Path, version: int, tok_file: Path, *, by_callback: bool = False) -> Path:
    """Save version ``version``; the tokenizer is copied from ``tok_file``, or written by a callback."""
    writer = (lambda d: load_tokenizer(tok_file).save(d / TOKENIZER)) if by_callback else [tok_file]
    return save_checkpoint(target, _state(version), {"version": version}, train_state={"version": version},
                           tokenizer_writer=writer)


def _loaded_version(target: Path) -> int:
    """The version the checkpoint at ``target`` holds, checked consistent across all its files."""
    version = load_config(target)["version"]
    state = load_training_state(target)
    assert state is not None and state["version"] == version
    weights = read_state_dict(target)
    assert all(bool((t == version).all()) for t in weights.values())
    load_tokenizer(target / TOKENIZER)  # the path a user or an older caller builds by hand
    load_tokenizer(checkpoint_file(target, TOKENIZER))
    return version


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


# ------------------------------------------------------------------- an exception at every operation

_OPS: list[tuple[object, str]] = [
    (os, "mkdir"), (os, "open"), (os, "write"), (os, "fsync"), (os, "close"), (os, "rename"), (os, "replace"),
    (shutil, "rmtree"), (shutil, "copyfile"), (torch, "save"), (safetensors.torch, "save"),
]


@contextmanager
def _inject(fail_at: int, make: Callable[[str], BaseException], calls: list[str]) -> Iterator[None]:
    """Wrap the file operations of a save; the ``fail_at``-th call (0-based) raises ``make(name)``."""
    with pytest.MonkeyPatch.context() as mp:
        for module, name in _OPS:
            real = getattr(module, name)

            def wrapper(*args, _real=real, _name=name, **kwargs):
                calls.append(_name)
                if len(calls) - 1 == fail_at:
                    raise make(_name)
                return _real(*args, **kwargs)

            mp.setattr(module, name, wrapper)
        yield


def _io_error(name: str) -> BaseException:
    if name in ("save",):  # serializers: not a disk operation
        return RuntimeError(f"injected failure in {name}")
    return OSError(errno.EIO, f"injected failure in {name}")


@pytest.mark.parametrize("make", [_io_error, lambda name: KeyboardInterrupt()], ids=["error", "interrupt"])
def test_an_exception_at_every_file_operation_keeps_the_last_checkpoint(
        tmp_path: Path, tok_file: Path, make: Callable[[str], BaseException]) -> None:
    target = tmp_path / "run" / "last"
    _save(target, 0, tok_file)
    ops: list[str] = []
    with _inject(-1, make, ops):
        _save(target, 1, tok_file, by_callback=True)  # count the operations of one save
    version, tried, survived, lost = 1, Counter(), Counter(), 0
    for k in range(len(ops)):
        calls: list[str] = []
        returned = False
        try:
            with _inject(k, make, calls):
                _save(target, version + 1, tok_file, by_callback=True)
            returned = True
        except AiaynError as e:
            assert str(target) in str(e) and "input/output error" in str(e)
        except (RuntimeError, KeyboardInterrupt):
            pass
        op = calls[k] if k < len(calls) else "none"
        tried[op] += 1
        got = _loaded_version(target)
        lost += got < version + (1 if returned else 0)
        ok = got == version + 1 if returned else got in (version, version + 1)
        _save(target, got + 1, tok_file)  # the next save succeeds and leaves nothing behind
        ok = ok and _loaded_version(target) == got + 1 and sorted(os.listdir(target.parent)) == ["last"]
        survived[op] += ok
        version = got + 1
    print(f"\nexceptions ({make('x').__class__.__name__}) at each of {len(ops)} operations: tried "
          f"{dict(tried)}, survived {dict(survived)}, data lost {lost}")
    assert len(ops) >= 25 and set(tried) >= {"mkdir", "open", "write", "fsync", "rename", "replace", "rmtree", "save"}
    assert survived == tried and lost == 0


# ------------------------------------------------------------------------------ SIGKILL at random

_SAVER = r"""
import os, sys, time
import torch
torch.set_num_threads(1)
from aiayn.checkpoint import save_checkpoint

target, tok = sys.argv[1], sys.argv[2]
rename = os.rename


def slow_rename(src, dst):  # widens the moments between the renames, so that kills land there too
    rename(src, dst)
    time.sleep(0.005)


os.rename = slow_rename
for line in sys.stdin:  # one line per round: the first version to save
    version = int(line)
    pid = os.fork()
    if pid == 0:  # the saver: saves versions in a loop until it is killed
        try:
            while True:
                state = {"w": torch.full((8, 8), float(version)), "b": torch.full((8,), float(version))}
                save_checkpoint(target, state, {"version": version}, train_state={"version": version},
                                tokenizer_writer=[tok])
                os.write(1, f"saved {version}\n".encode())
                version += 1
        finally:
            os._exit(1)
    os.write(1, f"child {pid}\n".encode())
    os.waitpid(pid, 0)
    os.write(1, b"reaped\n")
"""


def test_sigkill_at_random_moments_never_loses_a_saved_checkpoint(tmp_path: Path, tok_file: Path) -> None:
    """A process forked from a ``python -c`` parent saves in a loop and is killed with SIGKILL after a random
    delay; after each kill the checkpoint and its tokenizer load, hold at least the last version the saver
    reported saved, and the next save (in this process) succeeds and clears the killed save's leftovers."""
    target = tmp_path / "run" / "last"
    _save(target, 0, tok_file)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", _SAVER, str(target), str(tok_file)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, bufsize=1, env=env)
    rng = random.Random(0)
    tried = survived = lost = 0
    seen: Counter = Counter()
    version = 1
    try:
        for _ in range(24):
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(f"{version}\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
            assert line.startswith("child "), line
            time.sleep(rng.uniform(0.0, 0.2))
            os.kill(int(line.split()[1]), signal.SIGKILL)
            reported = version - 1
            for line in iter(proc.stdout.readline, "reaped\n"):
                assert line.startswith("saved "), line
                reported = int(line.split()[1])
            tried += 1
            names = os.listdir(target.parent)
            seen["last missing" if "last" not in names else "last present"] += 1
            seen.update(kind for kind in ("last.old", ".tmp-", ".trash-") if any(kind in n for n in names))
            got = _loaded_version(target)
            lost += got < reported
            _save(target, got + 1, tok_file)
            if _loaded_version(target) == got + 1 and os.listdir(target.parent) == ["last"] and got >= reported:
                survived += 1
            version = got + 2
    finally:
        proc.kill()
        proc.wait()
    print(f"\nSIGKILL: tried {tried}, survived {survived}, data lost {lost}; states found {dict(seen)}")
    assert tried >= 20 and survived == tried and lost == 0


# ------------------------------------------------------------------------------------- OS errors


@pytest.mark.parametrize("code,words,op", [
    (errno.ENOSPC, "no space left on device", "write"),
    (errno.EROFS, "read-only file system", "mkdir"),
    (errno.EACCES, "permission denied", "open"),
    (errno.EDQUOT, "disk quota exceeded", "write"),
])
def test_os_errors_become_one_message_naming_path_and_cause(
        tmp_path: Path, tok_file: Path, monkeypatch: pytest.MonkeyPatch, code: int, words: str, op: str) -> None:
    target = tmp_path / "run" / "last"
    _save(target, 0, tok_file)
    real = getattr(os, op)

    def failing(*args, **kwargs):
        # stdout and stderr, and reading or deleting folders, still work
        if op == "mkdir" or (op == "write" and args[0] > 2) or (op == "open" and args[1] & os.O_CREAT):
            raise OSError(code, os.strerror(code), str(args[0]) if op != "write" else None)
        return real(*args, **kwargs)

    monkeypatch.setattr(os, op, failing)
    with pytest.raises(AiaynError) as info:
        _save(target, 1, tok_file)
    monkeypatch.undo()
    message = str(info.value)
    assert words in message and str(target) in message and "Traceback" not in message
    assert isinstance(info.value.__cause__, OSError)
    assert _loaded_version(target) == 0 and sorted(os.listdir(target.parent)) == ["last"]
    _save(target, 1, tok_file)
    assert _loaded_version(target) == 1


def test_a_disk_that_fills_up_mid_file(tmp_path: Path, tok_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A disk with 3000 bytes free: writes go through until then, partly, then ENOSPC (as a real one)."""
    target = tmp_path / "run" / "last"
    _save(target, 0, tok_file)
    free = [3000]
    real = os.write

    def write(fd: int, data) -> int:
        if fd <= 2:
            return real(fd, data)
        if free[0] <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = real(fd, bytes(data)[: free[0]])
        free[0] -= n
        return n

    monkeypatch.setattr(os, "write", write)
    with pytest.raises(AiaynError, match="no space left on device; cannot save the checkpoint .*last: free space"
                                         r".*\(a previous checkpoint there is unchanged and still loads\)"):
        _save(target, 1, tok_file)
    monkeypatch.undo()
    assert _loaded_version(target) == 0 and sorted(os.listdir(target.parent)) == ["last"]


def test_a_first_save_on_a_full_disk_says_there_was_no_checkpoint(tmp_path: Path, tok_file: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "run" / "last"
    real = os.write

    def write(fd: int, data) -> int:
        if fd <= 2:
            return real(fd, data)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", write)
    with pytest.raises(AiaynError, match=r"no space left on device.*\(no checkpoint was there before, and none is "
                                         r"left half-written\)") as info:
        _save(target, 0, tok_file)
    monkeypatch.undo()
    assert "unchanged" not in str(info.value) and not target.exists()


def test_out_dir_that_is_a_file(tmp_path: Path, tok_file: Path) -> None:
    blocker = tmp_path / "run"
    blocker.write_text("not a folder")
    with pytest.raises(AiaynError, match=f"{blocker}: is a file, not a folder; cannot save"):
        _save(blocker / "last", 0, tok_file)
    with pytest.raises(AiaynError, match=f"{blocker}: is a file, not a folder; cannot save"):
        _save(blocker / "deeper" / "last", 0, tok_file)
    with pytest.raises(AiaynError, match=f"{blocker}: is a file, not a folder"):
        _save(blocker, 0, tok_file)
    assert blocker.read_text() == "not a folder"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_real_unwritable_folder(tmp_path: Path, tok_file: Path) -> None:
    target = tmp_path / "run" / "last"
    _save(target, 0, tok_file)
    target.parent.chmod(0o555)
    try:
        with pytest.raises(AiaynError, match="permission denied"):
            _save(target, 1, tok_file)
    finally:
        target.parent.chmod(0o755)
    assert _loaded_version(target) == 0


def test_a_failing_rename_rolls_back(tmp_path: Path, tok_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rename of the new checkpoint into place fails after the old one was moved aside: it moves back."""
    target = tmp_path / "run" / "last"
    _save(target, 0, tok_file)
    real = os.rename

    def rename(src, dst) -> None:
        if ".tmp-" in str(src):
            raise OSError(errno.EXDEV, "Invalid cross-device link", str(src))
        real(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(AiaynError, match="Invalid cross-device link"):
        _save(target, 1, tok_file)
    monkeypatch.undo()
    assert sorted(os.listdir(target.parent)) == ["last"] and _loaded_version(target) == 0


# ---------------------------------------------------------------------------------- corrupt files


@pytest.mark.parametrize("name", [MODEL_FILE, STATE_FILE, CONFIG_FILE])
def test_flipped_bytes_are_a_checksum_error_naming_the_file(tmp_path: Path, tok_file: Path, name: str) -> None:
    target = _save(tmp_path / "last", 0, tok_file)
    data = bytearray((target / name).read_bytes())
    if name == CONFIG_FILE:
        data = data.replace(b'"version": 0', b'"version": 7')  # still valid JSON: an edit
    for i in range(len(data) // 2, len(data) // 2 + 64 if name != CONFIG_FILE else 0):
        data[i] ^= 0xFF
    (target / name).write_bytes(bytes(data))
    reader = {MODEL_FILE: read_state_dict, STATE_FILE: load_training_state, CONFIG_FILE: load_config}[name]
    with pytest.raises(AiaynError, match=f"{target / name}: checksum mismatch: the file is corrupt or was edited; "
                                         "restore it or use another checkpoint"):
        reader(target)


def test_a_truncated_file_is_reported_and_the_old_copy_is_not_used_silently(tmp_path: Path, tok_file: Path) -> None:
    target = _save(tmp_path / "last", 0, tok_file)
    with open(target / MODEL_FILE, "r+b") as f:
        f.truncate(100)
    with pytest.raises(AiaynError, match=f"{MODEL_FILE}: checksum mismatch"):
        read_state_dict(target)
    _save(target, 1, tok_file)  # a save over a broken checkpoint works
    assert _loaded_version(target) == 1


# ------------------------------------------------------------------------------- diverged weights


def test_nan_weights_are_refused_on_save_and_nothing_is_written(tmp_path: Path, tok_file: Path) -> None:
    target = _save(tmp_path / "run" / "last", 0, tok_file)
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    for bad in (float("nan"), float("inf")):
        state = _state(1)
        state["b"][3] = bad
        with pytest.raises(AiaynError, match=r"tensor b holds NaN/inf, the run diverged"):
            save_checkpoint(target, state, {"version": 1}, tokenizer_writer=[tok_file])
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert sorted(os.listdir(target.parent)) == ["last"]
    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    with pytest.raises(AiaynError, match="tensor weight holds NaN/inf"):
        save_checkpoint(tmp_path / "other", model, {})
    assert not (tmp_path / "other").exists()


def test_nan_weights_are_refused_on_load(tmp_path: Path, tok_file: Path) -> None:
    target = _save(tmp_path / "last", 0, tok_file)
    state = _state(0)
    state["w"][1, 1] = float("nan")
    safetensors.torch.save_file(state, str(target / MODEL_FILE))
    _rewrite_manifest(target)  # as a diverged run that wrote its NaN weights with a valid manifest
    model = torch.nn.Module()
    model.w, model.b = torch.nn.Parameter(torch.zeros(8, 8)), torch.nn.Parameter(torch.zeros(8))
    for load in (read_state_dict, lambda d: load_model_state(d, model)):
        with pytest.raises(AiaynError, match=f"{MODEL_FILE}: holds NaN/inf in tensor w; it was written by a "
                                             "diverged run, use an earlier checkpoint"):
            load(target)


def _rewrite_manifest(directory: Path) -> None:
    import hashlib

    manifest = json.loads((directory / MANIFEST_FILE).read_text())
    for name in manifest["files"]:
        data = (directory / name).read_bytes()
        manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (directory / MANIFEST_FILE).write_text(json.dumps(manifest))


# -------------------------------------------------------------------------------------- run lock


def test_a_second_run_is_refused_naming_the_owner(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with RunLock(run, command="aiayn train recipes/a.toml") as lock:
        assert lock.held and (run / LOCK_FILE).is_file()
        with pytest.raises(AiaynError) as info:
            RunLock(run, command="aiayn train recipes/b.toml").acquire()
        message = str(info.value)
        assert f"{run}: is in use by pid {os.getpid()} on host {socket.gethostname()} since " in message
        assert "(command: aiayn train recipes/a.toml); wait for it to finish, or choose another train.out_dir" \
            in message
        holder = owner(run)
        assert holder is not None and holder.alive and holder.is_this_process and holder.pid == os.getpid()
        with pytest.raises(AiaynError, match="already holds the lock"):
            lock.acquire()
    assert owner(run) is None and not (run / LOCK_FILE).exists()


def test_a_lock_of_another_live_process_is_refused_and_a_dead_ones_taken_over(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    other = subprocess.Popen(["sleep", "30"])
    try:
        _write_lock(run, other.pid, socket.gethostname(), started_unix=time.time())
        with pytest.raises(AiaynError, match=f"in use by pid {other.pid} on host"):
            RunLock(run).acquire()
    finally:
        other.kill()
        other.wait()
    notices: list[str] = []
    with RunLock(run, say=notices.append):
        assert owner(run).pid == os.getpid()
    assert len(notices) == 1 and f"took over the lock of pid {other.pid}" in notices[0]
    assert "no longer running" in notices[0]


def test_a_reused_pid_and_a_half_written_lock_are_stale(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    _write_lock(run, os.getppid(), socket.gethostname(), started_unix=1000.0)  # the pid runs, but started later
    notices: list[str] = []
    with RunLock(run, say=notices.append):
        pass
    (run / LOCK_FILE).write_text("")  # a run killed between creating the file and writing it
    old = time.time() - 60
    os.utime(run / LOCK_FILE, (old, old))
    with RunLock(run, say=notices.append):
        pass
    assert len(notices) == 2 and not (run / LOCK_FILE).exists()


def test_a_lock_from_another_host_is_never_taken_over(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    _write_lock(run, 1, "elsewhere.example", started_unix=1000.0)
    with pytest.raises(AiaynError, match=f"pid 1 on host elsewhere.example .*if no run is active on "
                                         f"elsewhere.example, delete {run / LOCK_FILE}"):
        RunLock(run).acquire()
    holder = owner(run)
    assert holder is not None and holder.alive is None and not holder.is_this_process


def test_the_lock_is_released_on_an_exception_and_never_removes_anothers(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with pytest.raises(ValueError):
        with RunLock(run):
            raise ValueError("the run failed")
    assert not (run / LOCK_FILE).exists()
    lock = RunLock(run).acquire()
    _write_lock(run, 1, "elsewhere.example", started_unix=1000.0)  # replaced behind its back
    lock.release()
    assert owner(run).host == "elsewhere.example"


def test_recovery_leaves_the_folder_of_a_live_run_alone(tmp_path: Path, tok_file: Path) -> None:
    target = _save(tmp_path / "run" / "last", 0, tok_file)
    target.rename(target.with_name("last.old"))  # as a save between its two renames
    other = subprocess.Popen(["sleep", "30"])
    try:
        _write_lock(target.parent, other.pid, socket.gethostname(), started_unix=time.time())
        assert recover_checkpoint(target) == target.with_name("last.old")  # read from, not renamed
        assert not target.exists()
    finally:
        other.kill()
        other.wait()
    notices: list[str] = []
    assert recover_checkpoint(target, say=notices.append) == target and _loaded_version(target) == 0
    assert notices and "restored from last.old" in notices[0]


def _write_lock(run: Path, pid: int, host: str, started_unix: float) -> None:
    data = {"pid": pid, "host": host, "started": "2024-01-01 00:00:00", "started_unix": started_unix,
            "command": "aiayn train x.toml", "token": f"t{pid}"}
    (run / LOCK_FILE).write_text(json.dumps(data))


def test_leftovers_of_a_dead_process_are_swept_those_of_a_live_one_kept(tmp_path: Path, tok_file: Path) -> None:
    target = _save(tmp_path / "run" / "last", 0, tok_file)
    host = socket.gethostname()
    live = subprocess.Popen(["sleep", "30"])
    dead = _dead_pid()
    try:
        from aiayn.files import HOST

        day_old = time.time() - 2 * 24 * 3600
        names = {
            f".last.tmp-{HOST}-{dead}-0123abcd": False,  # kept?
            f".last.trash-{HOST}-{dead}-0123abce": False,
            f".last.tmp-{dead}-deadbeef": False,  # a save before host names
            f".last.tmp-{HOST}-{live.pid}-0123abcf": True,  # another run, still writing
            ".last.tmp-elsewhere.example-5-0123abd0": True,  # another host, recent
            ".last.tmp-elsewhere.example-6-0123abd1": False,  # another host, two days old
            ".notes.tmp-folder": True,  # not ours at all
        }
        for name in names:
            (target.parent / name).mkdir()
            (target.parent / name / "x").write_text("x")
        os.utime(target.parent / ".last.tmp-elsewhere.example-6-0123abd1", (day_old, day_old))
        _save(target, 1, tok_file)
        left = set(os.listdir(target.parent)) - {"last"}
        assert left == {n for n, keep in names.items() if keep}, host
    finally:
        live.kill()
        live.wait()
