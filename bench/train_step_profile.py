"""Where an aiayn training step goes, and the MFU it could reach if everything but its matmuls took no time.

For each ``train_throughput.py`` setup, aiayn's step (forward, fused loss, backward, Adam) runs under
``torch.profiler``, and the kernels' self time is split into:

- ``matmul_ms``: the linear layers and the loss's products, forward and backward (``mkldnn::_linear_pointwise``,
  ``aten::mm`` / ``addmm`` / ``bmm`` / ``baddbmm``);
- ``attention_ms``: torch's CPU flash-attention kernels, forward and backward (attention over more than 64 keys;
  shorter attention trains as two matmuls and a softmax, :mod:`aiayn.nn.short_attention`, counted with those);
- ``other_ms``: everything else that the profiler saw (norms, dropout, softmax of the loss, the embedding's
  gradient, Adam, copies); the step's wall time minus the three is Python and autograd bookkeeping.

``mfu`` is the step's model FLOPs utilization as ``train_throughput.py`` computes it (3 x forward FLOPs per target
token, against the fastest of a few 2048^3 matmuls timed in the same process just before); ``matmul_only_mfu`` is
the same FLOPs over ``matmul_ms`` alone: the ceiling of a step whose every other kernel and line of Python took no
time. Where it is below a target, only faster matmuls at these shapes can reach it.

    .venv/bin/python bench/train_step_profile.py
    .venv/bin/python bench/train_step_profile.py --setups seq2seq-paper-base --steps 5
    .venv/bin/python bench/train_step_profile.py --setups seq2seq-paper-base --batch 64
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
import matmul_peak  # noqa: E402
import train_throughput  # noqa: E402

from aiayn.models import forward_flops_per_token  # noqa: E402

MATMUL_OPS = ("mkldnn::_linear_pointwise", "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
ATTENTION_PREFIX = "aten::_scaled_dot_product_flash_attention_for_cpu"


def split_kernel_time(events: Any) -> dict[str, float]:
    """Self CPU time (ms) of a profile's kernels: matmuls, attention and the rest (see the module docstring).

    ``events``: ``profile.key_averages()``. Only ``aten::`` and ``mkldnn::`` ops count; Python-side ranges (autograd
    nodes, ``Optimizer.step``) are left out, their self time goes to ``python_ms`` with the rest of the wall time.
    """
    split = {"matmul_ms": 0.0, "attention_ms": 0.0, "other_ms": 0.0}
    for e in events:
        name, ms = e.key, e.self_cpu_time_total / 1e3
        if name.startswith(ATTENTION_PREFIX):
            split["attention_ms"] += ms
        elif name in MATMUL_OPS:
            split["matmul_ms"] += ms
        elif name.startswith(("aten::", "mkldnn::")):
            split["other_ms"] += ms
    return split


def profile_setup(setup: str, steps: int, quick: bool = False, batch: int | None = None) -> dict[str, Any]:
    """Profile ``steps`` aiayn training steps of ``setup`` (after 2 warm-up steps; ``batch`` sequences a step
    instead of the setup's own); per-step figures."""
    shape = None if batch is None else {"batch": batch}
    step, tokens = train_throughput.build_step(setup, "aiayn", quick, shape=shape)
    for _ in range(2):
        step()
    n = 1024 if quick else 2048
    peak = matmul_peak.matmul_peak(n, runs=5, warmup=1)["best_flops"]
    start = time.perf_counter()
    for _ in range(steps):
        step()
    wall_ms = 1e3 * (time.perf_counter() - start) / steps
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    split = {k: v / steps for k, v in split_kernel_time(prof.key_averages()).items()}
    s, c = train_throughput.setup_shape(setup, shape), train_throughput.model_config(setup, quick)
    flops = 3 * forward_flops_per_token(c, src_len=s["src"], tgt_len=s["tgt"]) * tokens
    return {"setup": setup, "batch": s["batch"], "step_ms": wall_ms, **split,
            "python_ms": max(0.0, wall_ms - sum(split.values())), "matmul_gflops": flops / split["matmul_ms"] / 1e6,
            "peak_gflops": peak / 1e9, "mfu": flops / (wall_ms / 1e3) / peak,
            "matmul_only_mfu": flops / (split["matmul_ms"] / 1e3) / peak}


COLUMNS = ["setup", "batch", "step_ms", "matmul_ms", "attention_ms", "other_ms", "python_ms", "matmul_gflops",
           "peak_gflops", "mfu", "matmul_only_mfu"]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """CLI entry point: profile, print the table, write ``bench/results/train_step_profile.json``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    benchlib.add_common_args(p, runs=None)
    p.add_argument("--setups", nargs="+", choices=list(train_throughput.SETUPS), default=None)
    p.add_argument("--steps", type=int, default=3, help="profiled steps per setup (and as many timed without)")
    benchlib.add_batch_arg(p, "train_step_profile-batch<N>.json")
    args = p.parse_args(argv)
    benchlib.setup(args.threads)
    setups, t0 = args.setups or list(train_throughput.SETUPS), time.perf_counter()
    payload: dict[str, Any] = {"steps": args.steps,
                               "rows": [profile_setup(s, args.steps, args.quick, args.batch) for s in setups]}
    payload["wall_s"] = time.perf_counter() - t0
    name = "train_step_profile" + ("" if args.batch is None else f"-batch{args.batch}")
    benchlib.report(name, payload, COLUMNS, args.quick)
    return payload


if __name__ == "__main__":
    main()
