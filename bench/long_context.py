"""Long-context attention: time and peak memory against sequence length, for every way aiayn computes attention.

Three measurements of causal self-attention (batch 1, 4 heads of 64; fp32), each from 512 positions doubling until a
method passes the time or memory cap (or a prediction from its last two lengths says it would):

- ``train``: one forward + backward pass of the attention of T queries over T keys;
- ``forward``: the same forward pass without gradients (a prompt's prefill);
- ``decode``: one decoding step after a context of T: a new query over the cache of T keys (linear attention: one
  step of its recurrence, whose state does not grow), averaged over a few steps.

Methods: ``reference`` (explicit softmax, (T, T) scores), ``sdpa`` (torch's fused kernel), ``tiled`` (aiayn's online
softmax, :mod:`aiayn.nn.tiled_attention`), ``linear`` (:mod:`aiayn.nn.linear_attention`), ``flex`` (FlexAttention
with a causal block mask, compiled; the block mask is made once per length outside the timed work, as the flex
backend shares it between layers, and its making time is recorded as ``block_mask_ms``; torch 2.13 has no
FlexAttention backward on the CPU, so it has no ``train`` column there, and a decoding step of one query has no block
to skip, so it has no ``decode`` column).

Each (measurement, method, length) runs in a fresh process. Peak memory is the growth of its peak resident set in
the first run, above the inputs (what making them freed goes back to the system first, ``malloc_trim``, and the peak
is reset through ``/proc/self/clear_refs``). From then on the process keeps freed memory for reuse, as the ``aiayn``
command does (:func:`aiayn.accel.cpu.allocator.keep_freed_memory`: otherwise every large temporary costs fresh page
faults, which on a VM can take longer than the arithmetic); after a second untimed run come the timed runs (the
median of 3, or 1 where a run takes over 2 s).
``state_mib`` is what decoding keeps between steps (the KV cache, or linear attention's state).

    .venv/bin/python bench/long_context.py            # writes bench/results/long_context.json and .png
    .venv/bin/python bench/long_context.py --tiny     # a smoke run at toy sizes, in one process (seconds)
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import benchlib
import torch

from aiayn.accel.cpu.allocator import keep_freed_memory

METHODS = ("reference", "sdpa", "tiled", "linear", "flex")
MODES = ("train", "forward", "decode")
SKIPPED = {("flex", "train"): "torch has no FlexAttention backward on the CPU",
           ("flex", "decode"): "one query per step: no block to skip (the flex backend takes the fused kernel)"}
SIZES = {"full": dict(heads=4, head_dim=64, start=512, max_len=65536, decode_max_len=131072, steps=8,
                      max_seconds=3.0, max_mib=4096.0),
         "tiny": dict(heads=2, head_dim=16, start=64, max_len=256, decode_max_len=256, steps=2,
                      max_seconds=5.0, max_mib=512.0)}


def _trim() -> None:
    """Give the memory glibc holds freed back to the system (``malloc_trim``), where there is glibc."""
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _reset_peak() -> None:
    """Reset the process's peak resident set (VmHWM) to its current size, where Linux allows it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _attention(method: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, compiled: bool,
               blocks: Any = None) -> torch.Tensor:
    """Causal attention of q (B, H, T, Dh) over k, v (B, H, S, Dh) by ``method`` (flex: with the block mask
    ``blocks``)."""
    from aiayn.nn.attention import scaled_dot_product_attention

    if method == "linear":
        from aiayn.nn.linear_attention import causal_linear_attention

        return causal_linear_attention(q, k, v)[0]
    if method == "flex":
        from aiayn.nn import flex

        flex.SETTINGS.compile = compiled
        return flex.attend(q, k, v, blocks=blocks)
    return scaled_dot_product_attention(q, k, v, is_causal=True, backend=method)[0]


def _decoder(method: str, size: dict, length: int) -> tuple[Any, float]:
    """A decoding step function for ``method`` after a context of ``length``, and the MiB it keeps between steps."""
    from aiayn.nn.attention import scaled_dot_product_attention
    from aiayn.nn.linear_attention import LinearAttnState

    h, d, steps = size["heads"], size["head_dim"], size["steps"]
    new = [torch.randn(3, 1, h, 1, d) for _ in range(steps)]  # each step's q, k, v
    if method == "linear":
        state = LinearAttnState()
        ctx = torch.randn(3, 1, h, length, d)
        state.attend(ctx[0], ctx[1], ctx[2])  # the context, folded into the state (untimed)
        del ctx
        mib = sum(x.numel() * x.element_size() for x in state.state) / 2**20

        def step(i: int) -> None:
            q, k, v = new[i]
            state.attend(q, k, v)

        return step, mib
    cache = torch.randn(2, 1, h, length + steps, d)  # keys and values, preallocated (gpt-fast style)

    def step(i: int) -> None:
        q, k, v = new[i]
        end = length + i + 1
        cache[0, :, :, end - 1:end], cache[1, :, :, end - 1:end] = k, v
        scaled_dot_product_attention(q, cache[0, :, :, :end], cache[1, :, :, :end], backend=method)

    return step, cache.numel() * cache.element_size() / 2**20


def measure(mode: str, method: str, length: int, size: dict, compiled: bool,
            keep_freed: bool = False) -> dict[str, Any]:
    """Time (median seconds) and peak memory growth (MiB) of one unit of ``mode`` work at ``length``; with
    ``keep_freed``, the process keeps freed memory from the first run on (a fresh process's choice)."""
    h, d = size["heads"], size["head_dim"]
    row: dict[str, Any] = {"mode": mode, "method": method, "length": length}
    if mode == "decode":
        step, row["state_mib"] = _decoder(method, size, length)

        def work() -> None:
            with torch.no_grad():
                for i in range(size["steps"]):
                    step(i)
    else:
        grad = mode == "train"
        q, k, v = (torch.randn(1, h, length, d, requires_grad=grad) for _ in range(3))
        blocks = None
        if method == "flex":  # made once per shape, as the flex backend keeps it for every layer (untimed)
            from aiayn.nn import flex

            t0 = time.perf_counter()
            blocks = flex.block_mask(flex.causal_mod(), None, None, length, length, "cpu")
            row["block_mask_ms"] = round(1000 * (time.perf_counter() - t0), 1)

        def work() -> None:
            with torch.set_grad_enabled(grad):
                out = _attention(method, q, k, v, compiled, blocks)
                if grad:
                    out.sum().backward()
                    q.grad = k.grad = v.grad = None

    benchlib.settle_garbage(freeze=True)
    _trim()  # what making the inputs freed goes back to the system, so that the run cannot reuse it unseen
    base = benchlib.current_rss_mb()
    _reset_peak()
    work()  # the first run: lazy initialisation, flex's compilation; its peak is measured
    row["peak_mib"] = round(max(benchlib.peak_rss_mb() - base, 0.0), 1)
    if keep_freed:
        keep_freed_memory()
    t0 = time.perf_counter()
    work()  # a second untimed run, on the settled heap, says how many timed runs fit
    runs = 3 if time.perf_counter() - t0 < 2.0 else 1
    times = []
    for _ in range(runs):
        benchlib.settle_garbage()
        t0 = time.perf_counter()
        work()
        times.append(time.perf_counter() - t0)
    seconds = statistics.median(times)
    row["ms"] = round(1000 * seconds / (size["steps"] if mode == "decode" else 1), 3)
    row["seconds"] = seconds
    return row


def sweep(mode: str, method: str, size: dict, measure_one: Callable[[int], dict[str, Any]]
          ) -> Iterator[dict[str, Any]]:
    """Every length of one (mode, method) from ``size["start"]``, doubling, measured by ``measure_one(length)``, until
    a cap: a row per length, and last a ``{"stop": length, "why": ...}`` where a cap (or the prediction from the last
    two lengths) stopped it."""
    max_len = size["decode_max_len"] if mode == "decode" else size["max_len"]
    done: list[dict[str, Any]] = []
    length = size["start"]
    while length <= max_len:
        if len(done) >= 2:  # predict from the last two lengths: stop before a length that would pass a cap
            a, b = done[-2], done[-1]
            # growth per doubling, at most 4 (no method here is worse than quadratic; noise can say otherwise)
            grow = {key: min(b[key] / a[key], 4.0) if a[key] > 0 else 1.0 for key in ("seconds", "peak_mib")}
            if (b["seconds"] * max(grow["seconds"], 1.0) > 2 * size["max_seconds"]
                    or b["peak_mib"] * max(grow["peak_mib"], 1.0) > size["max_mib"]):
                yield {"stop": length, "why": "predicted past a cap"}
                return
        row = measure_one(length)
        if "failed" in row:
            yield {"stop": length, "why": row["failed"]}
            return
        yield row
        done.append(row)
        if row["seconds"] > size["max_seconds"] or row["peak_mib"] > size["max_mib"]:
            yield {"stop": length * 2, "why": "passed a cap"}
            return
        length *= 2


def child(mode: str, method: str, length: int, size_name: str, threads: int, compiled: bool) -> None:
    """One :func:`measure` in this fresh process (its peak memory is this length's alone), as a JSON line."""
    benchlib.setup(threads)
    warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
    print(json.dumps(measure(mode, method, length, SIZES[size_name], compiled, keep_freed=True)), flush=True)


def _in_child(mode: str, method: str, size_name: str, threads: int, compiled: bool) -> Callable[[int], dict]:
    """``measure_one`` for :func:`sweep`: each length in a fresh process."""
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")])}

    def measure_one(length: int) -> dict[str, Any]:
        cmd = [sys.executable, __file__, "--child", mode, method, str(length), "--size", size_name, "--threads",
               str(threads)] + ([] if compiled else ["--eager-flex"])
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            return {"failed": "took over 600 s"}
        lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
        if done.returncode != 0 or not lines:
            return {"failed": f"failed: {done.stderr.strip()[-300:]}"}
        return json.loads(lines[-1])

    return measure_one


def run(size_name: str, threads: int, compiled: bool, isolated: bool = True,
        methods: tuple[str, ...] = METHODS) -> dict[str, Any]:
    """Every (mode, method), each length in a fresh process when ``isolated`` (its own peak memory); the rows, and
    where each method stopped and why."""
    rows, stops = [], []
    size = SIZES[size_name]
    for mode in MODES:
        for method in methods:
            if (method, mode) in SKIPPED:
                stops.append({"mode": mode, "method": method, "why": SKIPPED[method, mode]})
                continue
            if isolated:
                measure_one = _in_child(mode, method, size_name, threads, compiled)
            else:
                def measure_one(length: int, mode: str = mode, method: str = method) -> dict[str, Any]:
                    return measure(mode, method, length, size, compiled)
            lines = list(sweep(mode, method, size, measure_one))
            mine = [x for x in lines if "stop" not in x]
            rows += mine
            stops += [{"mode": mode, "method": method, **x} for x in lines if "stop" in x]
            print(f"{mode:8s} {method:10s} up to {max([r['length'] for r in mine] or [0])}", flush=True)
    return {"size": size, "rows": rows, "stops": stops}


def plot(payload: dict[str, Any], path: Path) -> None:
    """Time and peak memory against length, one panel per (measure, mode), log-log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for col, mode in enumerate(MODES):
        for method in METHODS:
            pts = sorted((r["length"], r["ms"], r.get("state_mib", r["peak_mib"]))
                         for r in payload["rows"] if r["mode"] == mode and r["method"] == method)
            if not pts:
                continue
            xs = [p[0] for p in pts]
            axes[0, col].plot(xs, [p[1] for p in pts], marker="o", label=method)
            axes[1, col].plot(xs, [max(p[2], 0.1) for p in pts], marker="o", label=method)
        axes[0, col].set_title({"train": "forward + backward", "forward": "forward (prefill)",
                                "decode": "one decoding step"}[mode])
        axes[0, col].set_ylabel("ms")
        axes[1, col].set_ylabel("kept state, MiB" if mode == "decode" else "peak memory above inputs, MiB")
        for ax in axes[:, col]:
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    size = payload["size"]
    fig.suptitle(f"causal attention, batch 1, {size['heads']} heads of {size['head_dim']}, fp32, "
                 f"{payload['machine']['threads']} threads, {payload['machine']['cpu_model']}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tiny", action="store_true", help="toy sizes in one process, eager FlexAttention: a smoke run")
    p.add_argument("--threads", type=int, default=benchlib.THREADS)
    p.add_argument("--out", type=Path, default=None, help="folder of the JSON and PNG (default bench/results)")
    p.add_argument("--eager-flex", action="store_true", help="FlexAttention without torch.compile")
    p.add_argument("--child", nargs=3, metavar=("MODE", "METHOD", "LENGTH"), help=argparse.SUPPRESS)
    p.add_argument("--size", default="full", choices=tuple(SIZES), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]), args.size, args.threads, compiled=not args.eager_flex)
        return
    benchlib.setup(args.threads)
    t0 = time.perf_counter()
    size_name = "tiny" if args.tiny else "full"
    payload = run(size_name, args.threads, compiled=not (args.eager_flex or args.tiny), isolated=not args.tiny)
    payload["wall_s"] = round(time.perf_counter() - t0, 1)
    payload["command"] = " ".join(["bench/long_context.py"] + sys.argv[1:])
    out_dir = args.out or (benchlib.RESULTS_DIR / "quick" if args.tiny else benchlib.RESULTS_DIR)
    path = benchlib.write_results("long_context", payload, out_dir=out_dir)
    payload = json.loads(path.read_text())
    plot(payload, path.with_suffix(".png"))
    print(benchlib.table([{k: r.get(k, "") for k in ("mode", "method", "length", "ms", "peak_mib", "state_mib")}
                          for r in payload["rows"]]))
    for s in payload["stops"]:
        print(f"{s['mode']} {s['method']}: {s['why']}" + (f" (at {s['stop']})" if s.get("stop") else ""))
    print(f"written {path} and {path.with_suffix('.png')} ({payload['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
