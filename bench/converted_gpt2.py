"""A converted GPT-2 small: conversion time and memory, then batch-1 greedy decoding against transformers.

A random ``GPT2LMHeadModel(GPT2Config())`` (124M parameters, GELU tanh as GPT-2 has it) is saved with
``save_pretrained``, converted with ``aiayn.hf.from_hf`` and loaded with ``load_pretrained`` (accelerated for
decoding, as the ``aiayn generate`` command runs it). Both then decode the same prompt greedily for the same number
of new tokens (aiayn with no stop id, transformers with ``min_new_tokens == max_new_tokens``), alternating runs;
the row gives the median tokens/s of each, the ratio and whether the tokens are the same.

    .venv/bin/python bench/converted_gpt2.py             # GPT-2 small, 16-token prompt, 64 new tokens, 5 runs
    .venv/bin/python bench/converted_gpt2.py --quick     # 2 layers x 128, 16 new tokens, 2 runs
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

from aiayn.generate import generate  # noqa: E402
from aiayn.hf import from_hf, to_hf  # noqa: E402
from aiayn.pretrained import load_pretrained  # noqa: E402

COLUMNS = ["model", "from_hf_s", "to_hf_s", "peak_rss_gib", "prompt", "new_tokens", "aiayn_tok_s", "hf_tok_s",
           "ratio_vs_hf", "same_tokens"]


def bench_converted(hf_config: Any, prompt_len: int, new_tokens: int, runs: int, folder: Path) -> dict[str, Any]:
    """Convert a random GPT-2 of ``hf_config`` under ``folder`` and time batch-1 greedy decoding; one result row."""
    from transformers import GPT2LMHeadModel

    torch.manual_seed(0)
    hf = GPT2LMHeadModel(hf_config).eval()
    hf.save_pretrained(folder / "hf")
    t0 = time.perf_counter()
    from_hf(folder / "hf", folder / "aiayn")
    t1 = time.perf_counter()
    to_hf(folder / "aiayn", folder / "hf-again")
    t2 = time.perf_counter()
    ours = load_pretrained(folder / "aiayn").model
    eos = hf_config.eos_token_id
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, hf_config.vocab_size, (1, prompt_len), generator=g)
    prompt[prompt == eos] = 0
    out: dict[str, Any] = {}

    def run_ours() -> None:
        out["aiayn"] = generate(ours, prompt.tolist(), max_new_tokens=new_tokens, greedy=True, stop_ids=(),
                                pad_id=eos)

    def run_hf() -> None:
        with torch.inference_mode():
            out["hf"] = hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, num_beams=1,
                                    max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=eos)

    times = benchlib.alternate({"aiayn": run_ours, "transformers": run_hf}, runs=runs, warmup=1)
    t_ours, t_hf = benchlib.median(times["aiayn"]), benchlib.median(times["transformers"])
    got, want = out["aiayn"][0], out["hf"][0, prompt_len:].tolist()
    if len(got) != len(want):
        raise RuntimeError(f"output lengths differ: {len(got)} vs {len(want)}")
    n_params = sum(p.numel() for p in hf.parameters())
    return {"model": f"GPT-2 {hf_config.n_layer}x{hf_config.n_embd} ({n_params / 1e6:.0f}M)",
            "from_hf_s": t1 - t0, "to_hf_s": t2 - t1, "peak_rss_gib": benchlib.peak_rss_mb() / 1024,
            "prompt": prompt_len, "new_tokens": new_tokens, "aiayn_tok_s": new_tokens / t_ours,
            "hf_tok_s": new_tokens / t_hf, "ratio_vs_hf": t_hf / t_ours,
            "same_tokens": sum(a == b for a, b in zip(got, want)) / len(want)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """CLI entry point: run, print the row, write ``bench/results/converted_gpt2.json``."""
    from transformers import GPT2Config

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    benchlib.add_common_args(p)
    p.add_argument("--new-tokens", type=int, default=None)
    args = p.parse_args(argv)
    benchlib.setup(args.threads)
    t0 = time.perf_counter()
    if args.quick:
        config = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000, n_positions=128, bos_token_id=999,
                            eos_token_id=999)
        runs, new = args.runs or 2, args.new_tokens or 16
    else:
        config, runs, new = GPT2Config(), args.runs or 5, args.new_tokens or 64
    with tempfile.TemporaryDirectory() as tmp:
        row = bench_converted(config, 16, new, runs, Path(tmp))
    payload = {"rows": [row], "runs": runs, "threads": args.threads, "wall_s": time.perf_counter() - t0}
    print(f"converted GPT-2, batch-1 greedy, median of {runs} alternating runs")
    benchlib.report("converted_gpt2", payload, COLUMNS, args.quick)
    return payload


if __name__ == "__main__":
    main()
