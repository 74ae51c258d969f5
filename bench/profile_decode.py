"""Where aiayn's batch-1 decoding spends its time: greedy generation and beam-4 translation.

1. Per-step fixed overhead: the same decoders (same layer count, same code path) at a tiny width, where nearly
   all time is Python and dispatch, timed against the same peers (HF, CTranslate2) in alternating runs. With
   the real-size times this bounds what removing overhead can buy: ``hf_real / (ours_real - ours_floor)``.
2. For aiayn at the real size: wall time per decoder step; what ``torch.profiler`` attributes to matmul and
   attention kernels, to all other aten ops, and what is left (Python, dispatch, profiler); aten ops launched
   per step; the heaviest aten ops; and the heaviest Python functions under ``cProfile``.

Runs with 1 thread by default: on a shared machine 2-thread runs are dominated by scheduling waits, which
blur the attribution.

    .venv/bin/python bench/profile_decode.py
    .venv/bin/python bench/profile_decode.py --quick
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
import generate_lm  # noqa: E402
import translate_beam  # noqa: E402
from generate_lm import LMSize  # noqa: E402
from translate_beam import EOS, SIZES, EosMask, Seq2SeqSize, aiayn_model  # noqa: E402

from aiayn import ModelConfig, build_model  # noqa: E402
from aiayn.generate import generate, translate  # noqa: E402
from aiayn.nn.layout import cpu_inference_layout  # noqa: E402
from aiayn.nn.quantize import quantize_int8  # noqa: E402

GEMM_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm",
            "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_attention_math",
            "mkldnn::_linear_pointwise",  # oneDNN's linear: packed output layers, every layer on the oneDNN backend
            "quantized::linear_dynamic"}  # int8 linears
KERNEL_PREFIXES = ("aten::", "mkldnn::", "quantized::")  # torch.profiler's names for kernel calls


def profile_fn(fn: Callable[[], Any], steps: int, repeats: int = 3, top: int = 12) -> dict[str, Any]:
    """Profile ``fn`` (one full decode of ``steps`` decoder steps) three ways; returns a summary dict."""
    fn()  # warm up
    walls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t0)
    wall = benchlib.median(walls)

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        fn()
        prof_wall = time.perf_counter() - t0
    events = prof.events()
    top_level = [e for e in events if e.cpu_parent is None and e.name.startswith(KERNEL_PREFIXES)]
    averages = prof.key_averages()
    self_us = {a.key: a.self_cpu_time_total for a in averages if a.key.startswith(KERNEL_PREFIXES)}
    gemm = sum(v for k, v in self_us.items() if k in GEMM_OPS) / 1e3
    other = sum(v for k, v in self_us.items() if k not in GEMM_OPS) / 1e3
    heavy = sorted(averages, key=lambda a: a.self_cpu_time_total, reverse=True)[:top]

    prof_py = cProfile.Profile()
    prof_py.enable()
    fn()
    prof_py.disable()
    stats = pstats.Stats(prof_py)
    rows = []
    for (file, line, func), (_cc, ncalls, tottime, cumtime, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append({"function": f"{Path(file).name}:{line}({func})", "calls_per_step": ncalls / steps,
                     "self_ms_per_step": 1e3 * tottime / steps, "cum_ms_per_step": 1e3 * cumtime / steps})
    rows.sort(key=lambda r: r["self_ms_per_step"], reverse=True)
    return {
        "steps": steps,
        "wall_ms_per_step": 1e3 * wall / steps,
        "profiled_wall_ms_per_step": 1e3 * prof_wall / steps,
        "gemm_attention_ms_per_step": gemm / steps,
        "other_aten_ms_per_step": other / steps,
        "python_overhead_ms_per_step": (1e3 * prof_wall - gemm - other) / steps,
        "aten_calls_per_step": len(top_level) / steps,
        "top_aten": [{"op": a.key, "calls_per_step": a.count / steps,
                      "self_ms_per_step": a.self_cpu_time_total / 1e3 / steps} for a in heavy],
        "top_python": rows[:top],
    }


def greedy_case(size: LMSize, new_tokens: int) -> tuple[Callable[[], Any], int]:
    """aiayn greedy generation at batch 1 (16-token prompt, no stop id): (fn, decoder steps)."""
    cfg = ModelConfig.preset("gpt2-small", n_layers=size.n_layers, d_model=size.d_model,
                             n_heads=size.n_heads, d_ff=4 * size.d_model, vocab_size=size.vocab_size,
                             max_len=size.max_len, dropout=0.0)
    model = cpu_inference_layout(build_model(cfg).eval())
    prompt = torch.randint(5, size.vocab_size - 1, (1, 16)).tolist()
    return (lambda: generate(model, prompt, max_new_tokens=new_tokens, greedy=True, stop_ids=())), new_tokens


def beam_case(size: Seq2SeqSize, out_len: int) -> tuple[Callable[[], Any], int, EosMask]:
    """aiayn beam-4 translation at batch 1 (20-token source, fixed output length): (fn, steps, eos mask)."""
    model = aiayn_model(size)
    src = torch.randint(5, size.vocab_size - 2, (1, 20))
    mask = EosMask(model.lm_head, EOS, out_len)

    def run() -> Any:
        mask.reset()
        return translate(model, src, beam_size=4, alpha=0.6, max_len_a=0.0, max_len_b=out_len)

    return run, out_len + 1, mask


def print_summary(title: str, s: dict[str, Any]) -> None:
    """Print one case's summary as tables."""
    print(f"\n== {title}: {s['wall_ms_per_step']:.2f} ms/step wall "
          f"({s['profiled_wall_ms_per_step']:.2f} profiled): matmul+attention "
          f"{s['gemm_attention_ms_per_step']:.2f}, other aten {s['other_aten_ms_per_step']:.2f}, "
          f"python/dispatch {s['python_overhead_ms_per_step']:.2f} ms; "
          f"{s['aten_calls_per_step']:.0f} kernel calls/step")
    print(benchlib.table(s["top_aten"]))
    print(benchlib.table(s["top_python"]))


def overhead_floors(runs: int, new_tokens: int, out_len: int = 20) -> list[dict[str, Any]]:
    """Per-step ms of aiayn and its peers at batch 1, at the real size and at a tiny width (the fixed overhead)."""
    rows = []
    for label, lm in (("real", LMSize()), ("tiny", LMSize(d_model=24, vocab_size=64))):
        ours, hf = generate_lm.build_pair(lm)
        r = generate_lm.run_case(ours, quantize_int8(ours), hf, 1, 16, new_tokens, runs)
        rows.append({"case": "greedy", "width": label, "aiayn_ms_per_step": r["aiayn_ms_per_step"],
                     "hf_ms_per_step": r["hf_ms_per_step"], "ct2_ms_per_step": float("nan")})
    for label, size in (("real", SIZES["multi30k"]), ("tiny", Seq2SeqSize("tiny", 16, 16, 4, 3, 64))):
        torch.manual_seed(0)
        ours, hf = translate_beam.aiayn_model(size), translate_beam.marian_model(size)
        with tempfile.TemporaryDirectory(prefix="aiayn-bench-ct2-") as tmp:
            ct2 = translate_beam.convert_to_ct2(hf, Path(tmp))
            r = translate_beam.run_case(size, ours, quantize_int8(ours), hf, ct2, 1, 20, out_len, runs)
        ms = {k: 1e3 * benchlib.median(v) / r["steps"] for k, v in r["times"].items()}
        rows.append({"case": "beam-4", "width": label, "aiayn_ms_per_step": ms["aiayn"],
                     "hf_ms_per_step": ms["transformers"],
                     "ct2_ms_per_step": ms.get("ctranslate2-float32", float("nan"))})
    for case in ("greedy", "beam-4"):
        real, tiny = (next(r for r in rows if r["case"] == case and r["width"] == w) for w in ("real", "tiny"))
        real["ratio_vs_hf"] = real["hf_ms_per_step"] / real["aiayn_ms_per_step"]
        real["ratio_vs_hf_if_no_overhead"] = real["hf_ms_per_step"] / max(
            real["aiayn_ms_per_step"] - tiny["aiayn_ms_per_step"], 1e-9)
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """CLI entry point: measure overhead floors, profile both cases, print, write the JSON."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    benchlib.add_common_args(p, runs=5)  # --quick: 2-layer LM, 32 new tokens, 3 runs
    p.set_defaults(threads=1)
    args = p.parse_args(argv)
    benchlib.setup(args.threads)
    t0 = time.perf_counter()
    runs, new_tokens = args.runs or (3 if args.quick else 5), 32 if args.quick else 128
    floors = overhead_floors(runs, new_tokens)
    print(f"per-step ms at batch 1, real size vs tiny width (fixed overhead), {torch.get_num_threads()} thread(s)")
    print(benchlib.table(floors, ["case", "width", "aiayn_ms_per_step", "hf_ms_per_step", "ct2_ms_per_step",
                                  "ratio_vs_hf", "ratio_vs_hf_if_no_overhead"]))
    lm = LMSize(n_layers=2) if args.quick else LMSize()
    fn, steps = greedy_case(lm, new_tokens)
    greedy = profile_fn(fn, steps)
    print_summary(f"aiayn greedy batch 1, GPT-2-like {lm.n_layers}x{lm.d_model}", greedy)
    fn, steps, mask = beam_case(SIZES["multi30k"], 20)
    with mask:
        beam = profile_fn(fn, steps)
    print_summary("aiayn beam-4 batch 1, multi30k size", beam)
    payload = {"floors": floors, "greedy": greedy, "beam": beam, "wall_s": time.perf_counter() - t0}
    path = benchlib.write_results("profile_decode", payload, quick=args.quick)
    print(f"written {path} ({payload['wall_s']:.0f} s)")
    return payload


if __name__ == "__main__":
    main()
