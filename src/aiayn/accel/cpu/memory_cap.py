"""Caps on the memory the CPU accelerator keeps for speed, so that keeping it never grows without bound.

Two things keep memory in an ``aiayn`` process on purpose, and without a cap each grew a tiny-recipe training to
gigabytes for a 2M-parameter model:

- **freed heap memory** (:func:`aiayn.accel.cpu.allocator.keep_freed_memory`): glibc's heap is never trimmed and large
  blocks come from it, so a step reuses the last step's memory instead of faulting fresh pages in. But a heap only
  reuses a free block where the request fits, and batches of varying shapes, evaluation's large logits and
  long-lived small objects between them fragment it: the free part grows run after run (to well over a gigabyte in
  a few hundred steps), resident though no step needs it. A watcher thread (:func:`start_trimming`) checks every
  :data:`CHECK_SECONDS` how much freed memory the process holds resident (resident anonymous memory less malloc's
  bytes in use, less what the last trim left) and, past the cap, hands the free pages back to the kernel
  (``malloc_trim``). The cap is the process's recent working set (malloc's bytes in use at their highest over the
  last :data:`WINDOW_CHECKS` checks, at least :data:`KEEP_FLOOR_BYTES`): every step's transient tensors fit in it,
  so a loop whose heap does not fragment never reaches it and keeps its speed, while an evaluation's large transient
  raises it only for a minute; fragmentation beyond a second working set is released, at most every
  :data:`MIN_TRIM_INTERVAL_SECONDS`, each time at the cost of the next steps' page faults.
- **oneDNN's caches of compiled matrix products**: each distinct (rows, in, out) shape of an fp32 product through
  oneDNN (:mod:`aiayn.accel.cpu.gemm`) JIT-compiles a kernel that oneDNN's primitive cache and PyTorch's ideep cache
  keep, 1024 of each by default, a few hundred kilobytes apiece; token-budget batches have a new row count almost
  every step, so both caches fill. :func:`cap_library_caches` lowers them to :data:`LIBRARY_CACHE_ENTRIES` (through
  ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` and ``LRU_CACHE_CAPACITY``, unless the environment sets them already), which
  still serves the shapes that recur within a few steps; a miss costs one compilation, about as long as the product.

Both are applied with :func:`aiayn.accel.cpu.allocator.keep_freed_memory`, i.e. where the ``aiayn`` command owns its
process.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field

#: entries of oneDNN's primitive cache and of PyTorch's ideep cache (each 1024 by default)
LIBRARY_CACHE_ENTRIES = 256
LIBRARY_CACHE_ENV = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
#: freed memory below this is always kept, whatever the working set
KEEP_FLOOR_BYTES = 256 << 20
#: seconds between checks of the freed memory kept
CHECK_SECONDS = 5.0
#: checks over which the working set (the cap) is the highest use seen: a minute
WINDOW_CHECKS = 12
#: seconds at least between two trims: each costs the next steps their page faults again, so a heap that fragments
#: fast is trimmed at this pace rather than at every check
MIN_TRIM_INTERVAL_SECONDS = 60.0

_watcher: threading.Thread | None = None


def cap_library_caches(entries: int = LIBRARY_CACHE_ENTRIES) -> None:
    """Cap oneDNN's and ideep's caches of compiled products at ``entries`` each, unless the environment already sets
    them. Takes effect where neither library has been used yet in this process (both read it once)."""
    for name in LIBRARY_CACHE_ENV:
        os.environ.setdefault(name, str(entries))


@dataclass
class TrimPolicy:
    """When to hand freed memory back: when the freed memory held resident exceeds the cap (see the module docstring).

    Attributes:
        floor: the smallest cap, in bytes.
        recent_in_use: malloc's bytes in use at the last ``WINDOW_CHECKS`` checks; their highest is the working set.
        baseline: resident anonymous bytes that are not malloc's live blocks right after the last trim (Python's own
            arenas, thread stacks, partly used pages): not freed memory, so not counted as kept.
    """

    floor: int = KEEP_FLOOR_BYTES
    recent_in_use: deque = field(default_factory=lambda: deque(maxlen=WINDOW_CHECKS))
    baseline: int = 0
    min_interval_s: float = MIN_TRIM_INTERVAL_SECONDS
    last_trim_s: float = float("-inf")

    @property
    def peak_in_use(self) -> int:
        """The working set: the highest bytes in use over the recent checks."""
        return max(self.recent_in_use, default=0)

    def cap(self) -> int:
        return max(self.floor, self.peak_in_use)

    def kept(self, resident: int, in_use: int) -> int:
        """Freed bytes held resident: resident anonymous memory less live blocks less the baseline."""
        return max(0, resident - in_use - self.baseline)

    def should_trim(self, resident: int, in_use: int, now_s: float) -> bool:
        """Record ``in_use`` in the working set; whether the freed memory kept is past the cap (and the last trim
        at least ``min_interval_s`` ago)."""
        self.recent_in_use.append(in_use)
        return self.kept(resident, in_use) > self.cap() and now_s - self.last_trim_s >= self.min_interval_s

    def trimmed(self, resident: int, in_use: int, now_s: float) -> None:
        """After a trim: what is left resident beyond the live blocks is the new baseline."""
        self.baseline = max(0, resident - in_use)
        self.last_trim_s = now_s


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                       "fsmblks", "uordblks", "fordblks", "keepcost")]


def malloc_in_use(libc: ctypes.CDLL) -> int | None:
    """Bytes in live malloc blocks (heap and mmapped), from ``mallinfo2`` (glibc 2.33+); None where it is missing."""
    fn = getattr(libc, "mallinfo2", None)
    if fn is None:
        return None
    fn.restype = _Mallinfo2
    info = fn()
    return int(info.uordblks + info.hblkhd)


def resident_anonymous() -> int | None:
    """This process's resident anonymous memory in bytes (``RssAnon`` of /proc/self/status), None where unknown."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check(libc: ctypes.CDLL, policy: TrimPolicy) -> bool:
    """One check: trim (``malloc_trim(0)``: every arena's free pages back to the kernel) when past the cap.
    Returns whether it trimmed."""
    resident, in_use = resident_anonymous(), malloc_in_use(libc)
    if resident is None or in_use is None or not policy.should_trim(resident, in_use, time.monotonic()):
        return False
    libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    libc.malloc_trim(0)
    after, in_use_after = resident_anonymous(), malloc_in_use(libc)
    if after is not None and in_use_after is not None:
        policy.trimmed(after, in_use_after, time.monotonic())
    return True


def start_trimming(libc: ctypes.CDLL, policy: TrimPolicy | None = None, every_s: float = CHECK_SECONDS) -> bool:
    """Start the daemon thread that runs :func:`check` every ``every_s`` seconds (once per process). Returns whether
    it runs (False where ``mallinfo2`` or /proc is missing)."""
    global _watcher
    if _watcher is not None:
        return True
    if malloc_in_use(libc) is None or resident_anonymous() is None or not hasattr(libc, "malloc_trim"):
        return False
    policy = policy or TrimPolicy()

    def watch() -> None:
        while True:
            time.sleep(every_s)
            check(libc, policy)

    _watcher = threading.Thread(target=watch, name="aiayn-memory-cap", daemon=True)
    _watcher.start()
    return True
