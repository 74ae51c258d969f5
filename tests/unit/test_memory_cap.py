"""The cap on memory kept for reuse (aiayn.accel.cpu.memory_cap): the trim rule with readings injected, a real trim in
a fresh process, and oneDNN's cache sizes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from aiayn.accel.cpu import memory_cap
from aiayn.accel.cpu.allocator import malloc_is_glibcs
from aiayn.accel.cpu.memory_cap import KEEP_FLOOR_BYTES, TrimPolicy

MB = 1 << 20


def test_freed_memory_up_to_the_working_set_is_kept():
    policy = TrimPolicy()
    # a steady loop: 100 MB live between steps (weights, optimizer), 400 MB at a step's peak; what the step freed stays
    assert not policy.should_trim(resident=450 * MB, in_use=400 * MB, now_s=0.0)
    assert not policy.should_trim(resident=450 * MB, in_use=100 * MB, now_s=1.0)  # 350 MB kept < 400 MB
    assert policy.cap() == max(KEEP_FLOOR_BYTES, 400 * MB)


def test_freed_memory_past_the_cap_is_trimmed_and_the_rest_becomes_the_baseline():
    policy = TrimPolicy(floor=256 * MB)
    assert not policy.should_trim(resident=900 * MB, in_use=500 * MB, now_s=0.0)  # kept 400 MB < working set 500 MB
    assert policy.should_trim(resident=1800 * MB, in_use=400 * MB, now_s=5.0)  # fragmentation: 1.4 GB kept > 500 MB
    policy.trimmed(resident=600 * MB, in_use=400 * MB, now_s=5.0)  # Python's arenas, stacks: 200 MB not freed memory
    assert policy.baseline == 200 * MB
    assert policy.kept(resident=900 * MB, in_use=400 * MB) == 300 * MB
    assert not policy.should_trim(resident=900 * MB, in_use=400 * MB, now_s=10.0)
    # fragmented again soon after: trimmed at most every min_interval_s
    assert not policy.should_trim(resident=1800 * MB, in_use=400 * MB, now_s=10.0)
    assert policy.should_trim(resident=1800 * MB, in_use=400 * MB, now_s=5.0 + policy.min_interval_s)


def test_the_working_set_is_the_highest_use_of_the_last_minute():
    policy = TrimPolicy(floor=64 * MB)
    policy.should_trim(resident=2000 * MB, in_use=900 * MB, now_s=0.0)  # an evaluation's large transient
    assert policy.cap() == 900 * MB
    for i in range(memory_cap.WINDOW_CHECKS):
        policy.should_trim(resident=900 * MB, in_use=300 * MB, now_s=5.0 * (i + 1))
    assert policy.cap() == 300 * MB  # a minute later training's own working set is the cap again


def test_small_processes_are_never_trimmed():
    policy = TrimPolicy()
    assert not policy.should_trim(resident=KEEP_FLOOR_BYTES + 10 * MB, in_use=10 * MB, now_s=0.0)


def test_library_caches_are_capped_unless_the_environment_says_otherwise(monkeypatch):
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "2048")
    memory_cap.cap_library_caches()
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(memory_cap.LIBRARY_CACHE_ENTRIES)
    assert os.environ["LRU_CACHE_CAPACITY"] == "2048"


@pytest.mark.skipif(not malloc_is_glibcs(), reason="glibc's malloc only")
def test_a_fragmented_heap_is_trimmed_back_in_a_real_process():
    """Freed memory kept (no trim, no mmap) in a heap fragmented by small live blocks between large freed ones: one
    check hands it back, and a second check right after does nothing."""
    code = textwrap.dedent("""
        import ctypes, json
        from aiayn.accel.cpu import memory_cap
        from aiayn.accel.cpu.allocator import keep_freed_memory, _glibc_whose_malloc_this_process_calls
        keep_freed_memory()
        libc = _glibc_whose_malloc_this_process_calls()
        libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
        libc.free.argtypes = [ctypes.c_void_p]
        big, small = [], []
        for _ in range(64):  # 64 x 8 MiB, each followed by a small block that stays alive
            p = libc.malloc(8 << 20); ctypes.memset(p, 1, 8 << 20); big.append(p)
            small.append(libc.malloc(64))
        for p in big:
            libc.free(p)
        policy = memory_cap.TrimPolicy(floor=64 << 20)
        before = memory_cap.resident_anonymous()
        first = memory_cap.check(libc, policy)
        after = memory_cap.resident_anonymous()
        second = memory_cap.check(libc, policy)
        print(json.dumps([before, after, first, second]))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, after, first, second = json.loads(out.stdout.strip().splitlines()[-1])
    assert first and not second
    assert before - after > 400 * MB  # the 512 MiB freed, minus what a page boundary keeps
