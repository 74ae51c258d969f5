"""The small kernels of a decoding step, per call: every path a linear layer can take, greedy search's two ways to
the argmax of an output layer, and attention's two ways.

Microseconds per call (median of ``--runs`` batches of calls, warm caches, in one process):

1. Linears: every (in, out) layer of the benchmarked decoders (Multi30k size 256/1024 with the 8000-word output
   layer, the GPT-2-like 384/1536 with 50257 words, paper-base 512/2048 with 32000 words) at the row counts of
   decoding (1 = greedy batch 1, 4 = one sentence's beams, 16, 128 = 32 sentences x 4 beams), through
   ``F.linear`` (MKL in x86 builds) with the weight row-major and column-major (:mod:`aiayn.nn.layout`), oneDNN with
   the plain weight and with the prepacked one (:mod:`aiayn.nn.packed`), oneDNN behind the autograd wrapper
   (``cpu_gemm.OneDNNLinear``), the native panel kernel (``native_panel_us``, :func:`aiayn.native.panel_linear`,
   where the kernels are built), and ``PackedLinear`` as aiayn dispatches it under the active fp32 policy
   (``aiayn_us``, :mod:`aiayn.nn.cpu_gemm`; ``AIAYN_FP32_CPU_GEMM`` forces one).
2. Greedy search's argmax over an output layer (1, 2, 4 and 16 rows), with caches evicted before every call (a
   96 MB read: a batch-1 step streams more than the L3 cache holds, so each layer comes from memory): the fp32
   product and :func:`aiayn.generate.topk.row_argmax` against the screen of :mod:`aiayn.generate.screened_argmax`
   in the dtype it takes for that many rows on this CPU (``screen``; row counts it does not screen here are left
   out), whatever the layer's size. ``settled``: the screen settled every row (random weights and hidden states
   are its hardest case: no logit stands out, so up to dozens of tokens fall within the bound; when a row has
   more than ``MAX_CANDIDATES`` the screen gives up and greedy search computes the fp32 logits, which the
   screened time then leaves out); ``same``: both chose the same ids.
3. Attention of a decoding step: one query per row over a time-major self-attention cache (5 and 20 keys), and the
   cross-attention with a sentence's 4 beams folded into one block over 20 source positions, through torch's flash
   kernel (``F.scaled_dot_product_attention``, what aiayn runs) and two matmuls around a softmax (aiayn's reference
   backend).

    .venv/bin/python bench/decode_kernels.py
    .venv/bin/python bench/decode_kernels.py --quick
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

from aiayn import native  # noqa: E402
from aiayn.generate.screened_argmax import make_screen, screen_dtype, screened_argmax  # noqa: E402
from aiayn.generate.topk import row_argmax  # noqa: E402
from aiayn.nn import cpu_gemm  # noqa: E402
from aiayn.nn.attention import scaled_dot_product_attention  # noqa: E402
from aiayn.nn.layout import column_major_linears  # noqa: E402
from aiayn.nn.packed import PackedLinear, onednn_available, pack_weight, packed_linear  # noqa: E402

# (model, in, out): a decoder layer's linears (fused QKV, attention output, FFN in and out) and the output layer
LAYERS = [("multi30k", 256, 768), ("multi30k", 256, 256), ("multi30k", 256, 1024), ("multi30k", 1024, 256),
          ("multi30k", 256, 8000),
          ("gpt2-like", 384, 1152), ("gpt2-like", 384, 384), ("gpt2-like", 384, 1536), ("gpt2-like", 1536, 384),
          ("gpt2-like", 384, 50257),
          ("paper-base", 512, 1536), ("paper-base", 512, 512), ("paper-base", 512, 2048), ("paper-base", 2048, 512),
          ("paper-base", 512, 32000)]
ROWS = (1, 4, 16, 128)
# (model, in, out): output layers of decoder-only models, for greedy search's argmax
ARGMAX_LAYERS = [("lm-16k", 256, 16384), ("paper-base", 512, 32000), ("gpt2-like", 384, 50257)]
ARGMAX_ROWS = (1, 2, 4, 16)
# (model, decoder rows, heads, head width, source length)
ATTENTION = [("multi30k", 4, 4, 64, 20), ("multi30k", 128, 4, 64, 20), ("paper-base", 4, 8, 64, 20),
             ("paper-base", 128, 8, 64, 20)]
LINEAR_COLUMNS = ["model", "in", "out", "rows", "row_major_us", "column_major_us", "onednn_us", "onednn_packed_us",
                  "onednn_autograd_us", "native_panel_us", "aiayn_us", "fastest"]
ARGMAX_COLUMNS = ["model", "in", "out", "rows", "screen", "fp32_us", "screened_us", "speedup", "settled", "same"]
ATTENTION_COLUMNS = ["model", "rows", "heads", "kind", "keys", "flash_us", "two_matmuls_us", "ratio"]


def per_call_us(fns: dict[str, Callable[[], Any]], runs: int, budget_s: float = 0.02) -> dict[str, float]:
    """Median microseconds per call of each callable: ``runs`` alternating batches of calls, each batch sized to
    take about ``budget_s``."""
    counts = {}
    for name, fn in fns.items():
        fn()
        t0 = time.perf_counter()
        fn()
        counts[name] = max(1, int(budget_s / max(time.perf_counter() - t0, 1e-7)))
    times = benchlib.alternate({name: (lambda fn=fn, n=counts[name]: [fn() for _ in range(n)])
                                for name, fn in fns.items()}, runs=runs)
    return {name: 1e6 * benchlib.median(ts) / counts[name] for name, ts in times.items()}


def linear_rows(layers: list[tuple[str, int, int]], rows: tuple[int, ...], runs: int) -> list[dict[str, Any]]:
    """One row per (layer, row count): microseconds per call of every path (see the module docstring)."""
    out = []
    for model, n_in, n_out in layers:
        layer = torch.nn.Linear(n_in, n_out)
        column_major = column_major_linears(torch.nn.Linear(n_in, n_out))
        column_major.load_state_dict(layer.state_dict())
        aiayn = PackedLinear.from_linear(column_major)  # what cpu_inference_layout gives on the oneDNN backend
        w, b = layer.weight.detach(), layer.bias.detach()
        packed = pack_weight(w)
        panel = native.panel_linear_plan(w, b) if native.library() is not None else None
        for m in rows:
            with torch.inference_mode():
                us = per_call_us(_linear_paths(torch.randn(m, n_in), w, b, column_major, packed, aiayn, panel), runs)
            fastest = min((k for k in us if k != "aiayn_us"), key=us.__getitem__)
            out.append({"model": model, "in": n_in, "out": n_out, "rows": m, **us,
                        "fastest": fastest.removesuffix("_us")})
    return out


def _linear_paths(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, column_major: torch.nn.Linear,
                  packed: torch.Tensor, aiayn: PackedLinear,
                  panel: Callable[[torch.Tensor], torch.Tensor] | None = None) -> dict[str, Callable[[], Any]]:
    """The callables :func:`linear_rows` times for input x (M, in): one per path (``panel``: the native panel
    kernel's plan for this layer, where the kernels are built)."""
    return {"row_major_us": lambda: F.linear(x, w, b),
            "column_major_us": lambda: F.linear(x, column_major.weight, column_major.bias),
            "onednn_us": lambda: cpu_gemm._onednn_nt(x, w, b),
            "onednn_packed_us": lambda: packed_linear(x, packed, b),
            "onednn_autograd_us": lambda: cpu_gemm.OneDNNLinear.apply(x, w, b),
            **({"native_panel_us": lambda: panel(x)} if panel is not None else {}),
            "aiayn_us": lambda: aiayn(x)}


def cold_call_us(fns: dict[str, Callable[[], Any]], calls: int, evict_mb: int = 96) -> dict[str, float]:
    """Median microseconds of one call of each callable, alternating, with the caches evicted before every call
    by reading ``evict_mb`` MB (clean lines, as a decoding step's other weights leave them)."""
    junk = torch.ones(evict_mb << 18)  # float32: 4 bytes each
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(calls):
        for name, fn in fns.items():
            junk.sum()
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: 1e6 * benchlib.median(ts) for name, ts in times.items()}


def argmax_rows(layers: list[tuple[str, int, int]], rows: tuple[int, ...], runs: int) -> list[dict[str, Any]]:
    """One row per (output layer, row count): greedy search's argmax through the fp32 product and through the
    screen greedy search takes for that many rows on this CPU, whatever the size (none: no row), cold caches (see
    the module docstring)."""
    out = []
    for model, n_in, n_out in layers:
        proj = PackedLinear.from_linear(column_major_linears(torch.nn.Linear(n_in, n_out, bias=False)))
        for m in rows:
            dtype = screen_dtype(m, 1 << 62)  # the dtype GreedyHead screens m rows in here, whatever the size
            if dtype is None:
                continue
            screen = make_screen(proj.weight, dtype)  # GreedyHead builds it once per weight
            h = torch.randn(m, n_in)
            with torch.inference_mode():
                ids = screened_argmax(h, proj.weight, screen)  # None: some row had too many candidates
                settled = ids is not None
                same = settled and torch.equal(row_argmax(proj(h)), ids)
                us = cold_call_us({"fp32_us": lambda proj=proj, h=h: row_argmax(proj(h)),
                                   "screened_us": lambda proj=proj, h=h, screen=screen: screened_argmax(
                                       h, proj.weight, screen)}, 10 * runs)
            out.append({"model": model, "in": n_in, "out": n_out, "rows": m, "screen": str(dtype)[6:], **us,
                        "speedup": us["fp32_us"] / us["screened_us"], "settled": settled, "same": same})
    return out


def two_matmuls(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(Dh)) v for (B, H, T, Dh) q and (B, H, S, Dh) k, v, unfused: aiayn's reference attention
    backend (matmul, softmax, matmul)."""
    return scaled_dot_product_attention(q, k, v, backend="reference")[0]


def _attention_paths(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> dict[str, Callable[[], Any]]:
    """The callables :func:`attention_rows` times: the flash kernel and :func:`two_matmuls`."""
    return {"flash_us": lambda: F.scaled_dot_product_attention(q, k, v), "two_matmuls_us": lambda: two_matmuls(q, k, v)}


def attention_rows(cases: list[tuple[str, int, int, int, int]], runs: int) -> list[dict[str, Any]]:
    """One row per (case, kind): self-attention over a time-major cache and grouped cross-attention."""
    out = []
    for model, rows, heads, dh, src in cases:
        cache = torch.randn(2, src + 2, rows, heads, dh)  # (k|v, capacity, B, H, Dh), time-major as SelfAttnCache
        q = torch.randn(rows, heads, 1, dh)
        shapes = [("self", t, (q, cache[0, :t].permute(1, 2, 0, 3), cache[1, :t].permute(1, 2, 0, 3)))
                  for t in (5, src)]
        g = 4  # beams per sentence, folded into one query block per memory row
        cross = (torch.randn(rows // g, heads, g, dh), torch.randn(rows // g, heads, src, dh),
                 torch.randn(rows // g, heads, src, dh))
        for kind, keys, (qq, kk, vv) in [*shapes, ("cross", src, cross)]:
            with torch.inference_mode():
                us = per_call_us(_attention_paths(qq, kk, vv), runs)
            out.append({"model": model, "rows": rows, "heads": heads, "kind": kind, "keys": keys, **us,
                        "ratio": us["two_matmuls_us"] / us["flash_us"]})
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """CLI entry point: run the three tables, print them, write ``bench/results/decode_kernels.json``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    benchlib.add_common_args(p)
    args = p.parse_args(argv)
    benchlib.setup(args.threads)
    if not onednn_available():
        raise SystemExit("decode_kernels: this PyTorch build has no oneDNN; nothing to compare")
    runs = args.runs or (2 if args.quick else 5)
    t0 = time.perf_counter()
    layers = LAYERS[:2] if args.quick else LAYERS
    linears = linear_rows(layers, (1, 4) if args.quick else ROWS, runs)
    argmax = argmax_rows(ARGMAX_LAYERS[:1] if args.quick else ARGMAX_LAYERS, ARGMAX_ROWS[:2] if args.quick
                         else ARGMAX_ROWS, runs)
    attention = attention_rows(ATTENTION[:1] if args.quick else ATTENTION, runs)
    payload = {"threads": args.threads, "fp32_backend": cpu_gemm.fp32_backend(),
               "fp32_inference_backend": cpu_gemm.fp32_inference_backend(), "runs": runs, "linears": linears,
               "argmax": argmax, "attention": attention, "wall_s": time.perf_counter() - t0}
    print(f"decoding linears, us per call ({args.threads} threads, fp32 policy {payload['fp32_backend']!r}, "
          f"at inference {payload['fp32_inference_backend']!r})")
    print(benchlib.table(linears, LINEAR_COLUMNS))
    print("\ngreedy argmax of an output layer, us per call, cold caches; speedup = fp32 / screened")
    print(benchlib.table(argmax, ARGMAX_COLUMNS))
    print("\ndecoding attention, us per call; ratio = two matmuls / flash kernel")
    print(benchlib.table(attention, ATTENTION_COLUMNS))
    path = benchlib.write_results("decode_kernels", payload, quick=args.quick)
    print(f"written {path} ({payload['wall_s']:.0f} s)")
    return payload


if __name__ == "__main__":
    main()
