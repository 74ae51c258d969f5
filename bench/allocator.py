"""What :func:`aiayn.allocator.keep_freed_memory` (glibc keeps freed blocks) does to CPU training and decoding.

Each workload runs in a fresh process once with glibc's default ``malloc`` settings ("default") and once with freed
memory kept ("kept", as the ``aiayn`` command runs); the two alternate, ``--rounds`` times each, so background load
hits both alike. A process times ``--runs`` units of work after two warm-ups and reports their times, its minor
page faults per unit and its peak RSS. The peers run too: the setting changes the process's allocator, so it speeds
them up as well, and the ``vs_peer`` column gives aiayn's ratio under each setting.

Workloads (``train_throughput.py``'s and ``translate_beam.py``'s, same shapes):

- ``train-gpt2-small``: one training step of the GPT-2-small-like decoder (batch 8 x 128), aiayn and
  transformers' ``GPT2LMHeadModel``;
- ``train-paper-base``: one training step of the paper-base encoder-decoder (batch 16 x 32 / 32), aiayn and
  transformers' Marian;
- ``beam-paper-base``: one beam-4 decode of 32 sentences at paper-base size, aiayn only.

    .venv/bin/python bench/allocator.py            # about 5 minutes on 2 cores
    .venv/bin/python bench/allocator.py --quick
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

# workload -> (benchmark script's setup, aiayn's implementation name, the peer's or None)
WORKLOADS = {
    "train-gpt2-small": ("lm-gpt2-small", "aiayn", "transformers-gpt2"),
    "train-paper-base": ("seq2seq-paper-base", "aiayn", "transformers-marian"),
    "beam-paper-base": ("paper-base", "aiayn", None),
}
SETTINGS = ("default", "kept")


def implementations(workload: str) -> list[str]:
    """aiayn's implementation name in ``workload``, then the peer's if it has one."""
    return [impl for impl in WORKLOADS[workload][1:] if impl]


def build_unit(workload: str, impl: str, quick: bool) -> Any:
    """A zero-argument callable: one training step or one decode of ``impl`` in ``workload``."""
    setup = WORKLOADS[workload][0]
    if workload.startswith("train-"):
        from train_throughput import build_step

        return build_step(setup, impl, quick=quick)[0]
    import translate_beam as tb

    size = tb.Seq2SeqSize("quick", 64, 128, 4, 2, 1000) if quick else tb.SIZES[setup]
    out: dict[str, Any] = {}
    run = tb.make_runner("aiayn", tb.load_contender("aiayn", size, Path(".")), size, 8 if quick else 32,
                         20, out)
    mask = out["aiayn-mask"]

    def decode() -> None:
        with mask:
            run()
    return decode


def child(workload: str, impl: str, setting: str, runs: int, quick: bool, threads: int) -> dict[str, Any]:
    """Time ``runs`` units of ``impl`` in this (fresh) process under ``setting``; print and return the JSON."""
    from aiayn.allocator import keep_freed_memory

    applied = keep_freed_memory() if setting == "kept" else False
    benchlib.setup(threads)
    unit = build_unit(workload, impl, quick)
    unit()  # warm-up: twice, so that the heap has grown to its steady size before the timed runs
    unit()
    faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    times = benchlib.alternate({impl: unit}, runs=runs, warmup=0)[impl]
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0) / runs
    result = {"times": times, "faults_per_unit": faults, "peak_rss_mb": benchlib.peak_rss_mb(), "applied": applied}
    print(json.dumps(result))
    return result


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    """CLI entry point."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    benchlib.add_common_args(p, runs=3, malloc=False)  # it runs both settings itself
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds of (default, kept) processes")
    p.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    p.add_argument("--child", nargs=3, metavar=("WORKLOAD", "IMPL", "SETTING"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    runs = args.runs or (1 if args.quick else 3)
    if args.child:
        child(*args.child, runs=runs, quick=args.quick, threads=args.threads)
        return None

    t_start = time.perf_counter()
    raw: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in range(args.rounds):
        for workload in args.workloads:
            for impl in implementations(workload):
                for setting in (SETTINGS if r % 2 == 0 else SETTINGS[::-1]):
                    cmd = [sys.executable, __file__, "--child", workload, impl, setting, "--runs", str(runs),
                           "--threads", str(args.threads), *(["--quick"] if args.quick else [])]
                    print(f"round {r + 1}/{args.rounds}: {workload} {impl} {setting}", flush=True)
                    raw.setdefault((workload, impl, setting), []).append(benchlib.run_json_child(cmd))

    rows = []
    for workload in args.workloads:
        _, ours, peer = WORKLOADS[workload]
        med = {(impl, s): benchlib.median([t for res in raw[(workload, impl, s)] for t in res["times"]])
               for impl in implementations(workload) for s in SETTINGS}
        for impl in implementations(workload):
            runs_of = {s: raw[(workload, impl, s)] for s in SETTINGS}
            row = {"workload": workload, "impl": impl,
                   "default_s": med[(impl, "default")], "kept_s": med[(impl, "kept")],
                   "speedup": med[(impl, "default")] / med[(impl, "kept")],
                   "faults_default": benchlib.median([x["faults_per_unit"] for x in runs_of["default"]]),
                   "faults_kept": benchlib.median([x["faults_per_unit"] for x in runs_of["kept"]]),
                   "rss_default_mb": max(x["peak_rss_mb"] for x in runs_of["default"]),
                   "rss_kept_mb": max(x["peak_rss_mb"] for x in runs_of["kept"]),
                   "times": {s: [t for res in runs_of[s] for t in res["times"]] for s in SETTINGS}}
            if impl == ours and peer:
                row["vs_peer_default"] = med[(peer, "default")] / med[(ours, "default")]
                row["vs_peer_kept"] = med[(peer, "kept")] / med[(ours, "kept")]
            rows.append(row)
    payload = {"rounds": args.rounds, "runs": runs, "quick": args.quick, "rows": rows,
               "wall_s": time.perf_counter() - t_start}
    benchlib.report("allocator", payload, ["workload", "impl", "default_s", "kept_s", "speedup", "faults_default",
                                           "faults_kept", "rss_default_mb", "rss_kept_mb", "vs_peer_default",
                                           "vs_peer_kept"], args.quick)
    return payload


if __name__ == "__main__":
    main()
