"""Where an aiayn training step goes, and the MFU it could reach if everything but its matmuls took no time.

For each ``train_throughput.py`` setup, aiayn's step (forward, fused loss, backward, Adam) runs under
``torch.profiler``, and the kernels' self time is split into:

- ``matmul_ms``: the linear layers and the loss's products, forward and backward (``mkldnn::_linear_pointwise``,
  ``aten::mm`` / ``addmm`` / ``bmm`` / ``baddbmm``);
- ``attention_ms``: torch's CPU flash-attention kernels, forward and backward (attention over more than 64 keys;
  shorter attention trains as two matmuls and a softmax, :mod:`aiayn.accel.cpu.short_attention`, counted with those);
- ``other_ms``: everything else that the profiler saw (norms, dropout, softmax of the loss, the embedding's
  gradient, Adam, copies); the step's wall time minus the three is Python and autograd bookkeeping.

``mfu`` is the step's model FLOPs utilization as ``train_throughput.py`` computes it (3 x forward FLOPs per target
token, against the fastest of a few 2048^3 matmuls timed in the same process just before); ``matmul_only_mfu`` is
the same FLOPs over ``matmul_ms`` alone: the ceiling of a step whose every other kernel and line of Python took no
time. Where it is below a target, only faster matmuls at these shapes can reach it.

The profiler's attribution is not to be trusted op by op on this kind of host (it has put ReLU's backward at 28 ms a
call inside a step where the same call timed by hand took 1.8 ms), so the products are also measured without it:
one step's every matrix product (torch's ``mm``/``addmm``/``bmm`` family and oneDNN's linear, as dispatched, and the
native panel kernel's output-layer products) is recorded with its operands' shapes and strides, and then
**replayed**: the same products, in the same order, each on operands of its own (so no more cache reuse than the
step had), back to back with nothing else between them. ``replay_ms`` is their time, and ``replay_mfu`` the step's
FLOPs over it: the MFU of a step that did nothing but its products at the libraries' rates. The step, the replay
and the 2048^3 peak are timed in alternating rounds (``--rounds``), each figure the median (the peak: the fastest).

    .venv/bin/python bench/train_step_profile.py
    .venv/bin/python bench/train_step_profile.py --setups seq2seq-paper-base --steps 5
    .venv/bin/python bench/train_step_profile.py --setups seq2seq-paper-base --batch 64
    .venv/bin/python bench/train_step_profile.py --setups seq2seq-paper-base --no-profile --rounds 5   # replay only
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
import matmul_peak  # noqa: E402
import train_throughput  # noqa: E402

from aiayn.accel.cpu import native  # noqa: E402
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


#: the dispatched products that a replay repeats (every other op is left out of it)
PRODUCT_OPS = {"aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm", "aten::baddbmm_",
               "mkldnn::_linear_pointwise"}


class _ProductRecorder(TorchDispatchMode):
    """Records each dispatched product of :data:`PRODUCT_OPS` as (op, args, kwargs) with every tensor replaced by
    its (shape, stride, dtype)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, tuple, dict]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        if func._schema.name in PRODUCT_OPS:
            self.calls.append((func, tuple(map(_describe, args)), {k: _describe(v) for k, v in kwargs.items()}))
        return func(*args, **kwargs)


def _describe(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.stride(), value.dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(map(_describe, value))
    return value


def _materialize(value: Any, generator: torch.Generator) -> Any:
    """A fresh tensor of each recorded (shape, stride, dtype): normal entries, scaled as activations are."""
    if isinstance(value, tuple) and len(value) == 4 and value[0] == "tensor":
        _, shape, stride, dtype = value
        t = torch.empty_strided(shape, stride, dtype=dtype)
        return t.normal_(0.0, 0.5, generator=generator) if t.is_floating_point() else t.zero_()
    if isinstance(value, (list, tuple)):
        return type(value)(_materialize(v, generator) for v in value)
    if isinstance(value, dict):
        return {k: _materialize(v, generator) for k, v in value.items()}
    return value


def record_products(step: Callable[[], float]) -> list[Callable[[], Any]]:
    """Run ``step`` once and return its matrix products as calls on fresh operands of the same shapes and strides,
    in the same order, one set of operands per call (see the module docstring)."""
    recorder = _ProductRecorder()
    real_panel = native.panel_linear_once

    def recording_panel(a, b, bias=None, out=None):  # noqa: ANN001, ANN202
        recorder.calls.append((real_panel, (_describe(a), _describe(b)),
                               {"bias": _describe(bias), "out": _describe(out)}))
        with torch.utils._python_dispatch._disable_current_modes():  # its own tensors are not products to record
            return real_panel(a, b, bias, out=out)

    native.panel_linear_once = recording_panel
    try:
        with recorder:
            step()
    finally:
        native.panel_linear_once = real_panel
    g = torch.Generator().manual_seed(0)
    replay = []
    for fn, args, kwargs in recorder.calls:
        a, kw = _materialize(args, g), _materialize(kwargs, g)
        replay.append(functools.partial(fn, *a, **kw))
    return replay


def time_replay(calls: list[Callable[[], Any]]) -> float:
    """Seconds to run ``calls`` back to back."""
    start = time.perf_counter()
    for call in calls:
        call()
    return time.perf_counter() - start


def profile_setup(setup: str, steps: int, quick: bool = False, batch: int | None = None, rounds: int = 3,
                  with_profile: bool = True) -> dict[str, Any]:
    """Time ``setup``'s aiayn training step, its products replayed alone (:func:`record_products`) and the 2048^3
    peak in ``rounds`` alternating rounds (after 2 warm-up steps; ``batch`` sequences a step instead of the
    setup's own); then, ``with_profile``, profile ``steps`` steps. Per-step figures."""
    shape = None if batch is None else {"batch": batch}
    step, tokens = train_throughput.build_step(setup, "aiayn", quick, shape=shape)
    for _ in range(2):
        step()
    replay = record_products(step)
    n = 1024 if quick else 2048
    contenders = {"step": step, "replay": lambda: time_replay(replay), **matmul_peak.matmul_products(n)}
    times = benchlib.alternate(contenders, runs=rounds, warmup=1)
    peak = matmul_peak.peak_flops(n, times, fastest=True)[0]
    s, c = train_throughput.setup_shape(setup, shape), train_throughput.model_config(setup, quick)
    flops = 3 * forward_flops_per_token(c, src_len=s["src"], tgt_len=s["tgt"]) * tokens
    wall_ms, replay_ms = 1e3 * benchlib.median(times["step"]), 1e3 * benchlib.median(times["replay"])
    row: dict[str, Any] = {"setup": setup, "batch": s["batch"], "step_ms": wall_ms, "products": len(replay),
                           "replay_ms": replay_ms, "peak_gflops": peak / 1e9, "mfu": flops / (wall_ms / 1e3) / peak,
                           "replay_mfu": flops / (replay_ms / 1e3) / peak, "rounds": rounds,
                           "times": {k: times[k] for k in ("step", "replay")}}
    if with_profile:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                step()
        split = {k: v / steps for k, v in split_kernel_time(prof.key_averages()).items()}
        row.update(split, python_ms=max(0.0, wall_ms - sum(split.values())),
                   matmul_gflops=flops / split["matmul_ms"] / 1e6,
                   matmul_only_mfu=flops / (split["matmul_ms"] / 1e3) / peak)
    return row


COLUMNS = ["setup", "batch", "step_ms", "replay_ms", "products", "matmul_ms", "attention_ms", "other_ms", "python_ms",
           "matmul_gflops", "peak_gflops", "mfu", "replay_mfu", "matmul_only_mfu"]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """CLI entry point: profile, print the table, write ``bench/results/train_step_profile.json``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    benchlib.add_common_args(p, runs=None)
    p.add_argument("--setups", nargs="+", choices=list(train_throughput.SETUPS), default=None)
    p.add_argument("--steps", type=int, default=3, help="profiled steps per setup")
    p.add_argument("--rounds", type=int, default=3,
                   help="alternating rounds of the step, its replayed products and the 2048^3 peak (default 3)")
    p.add_argument("--no-profile", action="store_true", help="time the step and its replay only, no profiler")
    benchlib.add_batch_arg(p, "train_step_profile-batch<N>.json")
    args = p.parse_args(argv)
    benchlib.setup(args.threads)
    setups, t0 = args.setups or list(train_throughput.SETUPS), time.perf_counter()
    payload: dict[str, Any] = {"steps": args.steps,
                               "rows": [profile_setup(s, args.steps, args.quick, args.batch, args.rounds,
                                                     not args.no_profile) for s in setups]}
    payload["wall_s"] = time.perf_counter() - t0
    name = "train_step_profile" + ("" if args.batch is None else f"-batch{args.batch}")
    benchlib.report(name, payload, COLUMNS, args.quick)
    return payload


if __name__ == "__main__":
    main()
