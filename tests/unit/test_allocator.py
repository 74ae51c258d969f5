"""aiayn.allocator: with keep_freed_memory, reallocating a large tensor costs no page faults (glibc only).

The setting changes the whole process, so every check runs in a fresh Python subprocess.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap

import pytest

glibc = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                           reason="the setting exists only for glibc's malloc")

# Allocates and frees a 64 MiB tensor (each filled, so every page is touched) 3 times to warm up, then 8 more times,
# and reports the median of those 8 counts of minor page faults: with glibc's defaults each allocation is a fresh
# mmap, faulted in page by page (16384 faults); with the setting the heap block is reused. (The heap may still grow
# once in a while, e.g. when the thread pool starting up allocates beside the tensor, hence the median.)
PROBE = textwrap.dedent("""
    import json, resource, sys
    import torch
    from aiayn import allocator
    applied = {"keep": allocator.keep_freed_memory, "env": allocator.keep_freed_memory_unless_disabled,
               "none": lambda: False}[sys.argv[1]]()
    def fill():
        torch.empty(16 * 2**20).fill_(1.0)  # 64 MiB of float32
    for _ in range(3):
        fill()
    counts = []
    for _ in range(8):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        fill()
        counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    faults = sorted(counts)[4]
    print(json.dumps({"applied": applied, "state": allocator.keeps_freed_memory(), "faults": faults}))
""")


def _probe(mode: str, env: dict[str, str] | None = None) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True,
                         env={**os.environ, **(env or {})})
    return json.loads(out.stdout.strip().splitlines()[-1])


@glibc
def test_reallocation_faults_disappear():
    default, kept = _probe("none"), _probe("keep")
    assert not default["state"] and kept["applied"] and kept["state"]
    assert default["faults"] > 8000  # 16384 pages of 4 KiB per 64 MiB, less any huge pages
    assert kept["faults"] < 100


@glibc
def test_environment_switch_turns_it_off():
    assert _probe("env")["applied"]
    off = _probe("env", {"AIAYN_KEEP_FREED_MEMORY": "0"})
    assert not off["applied"] and not off["state"] and off["faults"] > 8000


def test_idempotent_and_truthful():
    from aiayn import allocator

    code = "from aiayn import allocator as a; r = (a.keep_freed_memory(), a.keep_freed_memory()); " \
           "print(r[0] == r[1] == a.keeps_freed_memory())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
    assert allocator.ENV_VAR == "AIAYN_KEEP_FREED_MEMORY"


@glibc
def test_the_command_applies_it_unless_disabled(tmp_path):
    code = ("import sys; from aiayn.cli.main import main; from aiayn import allocator; "
            f"rc = main(['classify', '--checkpoint', {str(tmp_path / 'missing')!r}]); "
            "print(rc, allocator.keeps_freed_memory())")

    def run(env: dict[str, str]) -> str:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, **env})
        return out.stdout.strip().splitlines()[-1]

    assert run({}) == "2 True"  # a user error (no such checkpoint), after the command set the allocator up
    assert run({"AIAYN_KEEP_FREED_MEMORY": "0"}) == "2 False"
