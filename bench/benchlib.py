"""Shared helpers for the benchmark scripts: thread setup, alternating timed runs, tables, JSON results.

Every comparison in ``bench/`` follows the same rules: the contenders run in one process on the same machine,
their runs alternate (A, B, C, A, B, C, ...) so that background load hits them alike, and we report the median
of the timed runs and the ratio of medians.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

RESULTS_DIR = Path(__file__).resolve().parent / "results"
THREADS = 2
#: ``--malloc``: glibc's default ``malloc`` settings, or freed memory kept in the process as the ``aiayn`` command
#: runs (:func:`aiayn.accel.cpu.allocator.keep_freed_memory`). Passed to every process of a run through this environment
#: variable, so every contender's subprocess runs under the same setting.
MALLOC_ENV = "AIAYN_BENCH_MALLOC"
MALLOC_SETTINGS = ("glibc", "keep-freed")


def setup(threads: int = THREADS, seed: int = 0) -> None:
    """Pin torch to ``threads`` intra-op threads (and 1 inter-op thread), seed it, and apply the run's ``malloc``
    setting (:func:`malloc_setting`) to this process."""
    if malloc_setting() == "keep-freed":
        try:
            from aiayn.accel.cpu.allocator import keep_freed_memory
        except ImportError:  # a revision before aiayn.accel, timed by ab_revisions.py
            from aiayn.allocator import keep_freed_memory  # type: ignore[no-redef]

        keep_freed_memory()
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set in this process (e.g. under pytest)
        pass
    torch.manual_seed(seed)


def malloc_setting() -> str:
    """The run's ``malloc`` setting, one of ``MALLOC_SETTINGS`` (from ``MALLOC_ENV``; default "glibc")."""
    setting = os.environ.get(MALLOC_ENV, "glibc").strip() or "glibc"
    if setting not in MALLOC_SETTINGS:
        raise ValueError(f"{MALLOC_ENV}={setting!r}: choose one of {', '.join(MALLOC_SETTINGS)}")
    return setting


class _MallocAction(argparse.Action):
    """``--malloc X``: export X in ``MALLOC_ENV``, so this process and every subprocess it starts apply it."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        os.environ[MALLOC_ENV] = values
        setattr(namespace, self.dest, values)


def add_common_args(parser: argparse.ArgumentParser, runs: int | None = 5, malloc: bool = True) -> None:
    """Add the shared options ``--quick``, ``--threads``, ``--malloc`` (unless ``malloc`` is False: a script whose
    processes choose their allocator setting themselves) and ``--runs`` (unless ``runs`` is None)."""
    parser.add_argument("--quick", action="store_true", help="a small, fast version of the benchmark")
    parser.add_argument("--threads", type=int, default=THREADS, help=f"torch threads (default {THREADS})")
    if malloc:
        add_malloc_arg(parser)
    if runs is not None:
        parser.add_argument("--runs", type=int, default=None, help=f"timed runs each (default {runs})")


def add_batch_arg(parser: argparse.ArgumentParser, results: str) -> None:
    """Add ``--batch N`` (a positive number of sequences per step instead of each setup's own); ``results``: the
    results' file name, for the help text."""
    parser.add_argument("--batch", type=_positive_int, default=None,
                        help=f"sequences per step for every setup run, instead of each setup's own; results go to "
                             f"{results}")


BF16_CHOICES = ("auto", "on", "off")


def add_bf16_arg(parser: argparse.ArgumentParser) -> None:
    """Add ``--bf16 {auto,on,off}``: whether a benchmark times its bf16 contenders too."""
    parser.add_argument("--bf16", choices=BF16_CHOICES, default="auto",
                        help="time the bf16 contenders: auto (the default) only where this CPU multiplies bf16 "
                             "natively (AVX512-BF16 / AMX, as oneDNN reports); elsewhere every system emulates bf16, "
                             "several times slower than fp32, and those runs took most of the suite's time")


def wants_bf16(choice: str) -> bool:
    """``--bf16``'s answer: "on", "off", or for "auto" whether oneDNN multiplies bf16 natively on this CPU."""
    if choice != "auto":
        return choice == "on"
    try:
        from aiayn.accel.cpu.packed import onednn_bf16_available
    except ImportError:  # older revisions, timed by ab_revisions.py
        return False
    return onednn_bf16_available()


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: give a positive number of sequences per step")
    return value


def add_malloc_arg(parser: argparse.ArgumentParser) -> None:
    """Add ``--malloc`` (see ``MALLOC_ENV``)."""
    parser.add_argument("--malloc", choices=MALLOC_SETTINGS, action=_MallocAction, default=None,
                        help="glibc: glibc's default malloc settings (the default); keep-freed: every process of "
                             "the run, every contender alike, keeps freed memory as the aiayn command does "
                             "(aiayn.accel.cpu.allocator.keep_freed_memory; docs/performance.md)")


def alternate(fns: dict[str, Callable[[], Any]], runs: int = 5, warmup: int = 1) -> dict[str, list[float]]:
    """Time each callable ``runs`` times, interleaved (a, b, a, b, ...), after ``warmup`` untimed rounds.

    Every timed run starts with Python's cyclic garbage collector settled (:func:`settle_garbage`, untimed), so a
    collection of garbage that an earlier run, another contender or the imports left lands in no timed run.

    Args:
        fns: name -> zero-argument callable (one full unit of work, e.g. one generate call).
        runs: timed rounds.
        warmup: untimed rounds first (allocator, lazy init, caches).
    Returns:
        name -> list of ``runs`` wall times in seconds.
    """
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    settle_garbage(freeze=True)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            settle_garbage()
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def settle_garbage(freeze: bool = False) -> None:
    """Run a full collection of Python's cyclic garbage collector now; with ``freeze``, then move every object
    still alive (the imports', the models') to the collector's permanent generation (:func:`gc.freeze`).

    After ``import torch`` a process holds about 170,000 objects that the collector tracks, and a full collection
    of them took 55-73 ms on the 2-core benchmark host. The first one comes at whatever allocation crosses the
    collector's thresholds: in a fresh process timing beam-4 decodes it fell in the third or fourth decode and
    made it 30% slower (2-core AMD EPYC Zen 4, 2026-11-25). Collecting before every timed run, with the
    long-lived objects frozen so that those collections are cheap, keeps that one-time cost out of every
    contender's timings alike; the collections a run's own allocations trigger stay in it.
    """
    gc.collect()
    if freeze:
        gc.freeze()


def run_json_child(cmd: list[str], env: dict[str, str] | None = None) -> Any:
    """Run ``cmd`` (a benchmark's own ``--child`` mode) in a fresh interpreter and parse the JSON it prints last.

    Timing in a child process keeps other systems' thread pools, caches and allocator state out of the timed run.
    """
    done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def matmul_floor(weights: Sequence[torch.Tensor], rows: int, steps: int) -> Callable[[], None]:
    """The bare linear layers of ``steps`` decoding steps: one ``F.linear`` per weight per step, nothing else.

    A decoding step of any fp32 implementation that multiplies by these weights through ``F.linear`` costs at
    least this (no attention, norms, cache, search or framework overhead; at batch 1 it streams every weight byte
    once per step). ``t_peer / t_floor`` therefore bounds the speed-up over a peer that is possible without fewer
    weight bytes (int8), fewer weights, or a faster matmul kernel than ``F.linear``'s (oneDNN's prepacked output
    layer in :mod:`aiayn.accel.cpu.packed` is one).

    Args:
        weights: (out, in) matrices used once per step, in the layout the model itself uses.
        rows: rows multiplied per step (batch x beams).
        steps: decoding steps per call.
    Returns:
        a zero-argument callable for :func:`alternate`.
    """
    xs = [torch.randn(rows, w.shape[1], dtype=w.dtype) for w in weights]

    def run() -> None:
        with torch.inference_mode():
            for _ in range(steps):
                for x, w in zip(xs, weights):
                    torch.nn.functional.linear(x, w)

    return run


def step_linears(module: torch.nn.Module, skip: Sequence[str] = ()) -> list[torch.Tensor]:
    """The distinct weights of ``module``'s ``nn.Linear`` layers (tied ones once), except those whose own name
    (the last part of the dotted path) is in ``skip``: e.g. ``kv_proj``, the cross-attention key/value
    projection, computed once per sentence rather than per step."""
    seen: set[int] = set()
    out = []
    for name, m in module.named_modules():
        if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] not in skip and id(m.weight) not in seen:
            seen.add(id(m.weight))
            out.append(m.weight.detach())
    return out


def median(xs: Sequence[float]) -> float:
    """Median of a non-empty sequence."""
    return float(statistics.median(xs))


def spread(xs: Sequence[float]) -> float:
    """Relative spread (max - min) / median of the timings, a quick noise indicator."""
    m = median(xs)
    return float((max(xs) - min(xs)) / m) if m > 0 else 0.0


def fmt(x: Any) -> str:
    """Format a table cell: floats with 3 significant digits (or 1 decimal when large), others as str."""
    if isinstance(x, float):
        if x != x:  # NaN
            return "-"
        if abs(x) >= 100:
            return f"{x:,.1f}"
        return f"{x:.3g}"
    return str(x)


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """A plain-text table of ``rows`` (dicts), columns in the given order (default: keys of the first row)."""
    if not rows:
        return "(no rows)"
    columns = list(columns or rows[0].keys())
    cells = [[fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    line = "  ".join(c.ljust(w) for c, w in zip(columns, widths))
    sep = "  ".join("-" * w for w in widths)
    body = ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join([line, sep, *body])


def _cpuinfo(key: str) -> str:
    """The first value of ``key`` in /proc/cpuinfo (Linux), or "" where unknown."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.split(":", 1)[0].strip() == key:
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux), or "" where unknown: hosts change between runs."""
    return _cpuinfo("model name") or platform.processor() or ""


def cpu_id() -> str:
    """The CPU's vendor, family and model numbers ("AuthenticAMD 25/1": Zen 3), which a virtual machine's model name
    ("AMD EPYC") leaves out; "" where unknown."""
    parts = [_cpuinfo("vendor_id"), _cpuinfo("cpu family"), _cpuinfo("model")]
    return f"{parts[0]} {parts[1]}/{parts[2]}" if all(parts) else ""


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_id": cpu_id(),
        "isa": torch.backends.cpu.get_cpu_capability(),  # the vector instructions torch's own kernels use
        "loadavg_1m": round(load[0], 2),
        "malloc": malloc_setting(),
    }


def write_results(name: str, payload: dict[str, Any], quick: bool = False,
                  out_dir: Path | None = None) -> Path:
    """Write ``payload`` plus machine info to ``<out_dir>/<name>.json`` (``<name>-keep-freed.json`` under
    ``--malloc keep-freed``, so runs under both settings are kept side by side).

    The default directory is ``bench/results``, or ``bench/results/quick`` for ``--quick`` runs (so that quick
    runs never overwrite real-size results).
    """
    out_dir = out_dir or (RESULTS_DIR / "quick" if quick else RESULTS_DIR)
    out_dir.mkdir(parents=True, exist_ok=True)
    if malloc_setting() != "glibc":
        name = f"{name}-{malloc_setting()}"
    path = out_dir / f"{name}.json"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    data = {"benchmark": name, "machine": machine_info(), "time": stamp, **payload}
    path.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    return path


def _proc_status_mb(key: str) -> float | None:
    """A memory line of /proc/self/status (``VmHWM``, ``VmRSS``) in MiB, or None where there is no /proc."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (VmHWM), in MiB (psutil is not required)."""
    peak = _proc_status_mb("VmHWM")
    if peak is not None:
        return peak
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mb() -> float:
    """Current resident set size (VmRSS) in MiB."""
    rss = _proc_status_mb("VmRSS")
    return float("nan") if rss is None else rss


def report(name: str, payload: dict[str, Any], columns: list[str], quick: bool) -> Path:
    """Print ``payload["rows"]`` as a table, write the JSON (:func:`write_results`) and say where and how long."""
    print(table(payload["rows"], columns))
    path = write_results(name, payload, quick=quick)
    print(f"written {path} ({payload['wall_s']:.0f} s)")
    return path


# aiayn as its users get it, on this revision and on older ones. ab_revisions.py runs the workers of
# translate_beam.py, generate_lm.py and train_throughput.py against other git revisions of aiayn, so these helpers
# detect the API instead of assuming it. Since the core/accelerator split a model is built as the plain reference and
# accelerated by one call (aiayn.accel.accelerate, which honours AIAYN_ACCEL=none); before it, build_model already
# gave the CPU fast paths (packed linears, fused loss), load_pretrained applied the decoding layout
# (aiayn.nn.layout), and the training loss took the output weight from the forward pass (``output_weight``).

INFERENCE_VARIANTS = ("float32", "int8", "bfloat16")


def has_accel_api() -> bool:
    """Whether the ``aiayn`` this process imports applies its CPU acceleration through :mod:`aiayn.accel`."""
    return importlib.util.find_spec("aiayn.accel") is not None


def has_bf16_inference() -> bool:
    """Whether this ``aiayn`` has ``--dtype bfloat16`` inference (:func:`aiayn.nn.precision.cast_for_inference`)."""
    return importlib.util.find_spec("aiayn.nn.precision") is not None


def for_decoding(model: nn.Module, variant: str = "float32") -> nn.Module:
    """``model`` (a freshly built reference on the CPU) made what ``load_pretrained`` gives users for decoding: in
    eval mode, int8-quantized (``--int8``; a copy) or cast to bf16 (``--dtype bfloat16``) per ``variant``, then
    accelerated (:func:`aiayn.accel.accelerate`; older revisions: their own layout)."""
    if variant not in INFERENCE_VARIANTS:
        raise ValueError(f"variant {variant!r}: one of {INFERENCE_VARIANTS}")
    model = model.eval()
    if has_accel_api():
        from aiayn.accel import accelerate, quantize_int8

        if variant == "int8":
            model = quantize_int8(model)
        elif variant == "bfloat16":
            from aiayn.nn.precision import cast_for_inference

            cast_for_inference(model, torch.bfloat16)
        return accelerate(model, "decode")
    if variant == "int8":
        from aiayn.nn.quantize import quantize_int8 as old_quantize_int8

        return old_quantize_int8(model)
    if variant == "bfloat16":  # which also gave a CPU model the decoding layout
        from aiayn.nn.precision import cast_for_inference

        return cast_for_inference(model, torch.bfloat16)
    try:
        from aiayn.nn.layout import cpu_inference_layout
    except ImportError:  # older still: only the column-major layout
        from aiayn.nn.layout import column_major_linears as cpu_inference_layout
    return cpu_inference_layout(model)


def for_training(model: nn.Module) -> nn.Module:
    """``model`` (a freshly built reference) accelerated for training as the trainer does it
    (:func:`aiayn.accel.accelerate`; older revisions' ``build_model`` had done it already)."""
    if has_accel_api():
        from aiayn.accel import accelerate

        return accelerate(model, "train")
    return model


def training_loss(model: nn.Module, forward: Callable[..., Any], labels: Tensor,
                  label_smoothing: float = 0.0) -> Callable[[], Tensor]:
    """The trainer's loss: a zero-argument callable giving the summed label-smoothed loss of ``labels`` (B, T) under
    ``forward(**kwargs)`` (the model's call with ``compute_logits=False``), through ``model.lm_head.loss`` (fused on
    an accelerated CPU model); older revisions: their fused loss on the output weight, as their trainer called it."""
    if has_accel_api():
        def loss() -> Tensor:
            return model.lm_head.loss(forward().hidden, labels, label_smoothing)[0]
        return loss
    import inspect

    from aiayn.train.fused_loss import linear_label_smoothed_nll  # type: ignore[import-not-found]

    # the output weight as the forward's graph holds it; revisions before ``output_weight`` take the parameter
    kw = {"output_weight": True} if "output_weight" in inspect.signature(model.forward).parameters else {}

    def old_loss() -> Tensor:
        out = forward(**kw)
        weight = out.output_weight if kw else model.lm_head.proj.weight
        return linear_label_smoothed_nll(out.hidden, weight, labels, label_smoothing)[0]
    return old_loss


def exact_gelu() -> dict[str, Any]:
    """Config overrides for torch's exact GELU where this revision's config can approximate it (``gelu_approximate``),
    so that a GPT-2 preset matches a peer built with the exact GELU at every revision."""
    from aiayn.config import ModelConfig

    return {"gelu_approximate": "none"} if "gelu_approximate" in ModelConfig.__dataclass_fields__ else {}
