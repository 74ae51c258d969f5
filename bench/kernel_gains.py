"""What each of the CPU accelerator's own kernels gains over torch's kernels, on the decodes they serve.

Each case is decoded by the accelerated model as ``load_pretrained`` gives it ("all on") and by the same model
built and run with one of the accelerator's paths switched off (:func:`aiayn.accel.cpu.settings.overridden`), so
that torch's own kernels (MKL or oneDNN through ``F.linear``, SDPA, ``topk``) do its work:

- ``native=False``: every compiled kernel of :mod:`aiayn.accel.cpu.native` (few-row linear layers, a step's
  attention, beam search's top-k, int8 rows, the screened argmax's int8 screen);
- ``fp32_gemm="torch"``: torch's default BLAS for fp32 products instead of the per-CPU choice (oneDNN on AMD CPUs);
- ``screened_argmax=False``: greedy's output layer multiplied in full instead of screened (greedy cases only);
- ``decode_attention="shape"``: a step's attention through torch's kernels (two matmuls from 64 (batch x head)
  blocks up, SDPA's flash kernel below: :mod:`aiayn.accel.cpu.decode_attention`) instead of the native kernel;
- ``decode_attention="flash"``: a step's attention always through SDPA's flash kernel.

The gain of a path is the median decode time with it off over the median with everything on (> 1: the path makes
the decode faster). Runs alternate between the variants, and the table names any variant whose tokens differ.
Random weights, the models of translate_beam.py (beam 4) and generate_lm.py (greedy), EOS masked so that every
decode has its full length.

    .venv/bin/python bench/kernel_gains.py [--threads N] [--runs N] [--quick]
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
from step_ops import lm_decode, lm_model, no_eos  # noqa: E402
from translate_beam import BOS, EOS, PAD, SIZES, reference_model  # noqa: E402

from aiayn.accel.cpu.settings import overridden  # noqa: E402
from aiayn.generate import translate  # noqa: E402

#: a path of the accelerator -> the settings that switch it off, so that torch's kernels do its work
PATHS: dict[str, dict[str, Any]] = {
    "native kernels": {"native": False},
    "per-CPU fp32 library": {"fp32_gemm": "torch"},
    "greedy's int8 screen": {"screened_argmax": False},
    "native step attention": {"decode_attention": "shape"},
    "native step attention, against flash": {"decode_attention": "flash"},
}
ALL_ON = "all on"
STEPS = 20


def beam_decode(batch: int) -> Callable[[nn.Module], Callable[[], Any]]:
    def make(model: nn.Module) -> Callable[[], Any]:
        src = torch.randint(5, model.config.vocab_size - 2, (batch, 20), generator=torch.Generator().manual_seed(0))
        return lambda: translate(model, src, beam_size=4, alpha=0.6, max_len_a=0.0, max_len_b=STEPS, bos_id=BOS,
                                 eos_id=EOS, pad_id=PAD)
    return make


def cases(quick: bool) -> dict[str, tuple[Callable[[], nn.Module], Callable[[nn.Module], Callable[[], Any]], bool]]:
    """name -> (build the reference model, make its decode, greedy?)."""
    found = {"multi30k beam 4, batch 1": (lambda: reference_model(SIZES["multi30k"]), beam_decode(1), False),
             "6 x 384 greedy, batch 1": (lm_model, lambda m: lm_decode(m, STEPS), True)}
    if not quick:
        found["multi30k beam 4, batch 32"] = (lambda: reference_model(SIZES["multi30k"]), beam_decode(32), False)
        found["paper-base beam 4, batch 1"] = (lambda: reference_model(SIZES["paper-base"]), beam_decode(1), False)
    return found


def measure(build: Callable[[], nn.Module], make: Callable[[nn.Module], Callable[[], Any]], greedy: bool,
            runs: int) -> tuple[dict[str, float], list[str]]:
    """Median seconds per decode of every variant that applies (see the module docstring), and the variants whose
    tokens differ from "all on"'s (float sums in another order can flip a near tie of random weights)."""
    variants = {ALL_ON: {}, **{n: off for n, off in PATHS.items() if greedy or "screen" not in n}}
    runners, outputs, hooks = {}, {}, []
    reference = build()  # one set of random weights for every variant
    for name, settings in variants.items():
        with overridden(**settings):
            model = benchlib.for_decoding(copy.deepcopy(reference))
        hooks.append(no_eos(model.lm_head))
        decode = make(model)

        def run(decode=decode, settings=settings) -> Any:
            with torch.no_grad(), overridden(**settings):
                return decode()
        runners[name] = run
        outputs[name] = run()
    try:
        times = benchlib.alternate(runners, runs=runs)
    finally:
        for h in hooks:
            h.remove()
    medians = {name: benchlib.median(t) for name, t in times.items()}
    return medians, [name for name in variants if not same_output(outputs[name], outputs[ALL_ON])]


def same_output(a: Any, b: Any) -> bool:
    """Same tokens: generate's lists of ids, or translate's hypotheses (compared by their tokens)."""
    def tokens(out: Any) -> Any:
        return [[h.tokens if hasattr(h, "tokens") else h for h in row] for row in out]
    return tokens(a) == tokens(b)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    benchlib.add_common_args(p, runs=5, malloc=False)
    args = p.parse_args(argv)
    benchlib.setup(args.threads)
    started = time.time()
    rows = []
    for case, (build, make, greedy) in cases(args.quick).items():
        medians, differ = measure(build, make, greedy, args.runs or (2 if args.quick else 5))
        row: dict[str, Any] = {"case": case, "all_on_ms": 1e3 * medians[ALL_ON]}
        for name in PATHS:
            row[f"gain: {name}"] = medians[name] / medians[ALL_ON] if name in medians else None
        row["other tokens with"] = ", ".join(f"{n} off" for n in differ) or "-"
        rows.append(row)
        print(case + ": " + ", ".join(f"{k} {benchlib.fmt(v)}" for k, v in row.items() if k != "case"), flush=True)
    payload = {"rows": rows, "threads": args.threads, "wall_s": time.time() - started}
    benchlib.report(f"kernel_gains-threads{args.threads}", payload, list(rows[0]), quick=args.quick)
    return payload


if __name__ == "__main__":
    main()
