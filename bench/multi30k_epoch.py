"""One Multi30k training epoch: token-budget, length-bucketed batches vs fixed-size padded batches.

Both runs train the Multi30k recipe's model (``recipes/multi30k-en-de.toml``: paper-base shrunk to d_model
256, 4 heads, d_ff 1024, 3+3 layers, joint BPE 8000) from the same initialization, on the same epoch of pairs
cut two ways with the same number of batches (so the same real tokens per batch on average):

- ``token_budget_batches(max_tokens=3072)`` (the recipe's ``batch_tokens``): sorted by length, little padding;
- ``fixed_size_batches(batch_size=n_pairs / n_budget_batches)``: random pairs, padded to the longest.

A full epoch takes many minutes on 2 cores, so by default a random slice (``--fraction``) of each epoch's
batches is timed, steps of the two alternating, and the epoch time is extrapolated. Each timed step is
collation + forward + loss + backward + Adam, the model and loss as ``aiayn train`` runs them: accelerated for
training (:func:`aiayn.accel.accelerate`; ``AIAYN_ACCEL=none`` times the reference core), the loss through
``model.lm_head.loss`` on the hidden states.

    .venv/bin/python bench/multi30k_epoch.py                  # 5% slice
    .venv/bin/python bench/multi30k_epoch.py --fraction 1.0   # the whole epoch
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

from aiayn import ModelConfig, build_model  # noqa: E402
from aiayn.accel import accelerate  # noqa: E402
from aiayn.data.batching import (  # noqa: E402
    collate_seq2seq,
    fixed_size_batches,
    padding_fraction,
    token_budget_batches,
)
from aiayn.data.parallel import filter_by_token_length, load_parallel  # noqa: E402
from aiayn.tokenize import train_tokenizer  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"
RECIPE = dict(d_model=256, n_heads=4, d_ff=1024, n_layers=3, n_encoder_layers=3, dropout=0.2, max_len=256)
MAX_TOKENS = 3072
MAX_PER_SIDE = 100


def recipe_config(vocab_size: int, **overrides: Any) -> ModelConfig:
    """The Multi30k recipe's model config for a joint vocabulary of ``vocab_size``."""
    return ModelConfig.preset("paper-base", **{**RECIPE, "vocab_size": vocab_size, **overrides})


def load_tokenized(data_dir: Path = DATA, vocab_size: int = 8000, limit: int | None = None
                   ) -> tuple[list[list[int]], list[list[int]], int, dict[str, float]]:
    """Read train.en/de.gz, train a joint BPE tokenizer, encode and filter (<= 100 tokens a side).

    Returns:
        source ids, target ids, the tokenizer's vocabulary size, timings ("read_s", "tokenizer_s", ...).
    """
    t0 = time.perf_counter()
    corpus = load_parallel(data_dir / "train.en.gz", data_dir / "train.de.gz", policy="skip")
    src, tgt = corpus.src[:limit], corpus.tgt[:limit]
    t1 = time.perf_counter()
    tok = train_tokenizer("bpe", [*src, *tgt], vocab_size)
    t2 = time.perf_counter()
    src_ids, tgt_ids = tok.encode_batch(src), tok.encode_batch(tgt)
    kept = filter_by_token_length(src_ids, tgt_ids, MAX_PER_SIDE, policy="skip")
    t3 = time.perf_counter()
    timings = {"read_s": t1 - t0, "tokenizer_s": t2 - t1, "encode_s": t3 - t2}
    return kept.src, kept.tgt, tok.vocab_size, timings


def matched_batches(lengths: Sequence[tuple[int, int]], max_tokens: int,
                    seed: int = 0) -> tuple[list[list[int]], list[list[int]], int]:
    """Token-budget batches and fixed-size batches with (about) the same number of batches.

    Returns:
        budget batches, fixed batches, and the fixed batch size (``round(n / n_budget_batches)``).
    """
    budget = token_budget_batches(lengths, max_tokens, seed=seed, epoch=0)
    batch_size = max(1, round(len(lengths) / len(budget)))
    fixed = fixed_size_batches(len(lengths), batch_size, seed=seed, epoch=0)
    return budget, fixed, batch_size


def bench_epoch(src_ids: Sequence[Sequence[int]], tgt_ids: Sequence[Sequence[int]], config: ModelConfig,
                *, max_tokens: int = MAX_TOKENS, fraction: float = 0.05, seed: int = 0) -> dict[str, Any]:
    """Time a slice of one epoch under both batchings (steps alternating) and extrapolate to the full epoch.

    Args:
        src_ids, tgt_ids: tokenized pairs (no BOS/EOS).
        config: the model (built twice from the same seed).
        max_tokens: the token budget per batch.
        fraction: share of each epoch's batches to time (the first ones of the shuffled epoch).
    Returns:
        The JSON payload: one row per batching, with slice and extrapolated epoch times.
    """
    lengths = [(len(s), len(t) + 1) for s, t in zip(src_ids, tgt_ids)]
    budget, fixed, batch_size = matched_batches(lengths, max_tokens, seed)
    plans = {"token_budget": budget, "fixed_size": fixed}
    runners = {}
    for name in plans:
        torch.manual_seed(seed)
        model = accelerate(build_model(config), "train").train()
        opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
        runners[name] = (model, opt)

    def step(name: str, batch: list[int]) -> int:
        model, opt = runners[name]
        b = collate_seq2seq([src_ids[i] for i in batch], [tgt_ids[i] for i in batch], config.pad_id, 1, 2)
        hidden = model(b["src"], b["tgt_in"], compute_logits=False).hidden  # (B, T, D)
        summed = model.lm_head.loss(hidden, b["labels"], 0.0)[0]  # padding labels (IGNORE_INDEX) do not count
        (summed / b["n_tokens"]).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return int(b["n_tokens"])

    k = {name: max(1, round(fraction * len(p))) for name, p in plans.items()}
    elapsed = dict.fromkeys(plans, 0.0)
    tokens = dict.fromkeys(plans, 0)
    for i in range(max(k.values())):
        for name, p in plans.items():
            if i < k[name]:
                t0 = time.perf_counter()
                tokens[name] += step(name, p[i])
                elapsed[name] += time.perf_counter() - t0
    rows = []
    for name, p in plans.items():
        sizes = [len(b) for b in p]
        rows.append({
            "batching": name, "batches": len(p), "mean_pairs": sum(sizes) / len(sizes),
            "padding": padding_fraction(p, lengths), "slice_batches": k[name], "slice_s": elapsed[name],
            "tgt_tok_s": tokens[name] / elapsed[name], "epoch_s_est": elapsed[name] * len(p) / k[name],
        })
    est = {r["batching"]: r["epoch_s_est"] for r in rows}
    for r in rows:
        r["speedup_vs_fixed"] = est["fixed_size"] / r["epoch_s_est"]
    return {"pairs": len(lengths), "max_tokens": max_tokens, "fixed_batch_size": batch_size,
            "fraction": fraction, "config": config.to_dict(), "rows": rows}


COLUMNS = ["batching", "batches", "mean_pairs", "padding", "slice_batches", "slice_s", "tgt_tok_s",
           "epoch_s_est", "speedup_vs_fixed"]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """CLI entry point: run, print the table, write ``bench/results/multi30k_epoch.json``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    benchlib.add_common_args(p, runs=None)  # --quick: a 2% slice
    p.add_argument("--fraction", type=float, default=0.05, help="share of the epoch's batches to time")
    p.add_argument("--data", type=Path, default=DATA, help="directory with train.en.gz / train.de.gz")
    args = p.parse_args(argv)
    benchlib.setup(args.threads)
    t0 = time.perf_counter()
    src_ids, tgt_ids, vocab, prep = load_tokenized(args.data)
    fraction = 0.02 if args.quick else args.fraction
    payload = bench_epoch(src_ids, tgt_ids, recipe_config(vocab), fraction=fraction)
    payload["prep"] = prep
    payload["wall_s"] = time.perf_counter() - t0
    print(f"Multi30k train epoch ({payload['pairs']} pairs, BPE {vocab}), {fraction:.0%} slice timed, "
          f"token budget {payload['max_tokens']} vs fixed batch size {payload['fixed_batch_size']}; "
          f"prep {sum(prep.values()):.1f} s (BPE training {prep['tokenizer_s']:.1f} s)")
    benchlib.report("multi30k_epoch", payload, COLUMNS, args.quick)
    return payload


if __name__ == "__main__":
    main()
