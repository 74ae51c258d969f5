"""Keep freed memory in the process on glibc hosts, so the large tensors a CPU training step reallocates every
step stop costing a page fault per 4 KiB.

glibc's ``malloc`` hands every block of at least ``M_MMAP_THRESHOLD`` (128 KiB at start, rising to at most 32 MiB
as large blocks are freed) its own ``mmap`` and unmaps it on ``free``. PyTorch's CPU allocator calls ``malloc``
for every tensor, and a training step allocates the same large tensors again each step: at GPT-2 small's 50257 x
768 the tied output layer's gradients (154 MB each: the projection's, the embedding's and their sum), the loss's
logits chunks, the activations. So every step the kernel maps, zero-fills and faults them in again, page by page,
which is a sizeable share of a CPU training step (measured: docs/performance.md, ``bench/allocator.py``).
Transparent huge pages cut the number of faults but not the zero-filling.

:func:`keep_freed_memory` sets ``M_MMAP_MAX`` to 0 (large blocks come from the heap like small ones) and
``M_TRIM_THRESHOLD`` to its maximum (the heap is never shrunk), so freed blocks stay in the process and the next
step reuses them. ``mallopt`` cannot raise ``M_MMAP_THRESHOLD`` above 32 MiB, which is why the count of mmaps is set
instead. glibc still uses ``mmap`` when the heap cannot grow, and for blocks larger than a thread arena's 64 MiB
heaps, so no allocation fails because of this. The price: the process keeps its peak memory (RSS stays where it
was after big tensors are freed), as PyTorch's CUDA caching allocator does on the GPU, up to a cap: freed memory
beyond the process's peak working set, which a heap fragmented by batches of many shapes accumulates, goes back to
the kernel, and oneDNN's caches of compiled products are capped too (:mod:`aiayn.accel.cpu.memory_cap`). The heap
also takes a few rounds to settle: small allocations are carved out of a freed block, and PyTorch's 64-byte-aligned
requests then no longer fit in the rest, so the heap grows by another block until freed blocks lie side by side and
merge (a few rounds, and a small rise in peak RSS).

The ``aiayn`` command applies it in its process (:func:`aiayn.accel.setup_process`) unless acceleration is off
(``--accel none`` / ``AIAYN_ACCEL=none``), and :func:`aiayn.train.distributed.launch` applies it in the workers it
starts when their parent has it. The library never applies it by itself: it changes the whole process, so Python
users call :func:`keep_freed_memory` once at start-up. Elsewhere than glibc (macOS, Windows, musl), and where another
malloc is interposed with ``LD_PRELOAD`` (jemalloc, tcmalloc), it does nothing and returns False.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

from aiayn.accel.cpu import memory_cap

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc's mallopt parameters (malloc.h)
_INT_MAX = 2**31 - 1
_applied = False


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed blocks of any size for reuse (see the module docstring); idempotent.

    Returns:
        True when the setting is in effect (glibc), False where it does not apply (nothing is changed).
    """
    global _applied
    if _applied:
        return True
    memory_cap.cap_library_caches()  # oneDNN's caches of compiled products, capped on any platform
    libc = _glibc_whose_malloc_this_process_calls()
    if libc is None:
        return False
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success; trim first so that a failure leaves large blocks mmapped as before
    _applied = bool(mallopt(_M_TRIM_THRESHOLD, _INT_MAX)) and bool(mallopt(_M_MMAP_MAX, 0))
    if _applied:  # kept up to the process's working set, the rest trimmed (aiayn.accel.cpu.memory_cap)
        memory_cap.start_trimming(libc)
    return _applied


def _glibc_whose_malloc_this_process_calls() -> ctypes.CDLL | None:
    """glibc, loaded, when it is this process's C library and its ``malloc`` is the one the process calls (the
    symbol in the process's global scope is libc's own, not one interposed by ``LD_PRELOAD``); else None."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        process, libc = ctypes.CDLL(None), ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        same = ctypes.cast(process.malloc, ctypes.c_void_p).value == ctypes.cast(libc.malloc, ctypes.c_void_p).value
        return libc if same and hasattr(libc, "mallopt") else None
    except (OSError, AttributeError):
        return None


def malloc_is_glibcs() -> bool:
    """Whether the ``malloc`` this process calls is glibc's own, not one interposed by ``LD_PRELOAD`` (jemalloc,
    tcmalloc, a tracer). False off glibc."""
    return _glibc_whose_malloc_this_process_calls() is not None


def keeps_freed_memory() -> bool:
    """Whether :func:`keep_freed_memory` is in effect in this process."""
    return _applied
