"""Whole greedy generations with and without the screen of the output layer, at several output-layer sizes.

:mod:`aiayn.generate.screened_argmax` screens an fp32 output layer at one row in int8 from
``MIN_INT8_SCREENED_WEIGHTS`` weights on AVX-512 CPUs (elsewhere in fp16), at one or two rows in fp16 from
``MIN_FP16_SCREENED_WEIGHTS[rows]`` weights, and from two rows up in bf16 from ``MIN_BF16_SCREENED_WEIGHTS`` where
the CPU multiplies bf16 natively; on CPUs without AVX-512 where aiayn's native kernels are built, only at one row,
in int8 through the native kernel, from ``MIN_NATIVE_INT8_SCREENED_WEIGHTS``. This benchmark shows where that pays:
random decoder-only models (vocabulary x width from 8000 x 256 to 50257 x 768), greedy generation of
``--new-tokens`` tokens after an 8-token prompt, at batch 1, 2, 4 and 16, with the screen forced on at every size
and off (``AIAYN_SCREENED_ARGMAX=0``), alternating runs in one process; ``screen`` names the screen's dtype (none:
no screen at that row count on this CPU), ``same`` says whether all made the same tokens. Where the screen is
torch's int8 (AVX-512), the fp16 screen it replaced runs too (``fp16_tok_s``, ``int8_vs_fp16``).

With ``--checkpoint DIR`` (a trained decoder-only checkpoint, e.g. from ``aiayn train``) it reports instead, for
greedy generation from a few fixed prompts with the screen forced on, how many candidates each screened row had
(the screen's window grows with the output layer's largest row norm times the hidden state's norm), whether any
row went unsettled, and whether the tokens equal unscreened generation.

    .venv/bin/python bench/greedy_screen.py
    .venv/bin/python bench/greedy_screen.py --quick
    .venv/bin/python bench/greedy_screen.py --checkpoint runs/lm/best
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
           "same", "fp16_tok_s", "int8_vs_fp16", "screened_by_default"]
BATCHES = (1, 2, 4, 16)
CANDIDATE_COLUMNS = ["vocab", "width", "batch", "screen", "max_row_norm", "hidden_norm_median", "rows_screened",
                     "candidates_median", "candidates_p90", "candidates_max", "unsettled_rows", "same"]


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

        def run(switch: str, out: dict[str, list[list[int]]] = out, prompts: list[list[int]] = prompts,
                int8: bool = True) -> None:
            os.environ[screened.ENV_SWITCH] = switch
            screened.MIN_INT8_SCREENED_WEIGHTS = 0 if int8 else 1 << 62  # an fp16 run switches int8 off for itself
            try:
                out[switch if int8 else "fp16"] = generate(model, prompts, max_new_tokens=new_tokens, greedy=True,
                                                           stop_ids=(), pad_id=0)
            finally:
                screened.MIN_INT8_SCREENED_WEIGHTS = 0  # forced on, as every screen here

        dtype = screened.screen_dtype(batch, vocab * width, width)
        contenders = {"screened": lambda: run("1"), "fp32": lambda: run("0")}
        if dtype == torch.int8 and screened.int8_screen_kernel() == "torch":  # and the fp16 screen it replaced there
            contenders["fp16"] = lambda: run("1", int8=False)
        times = benchlib.alternate(contenders, runs=runs)
        os.environ.pop(screened.ENV_SWITCH, None)
        tok_s = {k: new_tokens * batch / benchlib.median(ts) for k, ts in times.items()}
        fp16 = tok_s.get("fp16", float("nan"))
        rows.append({"vocab": vocab, "width": width, "layers": layers, "weights_m": vocab * width / 1e6,
                     "batch": batch, "screen": str(dtype).removeprefix("torch.") if dtype else "none",
                     "screened_tok_s": tok_s["screened"], "fp32_tok_s": tok_s["fp32"],
                     "speedup": tok_s["screened"] / tok_s["fp32"],
                     "same": out["1"] == out["0"] and out.get("fp16", out["0"]) == out["0"],
                     "fp16_tok_s": fp16, "int8_vs_fp16": tok_s["screened"] / fp16})
    return rows


PROMPTS = ["ROMEO:\n", "First Citizen:\nWe are", "KING HENRY:\nWhat", "The", "JULIET:\nO", "MENENIUS:\nI"]


def candidate_stats(checkpoint: str, batches: tuple[int, ...], new_tokens: int) -> list[dict[str, Any]]:
    """One row per batch size: candidates per screened row in greedy generation with a trained model."""
    from aiayn.pretrained import load_pretrained

    pre = load_pretrained(checkpoint)
    tok = pre.tokenizers["text"]
    room = pre.config.max_len - new_tokens  # positions left for the prompt
    if room < 1:
        raise SystemExit(f"greedy_screen: --new-tokens {new_tokens} leaves no room in max_len={pre.config.max_len}")
    prompts = [(tok.encode(t) or [tok.eos_id])[-room:] for t in PROMPTS]
    weight = pre.model.lm_head.proj.weight.detach()
    counts: list[int] = []
    norms: list[float] = []
    real_candidates, real_screened_argmax = screened.candidates, screened.screened_argmax

    def counted(s: torch.Tensor, margin: float, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
        rows, cols = real_candidates(s, margin, block)
        counts.extend(torch.bincount(rows, minlength=s.shape[0]).tolist())
        return rows, cols

    def recorded(h: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor | None:
        norms.extend(torch.linalg.vector_norm(h, dim=1).tolist())
        return real_screened_argmax(h, *args, **kwargs)

    def run(switch: str, batch: int) -> list[list[list[int]]]:
        os.environ[screened.ENV_SWITCH] = switch
        return [generate(pre.model, prompts[i:i + batch], max_new_tokens=new_tokens, greedy=True, stop_ids=())
                for i in range(0, len(prompts), batch)]

    rows = []
    screened.candidates, screened.screened_argmax = counted, recorded
    try:
        for batch in batches:
            counts.clear()
            norms.clear()
            with_screen, without = run("1", batch), run("0", batch)
            c = sorted(counts)
            rows.append({"vocab": weight.shape[0], "width": weight.shape[1], "batch": batch,
                         "screen": str(screened.screen_dtype(batch, 1 << 62, weight.shape[1])).removeprefix("torch."),
                         "max_row_norm": float(torch.linalg.vector_norm(weight, dim=1).max()),
                         "hidden_norm_median": benchlib.median(norms) if norms else float("nan"),
                         "rows_screened": len(c), "candidates_median": benchlib.median(c) if c else float("nan"),
                         "candidates_p90": c[int(0.9 * len(c))] if c else 0, "candidates_max": max(c, default=0),
                         "unsettled_rows": sum(x > screened.MAX_CANDIDATES for x in c), "same": with_screen == without})
    finally:
        screened.candidates, screened.screened_argmax = real_candidates, real_screened_argmax
        os.environ.pop(screened.ENV_SWITCH, None)
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """CLI entry point: print the table and write ``bench/results/greedy_screen.json``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    benchlib.add_common_args(p)
    p.add_argument("--new-tokens", type=int, default=48, help="tokens generated per prompt (default 48)")
    p.add_argument("--checkpoint", default=None,
                   help="a trained decoder-only checkpoint: report its candidates per screened row instead")
    args = p.parse_args(argv)
    benchlib.setup(args.threads)
    runs = args.runs or (2 if args.quick else 5)
    sizes = [(2000, 128, 1)] if args.quick else SIZES
    t0 = time.perf_counter()
    default_fp16, default_bf16 = dict(screened.MIN_FP16_SCREENED_WEIGHTS), screened.MIN_BF16_SCREENED_WEIGHTS
    default_int8 = screened.MIN_INT8_SCREENED_WEIGHTS, screened.MIN_NATIVE_INT8_SCREENED_WEIGHTS
    screened.MIN_FP16_SCREENED_WEIGHTS.update({1: 0, 2: 0})  # force the screen on at every size
    screened.MIN_BF16_SCREENED_WEIGHTS = screened.MIN_INT8_SCREENED_WEIGHTS = 0
    screened.MIN_NATIVE_INT8_SCREENED_WEIGHTS = 0
    try:
        if args.checkpoint:
            payload = {"checkpoint": args.checkpoint, "new_tokens": args.new_tokens,
                       "rows": candidate_stats(args.checkpoint, BATCHES[:2] if args.quick else (1, 2, 4),
                                               args.new_tokens)}
            payload["wall_s"] = time.perf_counter() - t0
            benchlib.report("greedy_screen_candidates", payload, CANDIDATE_COLUMNS, args.quick)
            return payload
        rows = [r for v, d, n in sizes for r in run_size(v, d, n, BATCHES[:2] if args.quick else BATCHES,
                                                           args.new_tokens, runs)]
    finally:
        screened.MIN_FP16_SCREENED_WEIGHTS.update(default_fp16)
        screened.MIN_BF16_SCREENED_WEIGHTS = default_bf16
        screened.MIN_INT8_SCREENED_WEIGHTS, screened.MIN_NATIVE_INT8_SCREENED_WEIGHTS = default_int8
    for r in rows:
        r["screened_by_default"] = screened.screen_dtype(r["batch"], r["vocab"] * r["width"], r["width"]) is not None
    payload = {"threads": args.threads, "runs": runs, "new_tokens": args.new_tokens, "rows": rows,
               "wall_s": time.perf_counter() - t0}
    benchlib.report("greedy_screen", payload, COLUMNS, args.quick)
    return payload


if __name__ == "__main__":
    main()
