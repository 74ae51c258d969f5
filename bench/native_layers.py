"""Whole decodes with each decoder layer's step as one native call (:mod:`aiayn.generate.native_step`) against the
flat Python loop of :mod:`aiayn.generate.fast_step` that it replaces, in one process.

The two paths run the same products and attention kernels; the ratio says what moving the glue between them (norms,
residual sums, the cache write, views and fresh tensors, Python) into C buys. Both run in the same process,
alternating decode by decode (``AIAYN_NATIVE_LAYERS`` is read when a ``translate`` / ``generate`` call starts), so
host noise hits them alike; this host's steal time made fresh-process A/B runs (``ab_revisions.py``) swing by 0.93-1.16x
on the same case. ``same`` checks that both gave the same tokens (beam search: every sentence's best hypothesis).

Cases: beam-4 translation (length penalty 0.6, 20-token sources, 21 steps, EOS masked) at ``translate_beam.py``'s
Multi30k and paper-base sizes, batch 1 and 32; greedy generation (16-token prompts, 128 new tokens) at batch 1 and 16
of ``generate_lm.py``'s GPT-2-like model (6 x 384, learned positions, pre-norm LayerNorm, GELU) and of a LLaMA-like
one of that size (the ``llama`` preset at 6 x 384, 6 query and 2 key/value heads, d_ff 1024, vocabulary 32000: RoPE,
RMSNorm, SwiGLU); and the encoder alone (``encoder-SIZE:BATCH``: a ``Seq2SeqStepper`` made, which encodes the 20-token
sources; ``same`` compares the memories to 1e-5).

    .venv/bin/python bench/native_layers.py
    .venv/bin/python bench/native_layers.py --runs 15 --cases multi30k:32
    .venv/bin/python bench/native_layers.py --quick
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
import generate_lm  # noqa: E402
import translate_beam  # noqa: E402

from aiayn import ModelConfig, build_model  # noqa: E402
from aiayn.generate import generate, native_step  # noqa: E402
from aiayn.generate.steppers import Seq2SeqStepper, eval_mode  # noqa: E402
from aiayn.nn.layout import cpu_inference_layout  # noqa: E402

CASES = ["multi30k:1", "multi30k:32", "paper-base:1", "paper-base:32", "generate:1", "generate:16", "llama:1",
         "llama:16", "encoder-multi30k:1", "encoder-multi30k:32", "encoder-paper-base:1", "encoder-paper-base:32"]
COLUMNS = ["case", "unit", "python_loop_ms", "native_layers_ms", "speedup", "best_speedup", "native_layers_used",
           "same"]


def _with_flag(fn: Callable[[], Any], flag: str) -> Callable[[], Any]:
    def run() -> Any:
        os.environ[native_step.ENV_VAR] = flag
        return fn()
    return run


@contextlib.contextmanager
def counting_native_steps() -> Iterator[dict[str, int]]:
    """Count the steps (and encoder passes) that take the native layers while inside (to report that a case
    exercises them at all)."""
    counts = {"steps": 0}
    call = native_step.NativeLayers.__call__

    def counted(layers: native_step.NativeLayers, *a: Any, **k: Any) -> Any:
        out = call(layers, *a, **k)
        counts["steps"] += out is not None
        return out

    encode = native_step.NativeLayers.encode

    def counted_encode(layers: native_step.NativeLayers, *a: Any, **k: Any) -> Any:
        counts["steps"] += 1
        return encode(layers, *a, **k)

    native_step.NativeLayers.__call__ = counted  # type: ignore[method-assign]
    native_step.NativeLayers.encode = counted_encode  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        native_step.NativeLayers.__call__ = call  # type: ignore[method-assign]
        native_step.NativeLayers.encode = encode  # type: ignore[method-assign]


def _same(a: Any, b: Any) -> bool:
    """Tokens equal; an encoder's output equal up to float rounding (the norms' sums in another order)."""
    if isinstance(a, torch.Tensor):
        return bool(torch.allclose(a, b, atol=1e-5, rtol=0))
    return a == b


def case_runner(case: str, quick: bool) -> tuple[Callable[[], Any], Callable[[Any], Any], str, Any, torch.nn.Module]:
    """(decode, what of its output to compare, unit, context manager to run it in, the model) for one case."""
    what, batch_text = case.split(":")
    batch = int(batch_text)
    if what in ("generate", "llama"):
        if what == "generate":
            size = generate_lm.LMSize(n_layers=2) if quick else generate_lm.LMSize()
            model, vocab = generate_lm.build_pair(size)[0], size.vocab_size
        else:
            torch.manual_seed(0)
            cfg = ModelConfig.preset("llama", d_model=384, n_heads=6, n_kv_heads=2, n_layers=2 if quick else 6,
                                     d_ff=1024, max_len=1024)
            model, vocab = cpu_inference_layout(build_model(cfg).eval()), cfg.vocab_size
        g = torch.Generator().manual_seed(batch)
        prompts = torch.randint(5, vocab - 1, (batch, 16), generator=g).tolist()
        new = 16 if quick else 128
        return (lambda: generate(model, prompts, max_new_tokens=new, greedy=True, stop_ids=(), pad_id=0),
                lambda out: out, "tok", torch.no_grad(), model)
    if what.startswith("encoder-"):  # the encoder alone: a Seq2SeqStepper made, which encodes the source
        size = translate_beam.SIZES[what.removeprefix("encoder-")]
        torch.manual_seed(0)
        model = translate_beam.aiayn_model(size)
        src = torch.randint(5, size.vocab_size - 2, (batch, 20), generator=torch.Generator().manual_seed(batch))
        return (lambda: Seq2SeqStepper(model, src, capacity=22).memory, lambda memory: memory, "sent",
                eval_mode(model), model)
    size = translate_beam.SIZES[what]
    torch.manual_seed(0)
    model, out = translate_beam.aiayn_model(size), {}
    fn = translate_beam.make_runner("aiayn", model, size, batch, 20, out, 4, 0.6, 20)

    def decode() -> Any:
        fn()
        return out["aiayn"]
    return decode, lambda hyps: [sent[0].tokens for sent in hyps], "sent", out["aiayn-mask"], model


def bench_case(case: str, runs: int, quick: bool) -> dict[str, Any]:
    decode, key, unit, context, _ = case_runner(case, quick)
    outputs: dict[str, Any] = {}
    try:
        with context, counting_native_steps() as counts:
            for flag in "01":
                outputs[flag] = key(_with_flag(decode, flag)())
            times = benchlib.alternate({"python": _with_flag(decode, "0"), "native": _with_flag(decode, "1")},
                                       runs=runs, warmup=1)
    finally:
        os.environ.pop(native_step.ENV_VAR, None)
    py, nat = benchlib.median(times["python"]), benchlib.median(times["native"])
    return {"case": case, "unit": unit, "python_loop_ms": py * 1e3, "native_layers_ms": nat * 1e3,
            "speedup": py / nat, "best_speedup": min(times["python"]) / min(times["native"]),
            "native_layers_used": counts["steps"] > 0, "same": _same(outputs["0"], outputs["1"]),
            "times": {k: [round(t, 5) for t in v] for k, v in times.items()}}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    benchlib.add_common_args(p, runs=9)
    p.add_argument("--cases", nargs="+", choices=CASES, default=None)
    args = p.parse_args(argv)
    benchlib.setup(args.threads)
    cases = args.cases or (["multi30k:1", "multi30k:32", "generate:1", "llama:1"] if args.quick else CASES)
    runs = args.runs or (2 if args.quick else 9)
    start = time.perf_counter()
    rows = [bench_case(case, runs, args.quick) for case in cases]
    payload = {"quick": args.quick, "threads": args.threads, "runs": runs, "rows": rows,
               "wall_s": time.perf_counter() - start}
    print(f"whole decodes, native layers against the Python loop, alternating in one process; median of {runs}")
    benchlib.report("native_layers", payload, COLUMNS, args.quick)
    return payload


if __name__ == "__main__":
    main()
