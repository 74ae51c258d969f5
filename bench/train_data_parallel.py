"""Data-parallel training on one CPU machine: N ranks of 1 thread against 1 process of N threads.

At the tiny Multi30k recipe's width (128) a training step is many small kernels, and 2 intra-op threads leave
much of the second core idle; two processes of one thread each keep both busy and add one gradient all-reduce
(2.35M parameters, gloo) per step. Each configuration runs the real command, ``aiayn train
recipes/multi30k-en-de-tiny.toml`` with evaluation and checkpoints switched off, in a subprocess, and the
trainer's own log gives the throughput: target tokens per second summed over ranks, over the log windows after
the first (start-up, BPE training and the first steps are excluded). Configurations alternate, ``--runs``
rounds; the table gives medians and the ratio to the single process with the same tokens per step.

    .venv/bin/python bench/train_data_parallel.py            # 3 rounds of 40 steps (about 8 minutes)
    .venv/bin/python bench/train_data_parallel.py --quick    # 1 round of 12 steps at a small batch
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "multi30k-en-de-tiny.toml"
QUIET = ["train.eval_every=1000000", "train.save_every=0", "train.average_last=0", "train.progress=false",
         "eval.bleu=false", "train.max_minutes=30"]


def configurations(batch: int, cores: int) -> dict[str, dict]:
    """name -> {nproc, threads per rank, batch (tokens per rank), per_step (tokens per optimizer step)}."""
    return {
        f"1 process x {cores} threads, {batch} tokens/step": dict(nproc=1, threads=cores, batch=batch, per_step=batch),
        f"{cores} ranks x 1 thread, {batch // cores} each ({batch}/step)": dict(nproc=cores, threads=1,
                                                                             batch=batch // cores, per_step=batch),
        f"{cores} ranks x 1 thread, {batch} each ({batch * cores}/step)": dict(nproc=cores, threads=1, batch=batch,
                                                                            per_step=batch * cores),
    }


def run_once(cfg: dict, steps: int, log_every: int, out: Path) -> dict:
    """Train ``steps`` steps in a subprocess; tokens/s and steps/s over the log windows after the first."""
    cmd = [sys.executable, "-m", "aiayn.cli.main", "train", str(RECIPE), *QUIET, f"train.max_steps={steps}",
           f"train.log_every={log_every}", f"train.threads={cfg['threads']}", f"data.batch_tokens={cfg['batch']}",
           f"train.out_dir={out}", "--nproc", str(cfg["nproc"])]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    subprocess.run(cmd, check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "tokens_per_s" in r]
    later = rows[1:]  # the first window holds start-up and warm-up steps
    seconds = later[-1]["elapsed_s"] - rows[0]["elapsed_s"]
    return {"tokens_per_s": benchlib.median([r["tokens_per_s"] for r in later]),
            "steps_per_s": (later[-1]["step"] - rows[0]["step"]) / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    benchlib.add_common_args(parser, runs=3, malloc=False)  # its `aiayn train` processes keep freed memory
    parser.add_argument("--steps", type=int, default=None, help="training steps per run (default 40)")
    args = parser.parse_args()
    cores = args.threads
    runs = args.runs or (1 if args.quick else 3)
    steps = args.steps or (12 if args.quick else 40)
    log_every = max(2, steps // 4)
    batch = 1024 if args.quick else 4096
    configs = configurations(batch, cores)
    t0 = time.time()
    results: dict[str, list[dict]] = {name: [] for name in configs}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(runs):
            for i, (name, cfg) in enumerate(configs.items()):
                results[name].append(run_once(cfg, steps, log_every, Path(tmp) / f"r{r}c{i}"))
    base = next(n for n, c in configs.items() if c["nproc"] == 1)
    ref = benchlib.median([x["tokens_per_s"] for x in results[base]])
    rows = []
    for name, cfg in configs.items():
        tok = benchlib.median([x["tokens_per_s"] for x in results[name]])
        rows.append({"configuration": name, "target tokens/s": round(tok), "steps/s": round(benchlib.median(
            [x["steps_per_s"] for x in results[name]]), 3), "tokens/s vs 1 process": round(tok / ref, 3),
            "tokens/step": cfg["per_step"]})
    payload = {"steps": steps, "runs": runs, "cores": cores, "rows": rows, "raw": results, "wall_s": time.time() - t0}
    benchlib.report("train_data_parallel", payload, list(rows[0]), args.quick)


if __name__ == "__main__":
    main()
