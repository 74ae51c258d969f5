"""Run every comparison benchmark, one subprocess each (fresh threads and memory), and summarize the wall times.

    .venv/bin/python bench/run_all.py            # real sizes (about 10-15 minutes on 2 quiet cores)
    .venv/bin/python bench/run_all.py --quick    # small sizes (a few minutes)
    .venv/bin/python bench/run_all.py --only generate_lm translate_beam

Each script writes ``bench/results/<name>.json``; this one adds ``bench/results/run_all.json``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

HERE = Path(__file__).resolve().parent
#: the comparisons, each run without --only (the other scripts of bench/ are diagnoses or take long: README.md)
SCRIPTS = ["matmul_peak", "generate_lm", "translate_beam", "train_throughput", "multi30k_epoch"]
#: options run_all passes to a script beyond its defaults: the training bench leaves out aiayn against its own
#: reference core (aiayn-reference; bench/ab_revisions.py with AIAYN_ACCEL=none measures that)
EXTRA_ARGS = {"train_throughput": ["--no-ablation"]}


def run_script(name: str, quick: bool, threads: int | None) -> dict[str, Any]:
    """Run ``bench/<name>.py`` in a subprocess (output streamed through); returns its status and wall time.

    ``threads`` None leaves each script its default (2).
    """
    cmd = [sys.executable, str(HERE / f"{name}.py"), *EXTRA_ARGS.get(name, [])]
    if threads is not None:
        cmd += ["--threads", str(threads)]
    if quick:
        cmd.append("--quick")
    print(f"\n######## {' '.join(cmd[1:])}", flush=True)
    t0 = time.perf_counter()
    rc = subprocess.run(cmd, check=False).returncode
    return {"script": name, "returncode": rc, "wall_s": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """CLI entry point."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small, fast versions of every benchmark")
    p.add_argument("--threads", type=int, default=None, help="torch threads for every script (default: "
                   "each script's own, 2)")
    p.add_argument("--only", nargs="+", choices=SCRIPTS, default=None, help="run only these scripts (default: all)")
    benchlib.add_malloc_arg(p)  # exported to every script's process
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    rows = [run_script(name, args.quick, args.threads) for name in (args.only or SCRIPTS)]
    payload = {"quick": args.quick, "threads": args.threads, "malloc": benchlib.malloc_setting(), "rows": rows,
               "wall_s": time.perf_counter() - t0}
    print("\n" + benchlib.table(rows))
    print(f"total {payload['wall_s']:.0f} s; written {benchlib.write_results('run_all', payload, quick=args.quick)}")
    if any(r["returncode"] for r in rows):
        sys.exit(1)
    return payload


if __name__ == "__main__":
    main()
