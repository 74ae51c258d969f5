"""How many threads torch uses: the cores this process may run on, less those other processes keep busy, and one
thread for work too small to share.

Why: torch's intra-op pool splits each kernel among its threads and waits for the slowest. A thread that shares
its core with another busy process gets half of that core at best, so every kernel waits on it, and the whole pool
runs slower than one thread would (measured: docs/performance.md, ``bench/contention.py``). A thread per *free* core
avoids that, and a small step gains little from a second thread anyway.

The rule (:func:`choose_threads`):

- ``cores``: the CPUs in this process's affinity mask (``os.sched_getaffinity``), at most the cgroup's CPU quota
  (containers), at most torch's own default (physical cores);
- ``busy``: other processes' CPU use, in cores, over a window: the busy time of those CPUs in ``/proc/stat``
  (hypervisor steal included) less this process's own CPU time (``time.process_time``, every thread). A window's
  average, not an instant's run queue, so a short burst does not count and our own threads never do;
- a core counts as taken once others use more than a quarter of it (``ceil(busy - 0.25)``): a thread on a core
  that is even half busy makes every kernel wait for it;
- ``threads = max(1, cores - taken)``, and 1 when a training step is below :data:`SMALL_STEP_FLOPS`.

An explicit choice always wins and is never changed: ``aiayn --threads N`` (:func:`set_explicit`),
``OMP_NUM_THREADS`` in the environment, ``train.threads`` in a recipe. The ``aiayn`` command applies the rule once
before its command runs (:func:`apply_at_start`, a 0.2 s window) and the trainer then re-checks it every
:data:`RECHECK_SECONDS` during a run (:class:`ThreadGovernor`, reading the counters since its last check: no
waiting). A Python program that calls the trainer without choosing its threads gets the same re-checks for the
run (:func:`rule_for_this_run`), and its thread count back afterwards; it may call :func:`apply_at_start` once at
start-up to have the rule for everything else it does. Where ``/proc/stat`` cannot be read (macOS, Windows) nothing
is measured and torch's default stays.
Imports only torch and the standard library.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

#: a training step below this many FLOPs (forward + backward, about 6 x parameters x target tokens) runs on one
#: thread: such steps are many small kernels, and a second thread's hand-offs cost about what it saves. On 2 idle
#: cores the demo's model gained 13% from a second thread at 1e9 FLOPs a step, 54% at 4e9 and 68% at 1.5e10
SMALL_STEP_FLOPS = 1e9
#: a core counts as taken by other processes once they use more than this much of it
BUSY_TOLERANCE = 0.25
#: seconds between re-checks during training
RECHECK_SECONDS = 10.0
#: the shortest window worth a decision (``/proc/stat`` counts in 10 ms ticks)
MIN_WINDOW_SECONDS = 0.1
START_WINDOW_SECONDS = 0.2

_explicit: int | None = None  # threads given by --threads
_adaptive = False  # whether this process chose its threads by the rule (apply_at_start), so training re-checks it
_torch_default: int | None = torch.get_num_threads()  # torch's thread count when this module was imported
_said = ""  # the last notice printed, so that the same one is not printed twice
_pending: tuple[str, int, Callable[[str], None]] | None = None  # apply_at_start's notice, until announce_threads


# ---------------------------------------------------------------------------------------------- reading the machine
@dataclass(frozen=True)
class CpuSample:
    """Counters at one moment: the busy and total ticks of our CPUs (``/proc/stat``), how many CPUs those are, our
    own CPU seconds, the time."""

    busy_ticks: int
    total_ticks: int
    n_cpus: int
    own_cpu_s: float
    wall_s: float


def parse_proc_stat(text: str, cpus: set[int] | None = None) -> tuple[int, int, int] | None:
    """(busy ticks, total ticks, CPUs) summed over the per-CPU lines of ``/proc/stat`` text for ``cpus`` (None: all
    of them); busy is everything but idle and iowait (steal included). None when no such line is found."""
    busy = total = found = 0
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or not name[3:].isdigit():
            continue
        if cpus is not None and int(name[3:]) not in cpus:
            continue
        fields = [int(x) for x in rest.split()]
        # user nice system idle iowait irq softirq steal [guest guest_nice, already inside user and nice]
        ticks = sum(fields[:8])
        busy += ticks - fields[3] - (fields[4] if len(fields) > 4 else 0)
        total += ticks
        found += 1
    return (busy, total, found) if found else None


def _read_proc_stat() -> str | None:
    try:
        with open("/proc/stat") as f:
            return f.read()
    except OSError:
        return None


def sample(read_stat: Callable[[], str | None] = _read_proc_stat, cpus: set[int] | None = None,
           own_cpu: Callable[[], float] = time.process_time,
           clock: Callable[[], float] = time.monotonic) -> CpuSample | None:
    """The counters now, or None where ``/proc/stat`` cannot be read or parsed (the arguments are for tests)."""
    text = read_stat()
    ticks = None if text is None else parse_proc_stat(text, _affinity() if cpus is None else cpus)
    if ticks is None:
        return None
    return CpuSample(*ticks, own_cpu(), clock())


def others_busy(before: CpuSample, after: CpuSample) -> float | None:
    """Cores other processes kept busy between two samples: our CPUs' busy share times their number, less our
    own CPU time over the wall time; None when the window is too short to tell."""
    wall, total = after.wall_s - before.wall_s, after.total_ticks - before.total_ticks
    if wall < MIN_WINDOW_SECONDS or total <= 0:
        return None
    busy_cores = after.n_cpus * (after.busy_ticks - before.busy_ticks) / total
    own_cores = (after.own_cpu_s - before.own_cpu_s) / wall
    return max(0.0, busy_cores - own_cores)


def _affinity() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def _cgroup_cpu_limit() -> float | None:
    """The cgroup's CPU quota in cores (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``), or None when unlimited/unknown."""
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") as f:
            quota_us = int(f.read())
        with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as f:
            period_us = int(f.read())
        return None if quota_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


def usable_cores() -> int:
    """CPUs this process may run on: its affinity mask, at most the cgroup quota (rounded up), at most torch's own
    default thread count (physical cores)."""
    n = len(_affinity())
    limit = _cgroup_cpu_limit()
    if limit is not None:
        n = min(n, max(1, math.ceil(limit)))
    return max(1, min(n, torch_default_threads()))


def torch_default_threads() -> int:
    """torch's thread count as it was before this module first changed it."""
    global _torch_default
    if _torch_default is None:
        _torch_default = torch.get_num_threads()
    return _torch_default


# ---------------------------------------------------------------------------------------------- the rule
@dataclass(frozen=True)
class Decision:
    """What :func:`choose_threads` picked and why."""

    threads: int
    cores: int
    taken: int  # cores left to other processes
    busy: float | None  # their measured use, in cores (None: not measured)
    small: bool  # the work is below SMALL_STEP_FLOPS

    def message(self) -> str:
        """One line saying why fewer threads than cores ("" when all cores are used)."""
        if self.threads >= self.cores:
            return ""
        why = []
        if self.taken:
            why.append(f"{self.taken} busy with other processes")
        if self.small:
            why.append("the work is too small to share")
        return f"using {self.threads} of {self.cores} cores: {', '.join(why)} (--threads N to choose)"


def choose_threads(cores: int, busy: float | None, step_flops: float | None = None,
                   cpus: int | None = None) -> Decision:
    """The rule of the module docstring.

    Args:
        cores: usable cores (:func:`usable_cores`).
        busy: cores other processes kept busy (:func:`others_busy`); None when not measured.
        step_flops: FLOPs of one unit of work (a training step), or None when unknown.
        cpus: the CPUs ``busy`` was measured over (the affinity mask; default ``cores``). More than ``cores`` under
            a cgroup quota or hyperthreading: others' use then takes cores from us only where it leaves fewer free.
    """
    taken = 0 if busy is None else max(0, math.ceil(busy - BUSY_TOLERANCE))
    free = max(1, min(cores, (cores if cpus is None else cpus) - taken))
    small = step_flops is not None and step_flops < SMALL_STEP_FLOPS and cores > 1
    return Decision(1 if small else free, cores, cores - free, busy, small)


# ---------------------------------------------------------------------------------------------- explicit choices
def set_explicit(threads: int) -> None:
    """Use ``threads`` threads from now on and never change them (``aiayn --threads N``); processes started from
    here get ``OMP_NUM_THREADS=N`` (the ranks of ``aiayn train --nproc`` share them out as they share the cores)."""
    global _explicit
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    torch_default_threads()
    _explicit = threads
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


def threads_option() -> int | None:
    """The thread count given by :func:`set_explicit` (``aiayn --threads N``) in this process, or None. It wins
    over a recipe's ``train.threads``."""
    return _explicit


def explicit_threads(environ: dict[str, str] | None = None) -> int | None:
    """The thread count the user chose (``--threads``, else a valid ``OMP_NUM_THREADS``), or None."""
    if _explicit is not None:
        return _explicit
    value = (os.environ if environ is None else environ).get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def apply_at_start(start: CpuSample | None = None, *, say: Callable[[str], None] = _say,
                   read_stat: Callable[[], str | None] = _read_proc_stat) -> Decision | None:
    """Set torch's threads for a command about to run (no work size known yet): measure others' use over the
    window since ``start`` (a :func:`sample` taken earlier, e.g. when the process began; waiting out the rest of
    :data:`START_WINDOW_SECONDS`), decide and apply; :func:`announce_threads` later says so when fewer threads than
    cores. Nothing when an explicit choice exists or ``/proc/stat`` is unreadable."""
    global _adaptive
    if explicit_threads() is not None:
        return None
    _adaptive = True
    cores = usable_cores()
    if cores == 1:
        torch.set_num_threads(1)
        return None
    start = start or sample(read_stat)
    if start is None:
        return None
    time.sleep(max(0.0, START_WINDOW_SECONDS - (time.monotonic() - start.wall_s)))
    end = sample(read_stat)
    busy = None if end is None else others_busy(start, end)
    decision = choose_threads(cores, busy, cpus=None if end is None else end.n_cpus)
    torch.set_num_threads(decision.threads)
    global _pending
    _pending = (decision.message(), cores, say)
    return decision


@contextlib.contextmanager
def rule_for_this_run(recipe_threads: int | None) -> Iterator[None]:
    """The rule for one training run of a Python program that chose no thread count (no ``--threads``,
    ``OMP_NUM_THREADS``, ``train.threads``, nor a ``torch.set_num_threads`` of its own): the run's
    :class:`ThreadGovernor` applies it after the first step, and torch's count comes back when the run ends. A
    no-op under the ``aiayn`` command, which chose at start-up (:func:`apply_at_start`)."""
    global _adaptive
    if _adaptive or recipe_threads or explicit_threads() is not None \
            or torch.get_num_threads() != torch_default_threads():
        yield
        return
    before, _adaptive = torch.get_num_threads(), True
    try:
        yield
    finally:
        _adaptive = False
        torch.set_num_threads(before)


def announce_threads() -> None:
    """Say the choice :func:`apply_at_start` made, once, when the command begins its work: so nothing is said
    before an error in the command's arguments, nor after the work chose its own threads (``train.threads``;
    call :func:`forget_start_choice` then)."""
    global _pending
    if _pending is not None and _adaptive and explicit_threads() is None:
        _announce(*_pending)
    _pending = None


def forget_start_choice() -> None:
    """The work set its own thread count: the start-up choice is never said."""
    global _pending
    _pending = None


def _announce(message: str, cores: int, say: Callable[[str], None]) -> None:
    """Say ``message`` unless it was the last thing said; an empty one after a reduction says all cores are back."""
    global _said
    if message != _said and (message or _said):
        say(message or f"using all {cores} cores again: other processes left them")
    _said = message


# ---------------------------------------------------------------------------------------------- during training
class ThreadGovernor:
    """Re-applies the rule during a training run: after the first step (the step's size is known then) and every
    ``every_s`` seconds after, from the counters since the last check. Costs one clock read per step in between.

    Args:
        params: the model, or its parameter count (a step's FLOPs are about 6 x parameters x target tokens).
        enabled: False leaves the threads alone (a GPU, several ranks on one machine, ``train.threads``). It is also
            off unless the process chose its threads by the rule (:func:`apply_at_start`: the ``aiayn`` command
            does; a Python program calls it once at start-up if it wants this), and under an explicit choice.
        say: where the one-line notice goes when the choice changes and is below the cores.
    """

    def __init__(self, params: int | torch.nn.Module, *, enabled: bool = True, every_s: float = RECHECK_SECONDS,
                 say: Callable[[str], None] = _say, read_stat: Callable[[], str | None] = _read_proc_stat,
                 clock: Callable[[], float] = time.monotonic,
                 own_cpu: Callable[[], float] = time.process_time) -> None:
        if isinstance(params, torch.nn.Module):  # distinct parameters (tied ones once)
            params = sum(p.numel() for p in params.parameters())
        self.params, self.every_s, self.say, self.clock = params, every_s, say, clock
        self._sample = lambda: sample(read_stat, own_cpu=own_cpu, clock=clock)
        self.enabled = enabled and _adaptive and explicit_threads() is None
        self.cores = usable_cores() if self.enabled else 1
        self.enabled = self.enabled and self.cores > 1
        self.last = self._sample() if self.enabled else None
        self.enabled = self.enabled and self.last is not None
        self.next_check = clock()  # the first check comes after the first step
        self.decisions: list[Decision] = []

    def after_step(self, target_tokens: int) -> Decision | None:
        """Call after each optimizer step with its target tokens; re-decides when a check is due."""
        if not self.enabled or self.clock() < self.next_check:
            return None
        now = self._sample()
        busy = None if now is None else others_busy(self.last, now)
        flops = 6.0 * self.params * target_tokens
        if busy is None and flops >= SMALL_STEP_FLOPS:  # too short a window yet: try again at the next step
            return None
        if busy is not None:  # a small step runs on one thread whatever others do: no need to wait for a window
            self.last = now
        self.next_check = self.clock() + self.every_s
        decision = choose_threads(self.cores, busy, flops, None if now is None else now.n_cpus)
        self.decisions.append(decision)
        if decision.threads != torch.get_num_threads():
            torch.set_num_threads(decision.threads)
        _announce(decision.message(), self.cores, self.say)
        return decision
