"""The output layer at decoding row counts: ``F.linear`` (row- and column-major weight) against oneDNN-prepacked.

Two parts, both in one process with the contenders alternating (median of ``--runs``, default 5):

1. Kernels: hidden (rows, D) -> logits (rows, V) for the output layers of the benchmarked models (paper-base
   512 x 32000, the GPT-2-like 384 x 50257, the Multi30k recipe sizes 256 x 8000 and 128 x 8000), at the row
   counts of decoding (1 = greedy batch 1, 4 = one sentence's beams, 16, 128 = 32 sentences x 4 beams);
   milliseconds per call. ``PackedLinear`` (:mod:`aiayn.nn.packed`) uses the packed weight from 2 rows up.
2. Whole greedy generations of ``generate_lm.py``'s GPT-2-like model (batch 1 and 16, 16-token prompt, 128 new
   tokens) with its output layer packed (what ``load_pretrained`` gives) and unpacked (column-major
   ``F.linear``); ``same_output`` checks the tokens. Beam search is measured across revisions by
   ``ab_revisions.py``.

    .venv/bin/python bench/output_layer.py
    .venv/bin/python bench/output_layer.py --quick
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
import generate_lm  # noqa: E402

from aiayn.generate import generate  # noqa: E402
from aiayn.nn.packed import onednn_available, pack_weight, packed_linear, unpack_output_layers  # noqa: E402

SHAPES = [("paper-base", 512, 32000), ("gpt2-like", 384, 50257), ("multi30k-256", 256, 8000),
          ("multi30k-tiny", 128, 8000)]
ROWS = (1, 4, 16, 128)
KERNEL_COLUMNS = ["layer", "d_model", "vocab", "rows", "row_major_ms", "column_major_ms", "packed_ms",
                  "packed_vs_column_major"]
DECODE_COLUMNS = ["batch", "new_tokens", "plain_tok_s", "packed_tok_s", "speedup", "same_output"]


def kernel_rows(shapes: list[tuple[str, int, int]], rows: tuple[int, ...], runs: int) -> list[dict[str, Any]]:
    """Time the three ways of computing each output layer at each row count; one result row per case."""
    out = []
    for name, d, v in shapes:
        w = torch.randn(v, d) * d ** -0.5
        col = w.t().contiguous().t()
        packed = pack_weight(w)
        for n in rows:
            h = torch.randn(n, d)
            reps = max(3, int(1e8 / (2 * n * d * v)))  # about 0.1 GFLOP per timed sample

            def loop(fn: Any, reps: int = reps) -> Any:
                def run() -> None:
                    for _ in range(reps):
                        fn()
                return run

            times = benchlib.alternate({
                "row_major": loop(lambda h=h, w=w: F.linear(h, w)),
                "column_major": loop(lambda h=h, w=col: F.linear(h, w)),
                "packed": loop(lambda h=h, p=packed: packed_linear(h, p)),
            }, runs=runs, warmup=1)
            row: dict[str, Any] = {"layer": name, "d_model": d, "vocab": v, "rows": n}
            row.update({f"{k}_ms": 1e3 * benchlib.median(t) / reps for k, t in times.items()})
            row["packed_vs_column_major"] = row["column_major_ms"] / row["packed_ms"]
            out.append(row)
    return out


def decode_rows(batches: tuple[int, ...], new_tokens: int, runs: int,
                size: generate_lm.LMSize | None = None) -> list[dict[str, Any]]:
    """Greedy generation with the output layer packed and unpacked, alternating; one result row per batch."""
    packed_model, _hf = generate_lm.build_pair(size or generate_lm.LMSize())
    plain_model = unpack_output_layers(copy.deepcopy(packed_model))
    out = []
    for batch in batches:
        g = torch.Generator().manual_seed(batch)
        prompts = torch.randint(5, packed_model.config.vocab_size - 1, (batch, 16), generator=g).tolist()
        tokens: dict[str, Any] = {}

        def run(name: str, model: Any, prompts: list[list[int]] = prompts, tokens: dict[str, Any] = tokens) -> Any:
            def fn() -> None:
                tokens[name] = generate(model, prompts, max_new_tokens=new_tokens, greedy=True, stop_ids=(),
                                        pad_id=0)
            return fn

        times = benchlib.alternate({"plain": run("plain", plain_model), "packed": run("packed", packed_model)},
                                   runs=runs, warmup=1)
        row: dict[str, Any] = {"batch": batch, "new_tokens": new_tokens}
        row.update({f"{k}_tok_s": batch * new_tokens / benchlib.median(t) for k, t in times.items()})
        row["speedup"] = row["packed_tok_s"] / row["plain_tok_s"]
        row["same_output"] = tokens["plain"] == tokens["packed"]
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """CLI entry point: run both parts, print the tables, write ``bench/results/output_layer.json``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    benchlib.add_common_args(p, runs=5)
    args = p.parse_args(argv)
    if not onednn_available():
        raise SystemExit("this PyTorch build has no oneDNN: nothing to compare")
    benchlib.setup(args.threads)
    runs = args.runs or (2 if args.quick else 5)
    t0 = time.perf_counter()
    kernels = kernel_rows(SHAPES[-1:] if args.quick else SHAPES, (1, 4) if args.quick else ROWS, runs)
    decodes = decode_rows((1,) if args.quick else (1, 16), 8 if args.quick else 128, runs)
    print(benchlib.table(kernels, KERNEL_COLUMNS))
    payload = {"runs": runs, "kernels": kernels, "rows": decodes, "wall_s": time.perf_counter() - t0}
    benchlib.report("output_layer", payload, DECODE_COLUMNS, args.quick)
    return payload


if __name__ == "__main__":
    main()
