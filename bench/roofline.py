"""Batch-1 decoding against the memory-bandwidth limit: how close a token's time is to reading its weights once.

At batch 1 every step reads every weight it multiplies by, so no decoder can make more tokens per second than the
host's read bandwidth over the bytes a step reads. This measures both and gives aiayn's greedy decoding of a
GPT-2-small-shaped model (124M parameters, random weights, as ``load_pretrained`` gives it for decoding) as a
fraction of that limit, fp32 and int8 (``--int8``):

- **read bandwidth**: the best of ``--runs`` sums of a 1 GiB fp32 tensor (a pure streaming read; far larger than
  any last-level cache), at ``--threads`` threads;
- **bytes per token**: every weight a step's products read, at the width they are stored in: each linear layer
  (fp32, or int8 plus its scale); the output layer, tied to the embedding table, in fp32, or, where greedy's
  chooser screens it (the default on the CPU), its int8 copy (one byte a weight; the few rescored rows are left
  out). The embedding rows a step gathers and the KV cache are left out: at these lengths they are under 1% of it;
- **tokens/s**: the median of ``--runs`` greedy decodes of ``--new-tokens`` tokens after a 16-token prompt, no stop
  id.

``fraction`` = tokens/s x bytes per token / read bandwidth: 1.0 would be a decoder doing nothing but read its
weights at the bandwidth a sum reaches.

    .venv/bin/python bench/roofline.py [--threads N] [--runs N] [--new-tokens N]
    .venv/bin/python bench/roofline.py --quick     # a 2 x 128 model, 8 new tokens, 2 runs, a 64 MiB sum
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

from aiayn import ModelConfig, build_model  # noqa: E402
from aiayn.generate import generate  # noqa: E402

COLUMNS = ["model", "variant", "weight_mb_per_token", "read_gb_s", "bound_tok_s", "aiayn_tok_s", "fraction"]
SUM_BYTES = 1 << 30


def read_bandwidth(runs: int, nbytes: int = SUM_BYTES) -> float:
    """Bytes per second that a sum of an ``nbytes`` fp32 tensor reads, the best of ``runs`` (after one warm-up)."""
    x = torch.ones(nbytes // 4)
    x.sum()
    best = min(_timed(x.sum) for _ in range(runs))
    return x.numel() * 4 / best


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _weight(module: nn.Module) -> torch.Tensor:
    """A linear layer's weight (torch's quantized layers give theirs by a call)."""
    return module.weight() if callable(getattr(module, "weight", None)) else module.weight


def _stored_bytes(module: nn.Module) -> int:
    """Bytes of a linear layer's weight as its product reads them: int8 (plus scales) for a quantized one."""
    weight = _weight(module)
    if weight.is_quantized:
        return weight.numel() + 4 * weight.shape[0]  # int8 values and an fp32 scale per output at most
    return weight.numel() * weight.element_size()


def weight_bytes_per_token(model: nn.Module) -> int:
    """The bytes of weights one greedy step reads (see the module docstring): every distinct linear weight, the
    output layer as greedy's chooser reads it."""
    head = model.lm_head
    screened = head.greedy_kernel is not None and head.greedy_kernel(()) is not None
    seen: set[int] = set()
    total = 0
    for module in model.modules():
        if module is head.proj:
            continue
        if isinstance(module, nn.Linear) or type(module).__name__ == "Int8Linear":
            key = id(_weight(module)) if isinstance(module, nn.Linear) else id(module)
            if key not in seen:
                seen.add(key)
                total += _stored_bytes(module)
    return total + (_weight(head.proj).numel() if screened else _stored_bytes(head.proj))


def decoder(quick: bool) -> nn.Module:
    """GPT-2 small's shape (``--quick``: 2 x 128, vocabulary 1000), random weights, in eval mode."""
    size = dict(n_layers=2, d_model=128, n_heads=4, d_ff=512, vocab_size=1000, max_len=256) if quick else {}
    return build_model(ModelConfig.preset("gpt2-small", dropout=0.0, **size)).eval()


def tokens_per_s(model: nn.Module, new_tokens: int, runs: int) -> float:
    """Median tokens/s of greedy decodes of ``new_tokens`` after a 16-token prompt (one warm-up first)."""
    prompt = torch.randint(5, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0)).tolist()

    def run() -> None:
        generate(model, prompt, max_new_tokens=new_tokens, greedy=True, stop_ids=(), pad_id=0)

    with torch.no_grad():
        run()
        times = []
        for _ in range(runs):
            benchlib.settle_garbage()
            times.append(_timed(run))
    return new_tokens / benchlib.median(times)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    benchlib.add_common_args(p, runs=5, malloc=False)
    p.add_argument("--new-tokens", type=int, default=64, help="tokens each decode makes (default 64)")
    args = p.parse_args(argv)
    runs, new_tokens = (2, 8) if args.quick else (args.runs or 5, args.new_tokens)
    benchlib.setup(args.threads)
    started = time.time()
    bandwidth = read_bandwidth(runs, 1 << 26 if args.quick else SUM_BYTES)
    rows = []
    for variant in ("float32", "int8"):
        model = benchlib.for_decoding(decoder(args.quick), variant)
        nbytes = weight_bytes_per_token(model)
        got = tokens_per_s(model, new_tokens, runs)
        bound = bandwidth / nbytes
        rows.append({"model": "gpt2-small shape" if not args.quick else "2 x 128", "variant": variant,
                     "weight_mb_per_token": nbytes / 1e6, "read_gb_s": bandwidth / 1e9, "bound_tok_s": bound,
                     "aiayn_tok_s": got, "fraction": got / bound})
        del model
    payload = {"rows": rows, "threads": args.threads, "new_tokens": new_tokens, "wall_s": time.time() - started}
    benchlib.report("roofline", payload, COLUMNS, quick=args.quick)
    return payload


if __name__ == "__main__":
    main()
