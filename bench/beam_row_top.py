"""Beam search's per-step top-k: aiayn's blocked ``row_topk`` against torch's topk.

For each benchmarked encoder-decoder size (``translate_beam.py``'s random models, EOS masked so every run makes
the same decoder steps) and batch, the same ``translate`` call runs alternately with
:func:`aiayn.generate.topk.row_topk` and with :func:`~aiayn.generate.topk.row_topk_reference` (torch.topk)
inside beam search (with ``AIAYN_NATIVE=0``: the native kernel, aiayn.native.row_top, would replace both; its
effect is measured by toggling that variable in ``ab_revisions``-style runs, docs/BENCHMARKS.md); the outputs must be
identical. Also the two functions alone on the
(batch x beam, vocabulary) logits of one step. Median of ``--runs`` (default 5), milliseconds.

    .venv/bin/python bench/beam_row_top.py
    .venv/bin/python bench/beam_row_top.py --quick
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
from translate_beam import BOS, EOS, PAD, SIZES, EosMask, Seq2SeqSize, aiayn_model  # noqa: E402

import aiayn.generate.beam as beam_module  # noqa: E402
from aiayn import native  # noqa: E402
from aiayn.generate import translate  # noqa: E402
from aiayn.generate.topk import row_topk, row_topk_reference  # noqa: E402

COLUMNS = ["size", "batch", "vocab", "kernel_torch_ms", "kernel_aiayn_ms", "kernel_speedup",
           "decode_torch_ms", "decode_aiayn_ms", "decode_speedup", "same_output"]
BEAM, ALPHA, SRC_LEN, OUT_LEN = 4, 0.6, 20, 20


def time_case(size: Seq2SeqSize, model: torch.nn.Module, batch: int, runs: int) -> dict[str, Any]:
    """One size and batch: kernels alone and whole beam-4 decodes with each top-k; one result row."""
    g = torch.Generator().manual_seed(batch)
    src = torch.randint(5, size.vocab_size - 2, (batch, SRC_LEN), generator=g)
    log_probs = torch.log_softmax(torch.randn(batch * BEAM, size.vocab_size, generator=g) * 3, dim=-1)  # (N, V)
    mask = EosMask(model.lm_head, EOS, OUT_LEN)
    outs: dict[str, list[list[int]]] = {}

    def decode(name: str, fn: Any) -> Any:
        def run() -> None:
            beam_module.row_topk = fn
            mask.reset()
            hyps = translate(model, src, beam_size=BEAM, alpha=ALPHA, max_len_a=0.0, max_len_b=OUT_LEN,
                             bos_id=BOS, eos_id=EOS, pad_id=PAD)
            outs[name] = [h[0].tokens for h in hyps]
        return run

    fns = {"kernel_torch": lambda: row_topk_reference(log_probs, 2 * BEAM),
           "kernel_aiayn": lambda: row_topk(log_probs, 2 * BEAM),
           "decode_torch": decode("torch", row_topk_reference), "decode_aiayn": decode("aiayn", row_topk)}
    try:  # AIAYN_NATIVE=0: the torch paths, whose top-k this compares
        with mask, mock.patch.dict(os.environ, {native.ENV_VAR: "0"}):
            times = benchlib.alternate(fns, runs=runs, warmup=1)
    finally:
        beam_module.row_topk = row_topk
    row: dict[str, Any] = {"size": size.name, "batch": batch, "vocab": size.vocab_size}
    row.update({f"{k}_ms": 1e3 * benchlib.median(t) for k, t in times.items()})
    row["kernel_speedup"] = row["kernel_torch_ms"] / row["kernel_aiayn_ms"]
    row["decode_speedup"] = row["decode_torch_ms"] / row["decode_aiayn_ms"]
    row["same_output"] = outs["torch"] == outs["aiayn"]
    return row


def bench_row_topk(sizes: list[Seq2SeqSize], batches: tuple[int, ...], runs: int) -> dict[str, Any]:
    """Every size x batch; returns the JSON payload."""
    rows = []
    for size in sizes:
        torch.manual_seed(0)
        model = aiayn_model(size)
        rows += [time_case(size, model, b, runs) for b in batches]
    return {"runs": runs, "beam": BEAM, "alpha": ALPHA, "src_len": SRC_LEN, "steps": OUT_LEN + 1, "rows": rows}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """CLI entry point: run, print the table, write ``bench/results/beam_row_top.json``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    benchlib.add_common_args(p, runs=5)
    args = p.parse_args(argv)
    benchlib.setup(args.threads)
    t0 = time.perf_counter()
    names = ["multi30k"] if args.quick else list(SIZES)
    batches = (32,) if args.quick else (1, 32)
    payload = bench_row_topk([SIZES[n] for n in names], batches, runs=args.runs or (2 if args.quick else 5))
    payload["wall_s"] = time.perf_counter() - t0
    benchlib.report("beam_row_top", payload, COLUMNS, args.quick)
    return payload


if __name__ == "__main__":
    main()
