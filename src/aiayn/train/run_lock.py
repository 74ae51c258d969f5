"""One training run per output folder: the lock file ``<out_dir>/.lock``.

Two runs writing into one ``train.out_dir`` would overwrite each other's checkpoints and metrics. A run
takes the folder with :class:`RunLock` before it writes anything and gives it back when it ends, even
on an exception::

    with RunLock(out_dir):
        train(...)

The lock file is created atomically (``O_CREAT | O_EXCL``) and holds JSON: ``pid``, ``host``,
``started`` (local time), ``started_unix``, ``command`` and a random ``token``. A second run is refused
with an :class:`~aiayn.errors.AiaynError` that names the owner. A lock whose process is gone (same
host, pid no longer running, or running but started after the lock was written: a reused pid) is
stale: the next run takes it over and says so. A lock from another host cannot be checked and is
never taken over; the message says how to remove it. Readers ask :func:`owner`.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from aiayn.checkpoint.disk import describe_os_error, error_path
from aiayn.errors import AiaynError
from aiayn.files import parse_json

LOCK_FILE = ".lock"
_TAKEOVER = ".lock.takeover"  # held for the instant a stale lock is replaced
_GRACE_S = 5.0  # an empty or half-written lock younger than this is still being created
_HOST = socket.gethostname()
_HELD: set[str] = set()  # tokens of the locks this process holds


@dataclass(frozen=True)
class LockOwner:
    """Who holds (or held) a run folder: the content of its ``.lock`` file.

    ``alive`` is True or False for a lock of this host, None where it cannot be told (another host, or
    a lock file still being written).
    """

    path: Path
    pid: int
    host: str
    started: str
    started_unix: float
    command: str
    token: str
    alive: bool | None

    @property
    def is_this_process(self) -> bool:
        """Whether this very process holds the lock (through a :class:`RunLock` not yet released)."""
        return self.token in _HELD

    def describe(self) -> str:
        """``pid 1234 on host X since <time> (command ...)``."""
        if not self.host:
            return "a run that was starting (its lock file is empty or half written)"
        return f"pid {self.pid} on host {self.host} since {self.started} (command: {self.command or '?'})"


def _process_start(pid: int) -> float | None:
    """Unix time at which process ``pid`` started (Linux /proc), or None where it cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        ticks = int(stat[stat.rindex(")") + 2:].split()[19])  # field 22, counted after "pid (comm)"
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _pid_alive(pid: int, since: float) -> bool:
    """Whether ``pid`` runs on this host and is the process that started at ``since`` (not a reuse)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it exists, another user's
        pass
    start = _process_start(pid)
    # started after the lock was written: the pid was reused (a minute's slack for clock adjustments)
    return start is None or start <= since + 60.0


def _parse(path: Path, text: str, mtime: float) -> LockOwner:
    try:
        data = parse_json(text)
        pid, host = int(data["pid"]), str(data["host"])
        started_unix = float(data.get("started_unix", mtime))
        info = dict(started=str(data.get("started", "")), command=str(data.get("command", "")),
                    token=str(data.get("token", "")))
    except (ValueError, KeyError, TypeError):
        young = time.time() - mtime < _GRACE_S
        return LockOwner(path, 0, "", "", mtime, "", "", None if young else False)
    if host != _HOST:
        alive = None
    elif pid == os.getpid():
        alive = info["token"] in _HELD
    else:
        alive = _pid_alive(pid, started_unix)
    return LockOwner(path, pid, host, started_unix=started_unix, alive=alive, **info)


def _read(path: Path) -> tuple[LockOwner, str] | None:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        return None
    return _parse(path, text, mtime), text


def owner(out_dir: str | os.PathLike) -> LockOwner | None:
    """Who holds the run folder ``out_dir``, or None when it has no lock file.

    Args:
        out_dir: a run's ``train.out_dir``.

    Returns:
        The lock's content; check ``.alive`` (False: stale, the next run takes it over).
    """
    try:
        found = _read(Path(out_dir) / LOCK_FILE)
    except OSError:
        return None
    return found[0] if found else None


def _default_say(message: str) -> None:
    print(message, file=sys.stderr)


class RunLock:
    """Exclusive use of a run folder by this process, as ``<out_dir>/.lock`` (see the module docstring).

    Args:
        out_dir: the run's ``train.out_dir`` (created when missing).
        command: recorded in the lock for the message another run shows; default: this process's argv.
        say: receives a one-line notice when a stale lock is taken over (default: printed to stderr).
    """

    def __init__(self, out_dir: str | os.PathLike, *, command: str | None = None,
                 say: Callable[[str], None] | None = None) -> None:
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / LOCK_FILE
        self.command = command if command is not None else _argv()
        self.say = say or _default_say
        self.token = ""

    @property
    def held(self) -> bool:
        """Whether this object holds the lock now."""
        return self.token in _HELD

    def acquire(self) -> RunLock:
        """Take the folder.

        Raises:
            AiaynError: another live run holds it (the message names its pid, host, start time and
                command), this object already holds it, or the folder cannot be written (in words).
        """
        if self.held:
            raise AiaynError(f"{self.path}: this run already holds the lock; acquire it once")
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            for _ in range(200):
                if self._try_create():
                    return self
                found = _read(self.path)
                if found is None:
                    continue  # released meanwhile: try again
                holder, text = found
                if holder.alive is False:
                    self._take_over(holder, text)
                elif holder.host:  # alive, or on another host
                    raise AiaynError(_refusal(holder))
                else:
                    time.sleep(0.05)  # being written by a run that is starting
        except OSError as e:
            cause, fix = describe_os_error(e)
            raise AiaynError(f"{error_path(e, self.path)}: {cause}; cannot lock the run folder {self.out_dir}: "
                             f"{fix}") from e
        holder = owner(self.out_dir)
        raise AiaynError(_refusal(holder) if holder else f"{self.path}: cannot take the lock; try again")

    def _try_create(self) -> bool:
        token = uuid.uuid4().hex
        now = time.time()
        data = {"pid": os.getpid(), "host": _HOST, "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
                "started_unix": now, "command": self.command, "token": token}
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        try:
            os.write(fd, (json.dumps(data) + "\n").encode("utf-8"))
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            self.path.unlink(missing_ok=True)
            raise
        os.close(fd)
        self.token = token
        _HELD.add(token)
        return True

    def _take_over(self, stale: LockOwner, text: str) -> None:
        """Remove a stale lock, unless another run replaced it meanwhile (one taker at a time)."""
        guard = self.out_dir / _TAKEOVER
        try:
            fd = os.open(guard, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                if time.time() - guard.stat().st_mtime > 30.0:  # left by a run killed while taking over
                    guard.unlink(missing_ok=True)
            except FileNotFoundError:
                pass
            time.sleep(0.05)
            return
        try:
            found = _read(self.path)
            if found is not None and found[1] == text:
                self.path.unlink()
                self.say(f"{self.path}: took over the lock of {stale.describe()}, which is no longer running")
        finally:
            os.close(fd)
            guard.unlink(missing_ok=True)

    def release(self) -> None:
        """Give the folder back (only the lock this object wrote is removed; failures are reported, not
        raised, so that they never hide the error that ended a run)."""
        if not self.held:
            return
        _HELD.discard(self.token)
        try:
            found = _read(self.path)
            if found is not None and found[0].token == self.token:
                self.path.unlink()
        except OSError as e:
            self.say(f"{self.path}: could not remove the lock ({describe_os_error(e)[0]}); delete it by hand")
        self.token = ""

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def _argv() -> str:
    args = [Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python", *sys.argv[1:]]
    text = shlex.join(args)
    return text if len(text) <= 300 else text[:297] + "..."


def _refusal(holder: LockOwner) -> str:
    where = holder.path.parent
    message = (f"{where}: is in use by {holder.describe()}; wait for it to finish, or choose another "
               "train.out_dir")
    if holder.alive is None and holder.host:
        message += f" (if no run is active on {holder.host}, delete {holder.path})"
    return message


__all__ = ["LOCK_FILE", "LockOwner", "RunLock", "owner"]
