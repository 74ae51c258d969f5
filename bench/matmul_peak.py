"""The machine's measured fp32 matmul throughput: the denominator of model FLOPs utilization (MFU).

    .venv/bin/python bench/matmul_peak.py           # 2048^3 fp32, median of 7
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402


def matmul_peak(n: int = 2048, runs: int = 7, warmup: int = 2) -> dict[str, Any]:
    """Time ``(n, n) @ (n, n)`` in fp32 with torch's current thread count.

    Returns:
        {"n", "median_flops", "best_flops", "times"}; FLOP/s counts 2 n^3 per product.
    """
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g)
    b = torch.randn(n, n, generator=g)
    c = torch.empty(n, n)
    times = benchlib.alternate({"mm": lambda: torch.mm(a, b, out=c)}, runs=runs, warmup=warmup)["mm"]
    flops = 2.0 * n**3
    return {"n": n, "median_flops": flops / benchlib.median(times), "best_flops": flops / min(times),
            "times": times}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """CLI entry point: print the peak and write ``bench/results/matmul_peak.json``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=2048)
    benchlib.add_common_args(p, runs=7)  # --quick: 1024^3, 5 runs
    args = p.parse_args(argv)
    benchlib.setup(args.threads)
    t0 = time.perf_counter()
    payload = matmul_peak(1024 if args.quick else args.n, args.runs or (5 if args.quick else 7))
    payload["wall_s"] = time.perf_counter() - t0
    print(benchlib.table([{"n": payload["n"], "threads": torch.get_num_threads(),
                           "median_GFLOP_s": payload["median_flops"] / 1e9,
                           "best_GFLOP_s": payload["best_flops"] / 1e9}]))
    print(f"written {benchlib.write_results('matmul_peak', payload, quick=args.quick)}")
    return payload


if __name__ == "__main__":
    main()
