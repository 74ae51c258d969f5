"""aiayn against itself at two git revisions: beam-4 translation or training speed before and after a change.

A speed change to the library is claimed by timing the code before and after it in one invocation, runs
alternating (A, B, A, B, ...) so that background load hits both alike. Each revision is checked out into a
temporary ``git worktree`` (``WORKTREE`` means this checkout as it is, uncommitted edits included); every timed
run is a fresh subprocess importing that revision's ``aiayn``, decoding the random model and inputs of
``translate_beam.py`` (beam 4, alpha 0.6, EOS masked so that every decode makes the same number of steps).
``same_output`` compares the hypotheses of the two revisions. A ``train:SETUP`` case instead times training
steps (forward, fused loss, backward, Adam) of a ``train_throughput.py`` setup on its fixed random batch, in
target tokens/s; ``same_output`` then compares the step losses to 4 significant digits. ``train-bf16:SETUP``
does the same under bf16 autocast (``train_throughput.py --dtype bfloat16``). A ``generate:BATCH`` case times greedy
generation of ``generate_lm.py``'s GPT-2-like model (16-token prompts, 128 new tokens, no stop id) in tokens/s.
An ``int8-SIZE:BATCH`` case decodes the int8 copy of that model (``--int8``) instead.
``--base-env`` / ``--head-env NAME=VALUE ...`` set environment variables for one side's runs, so one revision can be
timed against itself under two settings (e.g. ``AIAYN_ACCEL=none``, the reference core, against the default).

Every model is the one aiayn's users get at that revision, whichever API it has (:func:`benchlib.for_decoding`,
:func:`benchlib.for_training`, :func:`benchlib.training_loss`): since the core/accelerator split, the reference
accelerated by :func:`aiayn.accel.accelerate` and the loss through ``model.lm_head.loss``; before it, ``build_model``'s
model with the decoding layout and the fused loss on the forward's output weight. Across the split, decodes give the
same tokens but training losses differ: aiayn's dropout became torch's, which draws other masks.

    .venv/bin/python bench/ab_revisions.py --base HEAD~1 --head HEAD
    .venv/bin/python bench/ab_revisions.py --base HEAD --head WORKTREE --cases multi30k:32 paper-base:32
    .venv/bin/python bench/ab_revisions.py --base HEAD~2 --head HEAD --cases train:seq2seq-multi30k-tiny
    .venv/bin/python bench/ab_revisions.py --base HEAD~1 --head HEAD --cases train-bf16:lm-gpt2-small
    .venv/bin/python bench/ab_revisions.py --base HEAD --head WORKTREE --cases generate:1 generate:16
    .venv/bin/python bench/ab_revisions.py --base WORKTREE --head WORKTREE --base-env AIAYN_ACCEL=none \
        --head-env AIAYN_ACCEL=auto --cases paper-base:1 train:seq2seq-paper-base
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
import generate_lm  # noqa: E402
import train_throughput  # noqa: E402
from translate_beam import BOS, EOS, PAD, SIZES, EosMask, Seq2SeqSize, aiayn_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CASES = ["multi30k:1", "multi30k:32", "paper-base:32"]


def time_case(size: Seq2SeqSize, batch: int, runs: int, src_len: int = 20, out_len: int = 20,
              int8: bool = False) -> dict[str, Any]:
    """Time ``runs`` beam-4 decodes (after one warm-up) with the ``aiayn`` this process imports (of the model's int8
    copy with ``int8``), the model as ``load_pretrained`` gives it (:func:`translate_beam.aiayn_model`).

    Returns ``{"times": [s, ...], "digest": sha256 of the hypotheses' tokens}``.
    """
    from aiayn.generate import translate

    torch.manual_seed(0)
    model = aiayn_model(size, "int8" if int8 else "float32")
    g = torch.Generator().manual_seed(batch)
    src = torch.randint(5, size.vocab_size - 2, (batch, src_len), generator=g)  # no special ids
    mask = EosMask(model.lm_head, EOS, out_len)
    out: list[Any] = []

    def run() -> None:
        mask.reset()
        out[:] = translate(model, src, beam_size=4, alpha=0.6, max_len_a=0.0, max_len_b=out_len,
                           bos_id=BOS, eos_id=EOS, pad_id=PAD)

    times = []
    with mask:
        run()
        for _ in range(runs):
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
    tokens = [[h.tokens for h in hyps] for hyps in out]
    return {"times": times, "digest": hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16]}


def time_train_case(setup: str, runs: int, quick: bool = False, dtype: str = "float32") -> dict[str, Any]:
    """Time ``runs`` training steps (after one warm-up) of a ``train_throughput`` setup with this process's ``aiayn``
    (``quick``: the setup's small test model; ``dtype`` "bfloat16": under autocast).

    Returns ``{"times": [s, ...], "units": target tokens per step, "digest": hash of the losses to 4 digits}``.
    """
    step, tokens = train_throughput.build_step(setup, "aiayn", quick, dtype=dtype)
    losses = [step()]
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        losses.append(step())
        times.append(time.perf_counter() - t0)
    digest = hashlib.sha256(json.dumps([f"{x:.4g}" for x in losses]).encode()).hexdigest()[:16]
    return {"times": times, "units": tokens, "digest": digest}


def time_generate_case(batch: int, runs: int, size: generate_lm.LMSize | None = None, prompt_len: int = 16,
                       new_tokens: int = 128) -> dict[str, Any]:
    """Time ``runs`` greedy generations (after one warm-up) of ``generate_lm.py``'s model with this process's
    ``aiayn`` (random prompts, no stop id: exactly ``new_tokens`` each).

    Returns ``{"times": [s, ...], "units": tokens per run, "digest": hash of the tokens}``.
    """
    from aiayn.generate import generate

    ours, _ = generate_lm.build_pair(size or generate_lm.LMSize())
    g = torch.Generator().manual_seed(batch)
    prompts = torch.randint(5, ours.config.vocab_size - 1, (batch, prompt_len), generator=g).tolist()
    out = generate(ours, prompts, max_new_tokens=new_tokens, greedy=True, stop_ids=(), pad_id=0)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        generate(ours, prompts, max_new_tokens=new_tokens, greedy=True, stop_ids=(), pad_id=0)
        times.append(time.perf_counter() - t0)
    return {"times": times, "units": batch * new_tokens,
            "digest": hashlib.sha256(json.dumps(out).encode()).hexdigest()[:16]}


def parse_case(case: str) -> tuple[Seq2SeqSize, int, bool] | str | int:
    """``"multi30k:32"`` -> (the size, batch 32, False), ``"int8-multi30k:32"`` -> (..., True); ``"train:SETUP"``
    or ``"train-bf16:SETUP"`` -> the training setup's name; ``"generate:16"`` -> 16 (the batch of greedy
    generation)."""
    name, _, arg = case.partition(":")
    if name == "generate":
        if not arg.isdigit() or int(arg) < 1:
            raise SystemExit(f"--cases: {case!r}: generate:BATCH needs a positive batch size")
        return int(arg)
    if name in ("train", "train-bf16"):
        if arg not in train_throughput.SETUPS:
            raise SystemExit(f"--cases: {case!r}: {name}:SETUP needs SETUP one of {sorted(train_throughput.SETUPS)}")
        return arg
    size = name.removeprefix("int8-")
    if size not in SIZES or not arg.isdigit():
        raise SystemExit(f"--cases: {case!r} is not [int8-]SIZE:BATCH with SIZE one of {sorted(SIZES)}, "
                         "train:SETUP or generate:BATCH")
    return SIZES[size], int(arg), name.startswith("int8-")


def run_case(case: str, runs: int) -> dict[str, Any]:
    """Time one case with the ``aiayn`` this process imports (``units``: sentences or tokens per timed run)."""
    parsed = parse_case(case)
    if isinstance(parsed, int):
        return time_generate_case(parsed, runs)
    if isinstance(parsed, str):
        return time_train_case(parsed, runs, dtype="bfloat16" if case.startswith("train-bf16:") else "float32")
    return {**time_case(parsed[0], parsed[1], runs=runs, int8=parsed[2]), "units": parsed[1]}


def checkout(rev: str, tmp: Path) -> Path:
    """The ``src`` directory holding revision ``rev`` (a temporary worktree; ``WORKTREE``: this checkout)."""
    if rev == "WORKTREE":
        return REPO / "src"
    path = tmp / rev.replace("/", "_").replace("~", "-").replace("^", "-")
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), rev], check=True,
                   capture_output=True, text=True)
    return path / "src"


def child(src_dir: Path, case: str, runs: int, threads: int, extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run :func:`time_case` in a fresh interpreter that imports ``aiayn`` from ``src_dir``, with ``extra_env`` set."""
    env = {**os.environ, **(extra_env or {}), "PYTHONPATH": str(src_dir)}
    cmd = [sys.executable, __file__, "--child", case, "--runs", str(runs), "--threads", str(threads)]
    return benchlib.run_json_child(cmd, env)


def parse_env(assignments: list[str] | None) -> dict[str, str]:
    """``["NAME=VALUE", ...]`` -> {NAME: VALUE}; a clear error for an item without ``=``."""
    env = {}
    for item in assignments or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"ab_revisions: --base-env/--head-env take NAME=VALUE, got {item!r}")
        env[name] = value
    return env


def bench_ab(base: str, head: str, cases: list[str], rounds: int, runs: int, threads: int,
             base_env: dict[str, str] | None = None, head_env: dict[str, str] | None = None) -> dict[str, Any]:
    """Alternate base/head subprocess runs over ``rounds`` rounds; returns the JSON payload.

    ``base_env`` / ``head_env``: environment variables set for that side's runs only.
    """
    for case in cases:
        parse_case(case)
    envs = {"base": base_env or {}, "head": head_env or {}}
    with tempfile.TemporaryDirectory(prefix="aiayn-ab-") as tmp:
        base_dir = checkout(base, Path(tmp))
        dirs = {"base": base_dir, "head": base_dir if head == base else checkout(head, Path(tmp))}
        try:
            results: dict[str, dict[str, list[dict[str, Any]]]] = {c: {"base": [], "head": []} for c in cases}
            for _ in range(rounds):
                for case in cases:
                    for which in ("base", "head"):
                        results[case][which].append(child(dirs[which], case, runs, threads, envs[which]))
        finally:
            for rev, src_dir in {base: dirs["base"], head: dirs["head"]}.items():  # each checkout once
                if rev != "WORKTREE":
                    subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(src_dir.parent)],
                                   capture_output=True)
    rows = []
    for case, by in results.items():
        units = by["base"][0]["units"]
        times = {w: [t for r in by[w] for t in r["times"]] for w in ("base", "head")}
        med = {w: benchlib.median(ts) for w, ts in times.items()}
        rows.append({"case": case, "unit": "sent/s" if isinstance(parse_case(case), tuple) else "tok/s",
                     "base_per_s": units / med["base"], "head_per_s": units / med["head"],
                     "speedup": med["base"] / med["head"],
                     "same_output": len({r["digest"] for w in by for r in by[w]}) == 1, "times": times})
    return {"base": base, "head": head, "base_env": envs["base"], "head_env": envs["head"], "rounds": rounds,
            "runs_per_round": runs, "rows": rows}


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    """CLI entry point: run, print the table, write ``bench/results/ab_revisions[-TAG].json``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base", default="HEAD~1", help="git revision before the change (default HEAD~1)")
    p.add_argument("--head", default="HEAD", help="git revision after it, or WORKTREE (default HEAD)")
    p.add_argument("--cases", nargs="+", default=DEFAULT_CASES,
                   help="SIZE:BATCH (beam-4 translation, SIZE in translate_beam.SIZES) or train:SETUP (training "
                        "steps, SETUP in train_throughput.SETUPS), train-bf16:SETUP (the same under bf16 autocast), "
                        "or generate:BATCH (greedy generation of generate_lm.py's model)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    p.add_argument("--runs", type=int, default=3, help="timed decodes or steps per subprocess (default 3)")
    p.add_argument("--threads", type=int, default=benchlib.THREADS)
    p.add_argument("--base-env", nargs="+", metavar="NAME=VALUE", help="environment variables for the base runs")
    p.add_argument("--head-env", nargs="+", metavar="NAME=VALUE", help="environment variables for the head runs")
    p.add_argument("--tag", default="", help="results go to bench/results/ab_revisions[-TAG].json")
    p.add_argument("--child", metavar="CASE", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    benchlib.setup(args.threads)
    if args.child:
        print(json.dumps(run_case(args.child, args.runs)))
        return None
    t0 = time.perf_counter()
    base_env, head_env = parse_env(args.base_env), parse_env(args.head_env)
    payload = bench_ab(args.base, args.head, args.cases, args.rounds, args.runs, args.threads, base_env, head_env)
    payload["wall_s"] = time.perf_counter() - t0
    sides = [f"{rev} {' '.join(f'{k}={v}' for k, v in env.items())}".strip()
             for rev, env in ((args.base, base_env), (args.head, head_env))]
    print(f"{sides[0]} (base) vs {sides[1]} (head); median of {args.rounds} x {args.runs} alternating runs; beam-4 "
          "translation in sentences/s, training in target tokens/s, generation in tokens/s")
    print(benchlib.table(payload["rows"], ["case", "unit", "base_per_s", "head_per_s", "speedup", "same_output"]))
    path = benchlib.write_results("ab_revisions" + (f"-{args.tag}" if args.tag else ""), payload)
    print(f"written {path} ({payload['wall_s']:.0f} s)")
    return payload


if __name__ == "__main__":
    main()
