"""Whole greedy generations with and without the fp16 screen of the output layer, at several output-layer sizes.

:mod:`aiayn.generate.screened_argmax` screens an fp32 output layer at one or two rows from
``MIN_FP16_SCREENED_WEIGHTS[rows]`` weights, and from two rows up in bf16 from ``MIN_BF16_SCREENED_WEIGHTS`` where
the CPU multiplies bf16 natively. This benchmark shows where that pays: random decoder-only models (vocabulary x
width from 8000 x 256 to 50257 x 768), greedy generation of ``--new-tokens`` tokens after an 8-token prompt, at
batch 1, 2, 4 and 16, with the screen forced on at every size and off (``AIAYN_SCREENED_ARGMAX=0``), alternating
runs in one process; ``screen`` names the screen's dtype (none: no screen at that row count on this CPU), ``same``
says whether both made the same tokens.

    .venv/bin/python bench/greedy_screen.py
    .venv/bin/python bench/greedy_screen.py --quick
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

import aiayn.generate.screened_argmax as screened  # noqa: E402
from aiayn import build_model  # noqa: E402
from aiayn.config import ModelConfig  # noqa: E402
from aiayn.generate import generate  # noqa: E402
from aiayn.nn.layout import cpu_inference_layout  # noqa: E402

# (vocabulary, width, layers)
SIZES = [(8000, 256, 3), (16384, 256, 3), (32000, 512, 6), (50257, 384, 6), (50257, 768, 2)]
COLUMNS = ["vocab", "width", "layers", "weights_m", "batch", "screen", "screened_tok_s", "fp32_tok_s", "speedup",
           "same", "screened_by_default"]
BATCHES = (1, 2, 4, 16)


def run_size(vocab: int, width: int, layers: int, batches: tuple[int, ...], new_tokens: int,
             runs: int) -> list[dict[str, Any]]:
    """One row per batch size: tokens/s with the screen on and off for a random model of this size."""
    cfg = ModelConfig.preset("gpt2-small", n_layers=layers, d_model=width, n_heads=width // 64, d_ff=4 * width,
                             vocab_size=vocab, max_len=512, dropout=0.0)
    model = cpu_inference_layout(build_model(cfg).eval())
    rows = []
    for batch in batches:
        prompts = torch.randint(5, vocab - 1, (batch, 8)).tolist()
        out: dict[str, list[list[int]]] = {}

        def run(switch: str) -> None:
            os.environ[screened.ENV_SWITCH] = switch
            out[switch] = generate(model, prompts, max_new_tokens=new_tokens, greedy=True, stop_ids=(), pad_id=0)

        times = benchlib.alternate({"screened": lambda: run("1"), "fp32": lambda: run("0")}, runs=runs)
        os.environ.pop(screened.ENV_SWITCH, None)
        tok_s = {k: new_tokens * batch / benchlib.median(ts) for k, ts in times.items()}
        dtype = screened.screen_dtype(batch, vocab * width)
        rows.append({"vocab": vocab, "width": width, "layers": layers, "weights_m": vocab * width / 1e6,
                     "batch": batch, "screen": str(dtype).removeprefix("torch.") if dtype else "none",
                     "screened_tok_s": tok_s["screened"], "fp32_tok_s": tok_s["fp32"],
                     "speedup": tok_s["screened"] / tok_s["fp32"], "same": out["1"] == out["0"]})
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """CLI entry point: print the table and write ``bench/results/greedy_screen.json``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    benchlib.add_common_args(p)
    p.add_argument("--new-tokens", type=int, default=48, help="tokens generated per prompt (default 48)")
    args = p.parse_args(argv)
    benchlib.setup(args.threads)
    runs = args.runs or (2 if args.quick else 5)
    sizes = [(2000, 128, 1)] if args.quick else SIZES
    t0 = time.perf_counter()
    default_fp16, default_bf16 = dict(screened.MIN_FP16_SCREENED_WEIGHTS), screened.MIN_BF16_SCREENED_WEIGHTS
    screened.MIN_FP16_SCREENED_WEIGHTS.update({1: 0, 2: 0})  # force the screen on at every size
    screened.MIN_BF16_SCREENED_WEIGHTS = 0
    try:
        rows = [r for v, d, n in sizes for r in run_size(v, d, n, BATCHES[:2] if args.quick else BATCHES,
                                                           args.new_tokens, runs)]
    finally:
        screened.MIN_FP16_SCREENED_WEIGHTS.update(default_fp16)
        screened.MIN_BF16_SCREENED_WEIGHTS = default_bf16
    for r in rows:
        r["screened_by_default"] = screened.screen_dtype(r["batch"], r["vocab"] * r["width"]) is not None
    payload = {"threads": args.threads, "runs": runs, "new_tokens": args.new_tokens, "rows": rows,
               "wall_s": time.perf_counter() - t0}
    benchlib.report("greedy_screen", payload, COLUMNS, args.quick)
    return payload


if __name__ == "__main__":
    main()
