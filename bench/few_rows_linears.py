"""Decoding where oneDNN is not the fp32 backend (Intel CPUs): every fp32 linear layer a ``few_rows_only``
PackedLinear (the native few-row kernel at a step's rows, and with it the native decoder layers) against plain
``nn.Linear`` (torch's BLAS at every size), as aiayn decoded on such hosts before, alternating in one process.

The output layers are the same oneDNN-packed PackedLinear in both (``pack_output_layers`` runs on every host);
only the other linear layers differ. ``same`` checks that both gave the same tokens (beam search: every sentence's
best hypothesis). On a host where oneDNN is the backend (AMD), ``--backend torch`` makes the layers as an Intel host
would (for a look at the code path; the timing that matters is an Intel host's).

Cases as in ``native_layers.py``: beam-4 translation (length penalty 0.6, 20-token sources, 21 steps, EOS masked)
at ``translate_beam.py``'s Multi30k and paper-base sizes, batch 1 and 32; greedy generation of the GPT-2-like
6 x 384 model (16-token prompts, 128 new tokens) at batch 1 and 16.

    .venv/bin/python bench/few_rows_linears.py
    .venv/bin/python bench/few_rows_linears.py --backend torch --quick
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
import native_layers  # noqa: E402

from aiayn.nn import cpu_gemm  # noqa: E402
from aiayn.nn.packed import PackedLinear, unpack_output_layers  # noqa: E402

CASES = ["multi30k:1", "multi30k:32", "paper-base:1", "paper-base:32", "generate:1", "generate:16"]
COLUMNS = ["case", "unit", "plain_ms", "few_rows_ms", "speedup", "best_speedup", "layers_made", "same"]


def bench_case(case: str, runs: int, quick: bool) -> dict[str, Any]:
    """Both layouts' decodes of one case, alternating; their medians and ratio."""
    made = {}
    for layout in ("few_rows", "plain"):
        decode, key, unit, context, model = native_layers.case_runner(case, quick)
        n = sum(isinstance(m, PackedLinear) and m.few_rows_only for m in model.modules())
        if layout == "plain":
            unpack_output_layers(model, few_rows_only=True)
        made[layout] = (decode, key, context, n)
    outputs = {}
    with made["few_rows"][2], made["plain"][2]:
        for layout, (decode, key, _, _) in made.items():
            outputs[layout] = key(decode())
        # half the rounds each way round, so that going first or second in a round favours neither
        fns = {k: v[0] for k, v in made.items()}
        times = benchlib.alternate(fns, runs=(runs + 1) // 2, warmup=1)
        flipped = benchlib.alternate(dict(reversed(fns.items())), runs=runs // 2, warmup=0)
        times = {k: times[k] + flipped[k] for k in fns}
    plain, few = benchlib.median(times["plain"]), benchlib.median(times["few_rows"])
    return {"case": case, "unit": unit, "plain_ms": plain * 1e3, "few_rows_ms": few * 1e3, "speedup": plain / few,
            "best_speedup": min(times["plain"]) / min(times["few_rows"]), "layers_made": made["few_rows"][3],
            "same": native_layers._same(outputs["plain"], outputs["few_rows"]),
            "times": {k: [round(t, 5) for t in v] for k, v in times.items()}}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    benchlib.add_common_args(p, runs=7)
    p.add_argument("--cases", nargs="+", choices=CASES, default=None)
    p.add_argument("--backend", choices=cpu_gemm.BACKENDS, default="auto",
                   help="the fp32 backend the models are made and run under (default: this host's choice)")
    args = p.parse_args(argv)
    benchlib.setup(args.threads)
    cases = args.cases or (["multi30k:1", "generate:1"] if args.quick else CASES)
    runs = args.runs or (2 if args.quick else 7)
    start = time.perf_counter()
    with cpu_gemm.use_fp32_backend(args.backend):
        backend = cpu_gemm.fp32_inference_backend()
        rows = [bench_case(case, runs, args.quick) for case in cases]
    payload = {"quick": args.quick, "threads": args.threads, "runs": runs, "backend": backend,
               "machine": benchlib.machine_info(), "rows": rows,
               "wall_s": time.perf_counter() - start}
    print(f"whole decodes, few-rows PackedLinear against plain nn.Linear (fp32 inference backend {backend}), "
          f"alternating in one process; median of {runs}")
    benchlib.report("few_rows_linears", payload, COLUMNS, args.quick)
    return payload


if __name__ == "__main__":
    main()
