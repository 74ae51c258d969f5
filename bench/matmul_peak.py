"""The machine's measured fp32 matmul throughput: the denominator of model FLOPs utilization (MFU).

The fastest of torch's own matmul (MKL in x86 builds) and oneDNN's: on AMD CPUs with AVX-512 MKL reaches less than
half of what oneDNN does, and a peak measured through MKL alone would overstate every MFU there.

    .venv/bin/python bench/matmul_peak.py           # 2048^3 fp32, median of 7
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402


def matmul_products(n: int, dtype: torch.dtype = torch.float32) -> dict[str, Callable[[], Any]]:
    """One ``(n, n) @ (n, n)`` product per CPU matmul library at hand: ``torch.mm`` (fp32: MKL in x86 builds; bf16:
    oneDNN) and, for fp32 where the build has it, oneDNN's linear kernel (:mod:`aiayn.accel.cpu.gemm`, the library
    aiayn uses where it is faster). The machine's peak is the fastest of them."""
    from aiayn.accel.cpu.gemm import onednn_available  # here: train_throughput.py's workers run older revisions too

    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=g).to(dtype) for _ in range(2))
    c = torch.empty(n, n, dtype=dtype)
    products: dict[str, Callable[[], Any]] = {"torch.mm": lambda: torch.mm(a, b, out=c)}
    if dtype == torch.float32 and onednn_available():
        w = b.t().contiguous()  # a @ b = linear(a, b^T)
        products["onednn"] = lambda: torch.ops.mkldnn._linear_pointwise(a, w, None, "none", [], "")
    return products


def peak_flops(n: int, times: dict[str, list[float]], fastest: bool = False) -> tuple[float, str]:
    """(FLOP/s, library) of the fastest library, from :func:`benchlib.alternate` times of :func:`matmul_products`
    (any other keys are ignored): by median time, or with ``fastest`` by its single fastest product."""
    pick = min if fastest else benchlib.median
    rates = {name: pick(times[name]) for name in ("torch.mm", "onednn") if name in times}
    best = min(rates, key=rates.get)
    return 2.0 * n**3 / rates[best], best


def matmul_peak(n: int = 2048, runs: int = 7, warmup: int = 2) -> dict[str, Any]:
    """Time ``(n, n) @ (n, n)`` in fp32 with torch's current thread count, through each library, alternating.

    Returns:
        {"n", "median_flops", "best_flops", "library", "by_library", "times"}: the fastest library's figures
        (FLOP/s counts 2 n^3 per product) and each library's {"median_flops", "best_flops"}.
    """
    times = benchlib.alternate(matmul_products(n), runs=runs, warmup=warmup)
    flops = 2.0 * n**3
    by_library = {name: {"median_flops": flops / benchlib.median(t), "best_flops": flops / min(t)}
                  for name, t in times.items()}
    _, best = peak_flops(n, times)
    return {"n": n, **by_library[best], "library": best, "by_library": by_library, "times": times[best]}


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
    print(benchlib.table([{"n": payload["n"], "threads": torch.get_num_threads(), "library": name,
                           "median_GFLOP_s": r["median_flops"] / 1e9, "best_GFLOP_s": r["best_flops"] / 1e9,
                           "peak": name == payload["library"]} for name, r in payload["by_library"].items()]))
    print(f"written {benchlib.write_results('matmul_peak', payload, quick=args.quick)}")
    return payload


if __name__ == "__main__":
    main()
