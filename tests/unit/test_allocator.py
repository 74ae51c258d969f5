"""aiayn.accel.cpu.allocator: with keep_freed_memory, reallocating a large tensor costs no page faults (glibc only).

The setting changes the whole process, so every check runs in a fresh Python subprocess.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import textwrap

import pytest

glibc = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                           reason="the setting exists only for glibc's malloc")

# Allocates and frees a 64 MiB tensor (each filled, so every page is touched) 32 times and counts each time's minor
# page faults. With glibc's defaults each allocation is a fresh mmap, faulted in page by page (16384 faults). With the
# setting the block comes from the heap, but the heap grows a few times before it settles: between one free and the
# next allocation small allocations are carved out of the freed block, and torch's posix_memalign asks for 96 bytes
# more than a block, so the rest no longer fits and the heap grows by another block (each one faulted in), until
# freed blocks lie side by side and merge. Seen here: 1 to 5 blocks, settled by the 6th allocation, depending on the
# process's layout (its environment, the path it runs from); in a clean-clone CI run the median of the 4th to
# the 11th still took a whole block of faults.
# So the verdict is on the last 8 of the 32, after the heap settled. The probe also reports what glibc itself says
# of the block (the bytes in mmapped blocks that its free released, from mallinfo2), the addresses the last 8 tensors
# had and the environment that could change malloc, so that a failure explains itself.
PROBE = textwrap.dedent("""
    import ctypes, json, os, resource, statistics, sys
    import torch
    from aiayn import accel
    from aiayn.accel.cpu import allocator
    # "keep": the allocator's own call; "setup": what a command does (aiayn.accel.setup_process, AIAYN_ACCEL or
    # "auto"); "setup-none": the same with acceleration off; "none": nothing
    applied = {"keep": allocator.keep_freed_memory, "setup": accel.setup_process,
               "setup-none": lambda: accel.setup_process("none"), "none": lambda: False}[sys.argv[1]]()

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                     "keepcost")]
    mallinfo2 = getattr(ctypes.CDLL(None), "mallinfo2", None)  # glibc >= 2.33
    if mallinfo2 is not None:
        mallinfo2.restype = MallInfo2

    def fill():
        x = torch.empty(16 * 2**20).fill_(1.0)  # 64 MiB of float32
        alive = mallinfo2().hblkhd if mallinfo2 is not None else 0
        pointer = x.data_ptr()
        del x
        return pointer, alive - (mallinfo2().hblkhd if mallinfo2 is not None else 0)

    counts, pointers, unmapped = [], [], []
    for _ in range(32):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        pointer, released = fill()
        counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        pointers.append(pointer)
        unmapped.append(released)
    print(json.dumps({
        "applied": applied, "state": allocator.keeps_freed_memory(), "glibc_malloc": allocator.malloc_is_glibcs(),
        "faults": statistics.median(counts[-8:]), "faulted_at": [i for i, n in enumerate(counts) if n > 8000],
        "last_addresses": sorted({hex(p) for p in pointers[-8:]}),
        "unmapped_on_free": None if mallinfo2 is None else min(unmapped[-8:]),
        "env": {k: v for k, v in os.environ.items() if k.startswith(("LD_", "MALLOC", "GLIBC_"))}}))
""")
MIB64 = 64 * 2**20


def _probe(mode: str, env: dict[str, str] | None = None) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True,
                         env={**os.environ, **(env or {})})
    return json.loads(out.stdout.strip().splitlines()[-1])


def _glibc_malloc_probes() -> tuple[dict, dict]:
    default, kept = _probe("none"), _probe("keep")
    if not default["glibc_malloc"]:
        assert not kept["applied"] and not kept["state"], kept  # an interposed malloc: the setting must not claim
        pytest.skip(f"this process's malloc is not glibc's (interposed): {default['env']}")
    if default["unmapped_on_free"] is None:
        pytest.skip("glibc older than 2.33 has no mallinfo2")
    return default, kept


@glibc
def test_large_blocks_come_from_the_heap_and_are_reused():
    """What glibc does with the block, which is what the setting controls: by default a 64 MiB block is mmapped (and
    unmapped on free); with the setting it is carved from the heap and stays there when freed."""
    default, kept = _glibc_malloc_probes()
    assert not default["state"] and kept["applied"] and kept["state"]
    assert default["unmapped_on_free"] >= MIB64, default
    assert kept["unmapped_on_free"] == 0, kept


@glibc
def test_reallocation_faults_disappear():
    """What the user gains: with the block reused, the kernel has no pages to fault in again."""
    default, kept = _glibc_malloc_probes()
    assert default["faults"] > 8000, default  # 16384 pages of 4 KiB per 64 MiB, less any huge pages
    if kept["faults"] >= 100 and kept["unmapped_on_free"] == 0 and len(kept["last_addresses"]) <= 2:
        # glibc kept the block on the heap and handed the same one or two back (the test above), yet its pages
        # faulted in again: something under malloc (the kernel, a sandbox) drops them. Nothing this setting can
        # change; say what was seen. (A heap still growing shows new addresses and fails below.)
        pytest.skip(f"this host faults reused heap pages in again: {kept}")
    assert kept["faults"] < 100, kept


@glibc
@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build an interposing malloc")
def test_an_interposed_malloc_is_left_alone(tmp_path):
    """Under LD_PRELOAD of another malloc (jemalloc, tcmalloc, a tracer) glibc's settings would do nothing, so the
    setting says so instead of claiming to be in effect."""
    source = tmp_path / "shim.c"
    source.write_text("#include <stddef.h>\nextern void *__libc_malloc(size_t);\n"
                      "void *malloc(size_t n) { return __libc_malloc(n); }\n")
    shim = tmp_path / "shim.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(shim), str(source)], check=True, capture_output=True)
    interposed = _probe("keep", {"LD_PRELOAD": str(shim)})
    assert not interposed["glibc_malloc"] and not interposed["applied"] and not interposed["state"], interposed


@glibc
def test_acceleration_off_leaves_it_alone():
    """Process set-up applies it unless acceleration is off, by argument (``--accel none``) or by AIAYN_ACCEL."""
    on = _probe("setup", {"AIAYN_ACCEL": "auto"})
    if not on["glibc_malloc"]:
        assert not on["applied"] and not on["state"], on  # an interposed malloc: nothing to turn on or off
        pytest.skip(f"this process's malloc is not glibc's (interposed): {on['env']}")
    assert on["applied"] and on["state"]
    for off in (_probe("setup-none", {"AIAYN_ACCEL": "auto"}), _probe("setup", {"AIAYN_ACCEL": "none"})):
        assert not off["applied"] and not off["state"] and off["faults"] > 8000, off


def test_a_bad_acceleration_setting_is_a_user_error():
    """AIAYN_ACCEL is the one switch; a value that is not a choice is refused before anything is changed."""
    code = ("from aiayn import accel; from aiayn.accel.cpu import allocator; from aiayn.errors import AiaynError\n"
            "try:\n    accel.setup_process()\nexcept AiaynError as e:\n    print('refused', e)\n"
            "print(allocator.keeps_freed_memory())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "AIAYN_ACCEL": "fast"})
    refused, state = out.stdout.strip().splitlines()
    assert refused.startswith("refused") and "AIAYN_ACCEL" in refused and "'fast'" in refused, refused
    assert state == "False"


def test_idempotent_and_truthful():
    from aiayn.accel.cpu import allocator

    code = "from aiayn.accel.cpu import allocator as a; r = (a.keep_freed_memory(), a.keep_freed_memory()); " \
           "print(r[0] == r[1] == a.keeps_freed_memory())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
    assert not hasattr(allocator, "ENV_VAR")  # no switch of its own: acceleration's (aiayn.accel) decides


@glibc
def test_the_command_applies_it_unless_disabled(tmp_path):
    def run(env: dict[str, str], *options: str) -> str:
        code = ("import sys; from aiayn.cli.main import main; from aiayn.accel.cpu import allocator; "
                f"rc = main(['classify', '--checkpoint', {str(tmp_path / 'missing')!r}, *{list(options)!r}]); "
                "print(rc, allocator.keeps_freed_memory(), allocator.malloc_is_glibcs())")
        environ = {k: v for k, v in os.environ.items() if k != "AIAYN_ACCEL"}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**environ, **env})
        return out.stdout.strip().splitlines()[-1]

    on = run({})
    if on.endswith(" False"):  # an interposed malloc (seen on a GPU host): the command must not claim the setting
        assert on == "2 False False"
        pytest.skip("this process's malloc is not glibc's (interposed)")
    assert on == "2 True True"  # a user error (no such checkpoint), after the command set the allocator up
    assert run({}, "--accel", "none") == "2 False True"
    assert run({"AIAYN_ACCEL": "none"}) == "2 False True"
