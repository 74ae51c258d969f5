"""Tensor operations per decoding step, by module, and the share of a decode's wall time spent inside operators.

At small sizes a decoding step's time goes mostly to the work between kernels (Python, dispatch, allocation), so
this counts the operations a step makes: every operator call that reaches torch's dispatcher (a
``TorchDispatchMode``), charged to the innermost module running it (forward hooks), or to "outside any module" (the
search loop, the steppers). A step's count is the difference between two decodes of different lengths, divided by
the steps between them, so that the encoder, the prefill and the search's start and end cancel out; a first, uncounted
decode leaves out what a model does once (packing its weights, choosing its kernels).

The share of time in operators is the profiler's self CPU time of every operator over the wall time of that
profiled decode; the decode's time without the profiler is the median of ``--runs``. The totals leave out the one
write per step with which the benchmark forbids EOS (listed on its own).

Cases (random weights, batch 1): the Multi30k-size encoder-decoder of translate_beam.py under beam 4, and the
GPT-2-like 6 x 384 decoder of generate_lm.py under greedy decoding; each as ``load_pretrained`` gives it for
decoding (accelerated) and as the reference core (``--accel none``); the decoder also accelerated without greedy's
int8 screen of the output layer (what the screen costs in operations, and saves in time).

    .venv/bin/python bench/step_ops.py [--threads N] [--runs N]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
from generate_lm import LMSize  # noqa: E402
from translate_beam import BOS, EOS, PAD, SIZES, reference_model  # noqa: E402

from aiayn import ModelConfig, build_model  # noqa: E402
from aiayn.accel.cpu.settings import overridden  # noqa: E402
from aiayn.generate import generate, translate  # noqa: E402

OUTSIDE = "outside any module"
SHORT, LONG = 10, 20  # decoder steps of the two decodes whose difference is counted


class OpCounter(TorchDispatchMode):
    """Counts every operator call, by the class name of the innermost module running (see the module docstring)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()
        self._owners: list[str] = []
        self._hooks = []
        for module in model.modules():
            name = type(module).__name__
            self._hooks.append(module.register_forward_pre_hook(lambda m, a, n=name: self._owners.append(n)))
            self._hooks.append(module.register_forward_hook(lambda m, a, o: self._pop()))

    def _pop(self) -> None:
        self._owners.pop()

    @contextlib.contextmanager
    def owner(self, name: str) -> Iterator[None]:
        """Charge the operations inside the block to ``name``."""
        self._owners.append(name)
        try:
            yield
        finally:
            self._owners.pop()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.counts[self._owners[-1] if self._owners else OUTSIDE] += 1
        return func(*args, **(kwargs or {}))

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()


def no_eos(head: nn.Module, counter: OpCounter | None = None) -> Any:
    """A forward hook on the output layer that forbids EOS, so every decode runs its full length; its one write per
    step is charged to "benchmark's EOS mask"."""
    def hook(module: nn.Module, inputs: Any, logits: torch.Tensor) -> torch.Tensor:
        with counter.owner("benchmark's EOS mask") if counter is not None else contextlib.nullcontext():
            logits[..., EOS] = float("-inf")
        return logits
    return head.register_forward_hook(hook)


def seq2seq_decode(model: nn.Module, steps: int) -> Callable[[], Any]:
    src = torch.randint(5, model.config.vocab_size - 2, (1, 20), generator=torch.Generator().manual_seed(0))
    return lambda: translate(model, src, beam_size=4, alpha=0.6, max_len_a=0.0, max_len_b=steps, bos_id=BOS,
                             eos_id=EOS, pad_id=PAD)


def lm_decode(model: nn.Module, steps: int) -> Callable[[], Any]:
    prompt = torch.randint(5, model.config.vocab_size - 1, (1, 16), generator=torch.Generator().manual_seed(0))
    return lambda: generate(model, prompt.tolist(), max_new_tokens=steps, greedy=True, stop_ids=(), pad_id=PAD)


def lm_model(size: LMSize | None = None) -> nn.Module:
    """The GPT-2-like decoder of generate_lm.py (default: its 6 x 384), random weights, in eval mode."""
    size = size or LMSize()
    cfg = ModelConfig.preset("gpt2-small", n_layers=size.n_layers, d_model=size.d_model, n_heads=size.n_heads,
                             d_ff=4 * size.d_model, vocab_size=size.vocab_size, max_len=size.max_len, dropout=0.0,
                             **benchlib.exact_gelu())
    return build_model(cfg).eval()


def count(model: nn.Module, decode: Callable[[nn.Module, int], Callable[[], Any]]) -> Counter[str]:
    """Operations per decoder step, by module (LONG-step decode less SHORT-step decode, over LONG - SHORT)."""
    totals = []
    with torch.no_grad():  # once first: packed copies and kernel plans made by a model's first decode do not count
        decode(model, SHORT)()
    for steps in (SHORT, LONG):
        run = decode(model, steps)
        counter = OpCounter(model)
        handle = no_eos(model.lm_head, counter)
        try:
            with torch.no_grad(), counter:
                run()
        finally:
            handle.remove()
            counter.remove()
        totals.append(counter.counts)
    diff = Counter({k: (totals[1][k] - totals[0][k]) / (LONG - SHORT) for k in totals[1] | totals[0]})
    return Counter({k: v for k, v in diff.items() if v})


def time_share(model: nn.Module, decode: Callable[[nn.Module, int], Callable[[], Any]], runs: int) -> dict[str, float]:
    """The wall time of a LONG-step decode (median of ``runs``) and the operators' self CPU time in it."""
    run = decode(model, LONG)
    handle = no_eos(model.lm_head)
    try:
        with torch.no_grad():
            run()  # warm-up
            walls = []
            for _ in range(runs):
                benchlib.settle_garbage()
                t0 = time.perf_counter()
                run()
                walls.append(time.perf_counter() - t0)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                t0 = time.perf_counter()
                run()
                profiled = time.perf_counter() - t0
    finally:
        handle.remove()
    # operators are the events named namespace::op (aten::addmm, aiayn::...); their self time excludes their children
    self_us = sum(e.self_cpu_time_total for e in prof.key_averages() if "::" in e.key)
    return {"decode_ms": 1e3 * benchlib.median(walls), "profiled_ms": 1e3 * profiled, "operators_ms": self_us / 1e3,
            "share_in_operators": self_us / 1e6 / profiled}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    benchlib.add_common_args(p, runs=5, malloc=False)
    args = p.parse_args(argv)
    benchlib.setup(args.threads)
    started = time.time()
    cases = {"multi30k beam 4": (lambda: reference_model(SIZES["multi30k"]), seq2seq_decode),
             "6 x 384 greedy": (lm_model, lm_decode)}
    rows, by_module = [], {}
    for case, (build, decode) in cases.items():
        variants = ["accelerated", "reference"] + (["accelerated, no int8 screen"] if "greedy" in case else [])
        for variant in variants:
            model = build()
            if variant != "reference":
                model = benchlib.for_decoding(model)
            # greedy's chooser without its int8 screen of the output layer: what the screen costs in operations
            with overridden(screened_argmax=False) if "no int8 screen" in variant else contextlib.nullcontext():
                ops = count(model, decode)
                share = time_share(model, decode, args.runs)
            name = f"{case}, {variant}"
            by_module[name] = dict(ops.most_common())
            mine = sum(v for k, v in ops.items() if k != "benchmark's EOS mask")
            rows.append({"case": name, "ops_per_step": round(mine, 1), **share})
            print(f"{name}: " + ", ".join(f"{k} {v:g}" for k, v in ops.most_common()), flush=True)
    payload = {"rows": rows, "ops_by_module": by_module, "threads": args.threads, "wall_s": time.time() - started}
    benchlib.report("step_ops", payload, ["case", "ops_per_step", "decode_ms", "profiled_ms", "operators_ms",
                                          "share_in_operators"], quick=False)
    return payload


if __name__ == "__main__":
    main()
