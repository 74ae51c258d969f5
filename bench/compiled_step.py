"""Greedy batch-1 decoding on the CPU: the core's step eager, the same step compiled, and the CPU accelerator.

Four contenders hold the same GPT-2-like weights (6 x 384, vocab 50,257; :mod:`generate_lm`): aiayn's reference core
eager (``accel none``), the reference core with its step compiled by ``torch.compile`` (inductor, over the static
cache: :func:`aiayn.accel.compile_decoding`), aiayn as ``load_pretrained`` gives it (the CPU accelerator's kernels),
and ``GPT2LMHeadModel.generate``. A 16-token prompt and 128 new tokens, one thread by default; runs alternate, the
median is reported, and every contender must produce transformers' tokens. The compiled step's first call (the
compilation) is outside the timing.

    .venv/bin/python bench/compiled_step.py              # 1 thread, 5 runs
    .venv/bin/python bench/compiled_step.py --threads 2 --runs 3
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
import generate_lm  # noqa: E402

from aiayn.accel import compile_decoding  # noqa: E402
from aiayn.generate import generate  # noqa: E402


def run(threads: int = 1, runs: int = 5, new_tokens: int = 128, prompt_len: int = 16) -> dict[str, Any]:
    """Median tokens/s of each contender and their ratios; ``same_tokens`` per contender."""
    torch.set_num_threads(threads)
    size = generate_lm.LMSize()
    reference, hf = generate_lm.build_pair(size, variant=None)
    compiled = compile_decoding(copy.deepcopy(reference))
    accelerated = benchlib.for_decoding(copy.deepcopy(reference), "float32")
    prompt = torch.randint(5, size.vocab_size - 1, (1, prompt_len), generator=torch.Generator().manual_seed(1))
    out: dict[str, list[int]] = {}

    def ours(name: str, model: Any) -> Callable[[], None]:
        def go() -> None:
            out[name] = generate(model, prompt.tolist(), max_new_tokens=new_tokens, greedy=True, stop_ids=(),
                                 pad_id=0)[0]
        return go

    def transformers() -> None:
        with torch.inference_mode():
            ids = hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, num_beams=1,
                              max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=size.vocab_size - 1)
        out["transformers"] = ids[0, prompt_len:].tolist()

    contenders = {"reference-eager": ours("reference-eager", reference),
                  "reference-compiled": ours("reference-compiled", compiled),
                  "accelerated": ours("accelerated", accelerated), "transformers": transformers}
    start = time.perf_counter()
    contenders["reference-compiled"]()  # the compilation, untimed
    compile_s = time.perf_counter() - start
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(runs):
        for name, fn in contenders.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    tok_s = {name: new_tokens / statistics.median(ts) for name, ts in times.items()}
    return {"threads": threads, "runs": runs, "new_tokens": new_tokens, "compile_s": compile_s,
            "tokens_per_s": tok_s,
            "ratio_vs_transformers": {name: v / tok_s["transformers"] for name, v in tok_s.items()},
            "same_tokens": {name: out[name] == out["transformers"] for name in contenders}}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    result = run(args.threads, args.runs)
    for name, v in result["tokens_per_s"].items():
        print(f"{name:20s} {v:8.1f} tok/s  {result['ratio_vs_transformers'][name]:5.2f}x transformers  "
              f"same tokens: {result['same_tokens'][name]}")
    print(f"compilation: {result['compile_s']:.1f} s")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compiled_step.json").write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
