"""Speed on a shared machine: aiayn and transformers alone, beside one busy process, and beside another aiayn run.

Users' machines are rarely idle. torch's thread pool splits every kernel among its threads and waits for the
slowest, so a thread sharing its core with another busy process stalls every kernel; aiayn picks its threads from
the cores other processes leave free and the work's size (:mod:`aiayn.threads`). This bench measures what that
buys: for each system and workload, throughput under each condition divided by its throughput alone
(``ratio`` = busy / idle; a fair share of 2 cores beside one busy process is 0.5).

Workloads, at the demo's model size (``aiayn demo``: 128 wide, FFN 256, 4 heads, 2 + 2 layers, its word
vocabulary of the synthetic grammar):

- ``train``: training steps/s on the demo's own batches (about 1000 target tokens each; forward, backward, Adam);
- ``decode``: beam-4 translation sentences/s, 32 held-out sentences per call, ``OUT_LEN`` decoder steps (EOS
  masked until then, as ``translate_beam.py`` does).

Systems: aiayn as the ``aiayn`` command runs (its process settings, :func:`aiayn.threads.apply_at_start` at start,
the trainer's :class:`aiayn.threads.ThreadGovernor` every step) and transformers' ``MarianMTModel`` of the same size
built from a config, at torch's default threads.

Conditions: ``idle``; ``busy``, beside one CPU-bound process (a 1-thread Python busy loop); ``aiayn``, beside a
second aiayn training process (the ``train`` workload, in a loop, with aiayn's thread policy). Each measurement is a
fresh child process (as a command is), started after the competitor has run a few seconds; it warms up for
``--warmup`` seconds (so that both processes' re-checks of the thread policy have happened) and then counts units
for ``--seconds``. Rounds alternate the order of conditions. Each row reports the median over rounds, the threads
the child ran at, and ``others_busy``: the cores other processes used during its timed window. A run that saw
clearly more than its condition's competitor (something outside the bench started) is left out of the medians
(``runs_used``) and kept in the JSON.

    .venv/bin/python bench/contention.py            # 2 rounds, about 11 minutes on 2 cores
    .venv/bin/python bench/contention.py --quick    # 1 round, short windows
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

SYSTEMS = ("aiayn", "transformers")
WORKLOADS = ("train", "decode")
CONDITIONS = ("idle", "busy", "aiayn")
BEAM, OUT_LEN, DECODE_BATCH = 4, 20, 32
PAD, BOS, EOS = 0, 1, 2  # aiayn's special ids, which the transformers model is given too
BUSY_LOOP = "while True: pass"
#: cores other processes are expected to use under each condition; a run that saw more than this plus
#: DISTURBED_MARGIN was disturbed by something outside the bench and is left out of the medians (kept in the JSON)
EXPECTED_OTHERS = {"idle": 0.0, "busy": 1.0, "aiayn": 1.0}
DISTURBED_MARGIN = 0.4


# ---------------------------------------------------------------------------------------------- the workloads
def demo_task(corpus_file: Path) -> Any:
    """The demo's TranslationTask (its recipe: model size, batches, tokenizer) on the corpus in ``corpus_file``."""
    from aiayn.demos.translation import DEMO_RECIPE
    from aiayn.tasks.translation import TranslationTask

    pairs = {k: [tuple(p) for p in v] for k, v in json.loads(corpus_file.read_text()).items()}
    return TranslationTask(DEMO_RECIPE, pairs=pairs, seed=1)


def write_corpus(path: Path, n_train: int = 3000) -> None:
    """The demo's synthetic grammar, ``n_train`` training pairs (enough batches for any timed window)."""
    from aiayn.data.synthetic import generate_corpus

    path.write_text(json.dumps(generate_corpus(n_train, 64, 64, seed=1)))


def marian(vocab: int, cfg: Any) -> Any:
    """transformers' MarianMTModel of the aiayn model config ``cfg``'s size (paper architecture), random weights."""
    from transformers import MarianConfig, MarianMTModel

    hf_cfg = MarianConfig(vocab_size=vocab, d_model=cfg.d_model, encoder_layers=cfg.n_encoder_layers or cfg.n_layers,
                          decoder_layers=cfg.n_layers, encoder_attention_heads=cfg.n_heads,
                          decoder_attention_heads=cfg.n_heads, encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff,
                          activation_function="relu", scale_embedding=True, max_position_embeddings=256,
                          pad_token_id=PAD, decoder_start_token_id=BOS, eos_token_id=EOS, forced_eos_token_id=EOS,
                          dropout=cfg.dropout, attention_dropout=0.0, activation_dropout=0.0)
    return MarianMTModel(hf_cfg)


def train_unit(system: str, task: Any) -> tuple[Any, Any]:
    """(step function, governor or None): one optimizer step of ``system`` on the demo's next batch."""
    stream = task.batches(None)
    if system == "aiayn":
        from aiayn import accel
        from aiayn.threads import ThreadGovernor
        from aiayn.train.optim import build_optimizer

        model = accel.accelerate(task.model, "train")
        model.train()
        opt = build_optimizer(model, "adam", lr=1e-3)
        governor = ThreadGovernor(model, say=lambda line: print(line, file=sys.stderr))

        def step() -> None:
            batch, _ = next(stream)
            opt.zero_grad(set_to_none=True)
            loss, n, _ = task.loss(batch, 0.1)
            (loss / max(n, 1)).backward()
            opt.step()
            governor.after_step(task.count_targets(batch))
        return step, governor
    model = marian(task.model.config.vocab_size, task.model.config).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step_hf() -> None:
        batch, _ = next(stream)
        opt.zero_grad(set_to_none=True)
        labels = batch["labels"].masked_fill(batch["labels"] == PAD, -100)
        out = model(input_ids=batch["src"], attention_mask=batch["src"] != PAD, decoder_input_ids=batch["tgt_in"],
                     labels=labels)
        out.loss.backward()
        opt.step()
    return step_hf, None


def decode_unit(system: str, task: Any, n_sentences: int = DECODE_BATCH) -> Any:
    """One beam-4 decode of ``n_sentences`` held-out sentences, exactly ``OUT_LEN`` steps (EOS masked before)."""
    ids = [task.src_tok.encode(s) for s in task.valid_text[0][:n_sentences]]  # as translate_texts encodes them
    src = torch.full((len(ids), max(map(len, ids))), PAD, dtype=torch.long)  # (B, S) padded
    for row, x in enumerate(ids):
        src[row, :len(x)] = torch.tensor(x, dtype=torch.long)
    if system == "aiayn":
        from translate_beam import EosMask

        from aiayn import accel
        from aiayn.generate import translate

        model = accel.accelerate(task.model.eval(), "decode")
        mask = EosMask(model.lm_head, EOS, OUT_LEN)
        mask.__enter__()

        def run() -> int:
            mask.reset()
            hyps = translate(model, src, beam_size=BEAM, alpha=0.6, max_len_a=0.0, max_len_b=OUT_LEN, bos_id=BOS,
                             eos_id=EOS, pad_id=PAD)
            return sum(len(h[0].tokens) for h in hyps)
        return run
    model = marian(task.model.config.vocab_size, task.model.config).eval()
    attn = src != PAD

    def run_hf() -> int:
        with torch.inference_mode():
            out = model.generate(src, attention_mask=attn, num_beams=BEAM, length_penalty=0.6, do_sample=False,
                                 min_new_tokens=OUT_LEN, max_new_tokens=OUT_LEN + 1, early_stopping=False)
        return int((out != PAD).sum())
    return run_hf


# ---------------------------------------------------------------------------------------------- one child process
def child(system: str, workload: str, corpus_file: Path, warmup: float, seconds: float,
          forever: bool = False) -> dict[str, Any]:
    """Run ``workload`` of ``system`` as a command would: warm up for ``warmup`` s, then count units for
    ``seconds`` s (``forever``: a competitor that never stops)."""
    from aiayn import threads

    start = threads.sample()
    if system == "aiayn":
        from aiayn import accel

        accel.setup_process()  # as the aiayn command: keep freed memory
        threads.apply_at_start(start)
    torch.manual_seed(0)
    task = demo_task(corpus_file)
    if workload == "train":
        unit, _ = train_unit(system, task)
        per_unit = 1
    else:
        unit, per_unit = decode_unit(system, task), DECODE_BATCH
    threads_start = torch.get_num_threads()
    t_end = time.monotonic() + warmup
    unit()
    while forever or time.monotonic() < t_end:
        unit()
    before, t0, n = threads.sample(), time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        unit()
        n += 1
    elapsed = time.perf_counter() - t0
    after = threads.sample()
    busy = threads.others_busy(before, after) if before and after else None
    return {"units_per_s": n * per_unit / elapsed, "units": n * per_unit, "seconds": elapsed,
            "threads_start": threads_start, "threads": torch.get_num_threads(),
            "others_busy": None if busy is None else round(busy, 2)}


def run_child(system: str, workload: str, corpus_file: Path, warmup: float, seconds: float) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", f"{system}:{workload}", "--corpus", str(corpus_file),
           "--warmup", str(warmup), "--seconds", str(seconds)]
    return benchlib.run_json_child(cmd, env=_child_env())


def _child_env() -> dict[str, str]:
    """The environment of every child: no thread count forced on anyone (each system's default is the subject)."""
    env = dict(os.environ)
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.pop(key, None)
    return env


def start_competitor(condition: str, corpus_file: Path) -> subprocess.Popen | None:
    """The process the measured child runs beside (None when idle)."""
    if condition == "idle":
        return None
    if condition == "busy":
        cmd = [sys.executable, "-c", BUSY_LOOP]
    else:
        cmd = [sys.executable, __file__, "--child", "aiayn:train", "--corpus", str(corpus_file), "--forever"]
    return subprocess.Popen(cmd, env=_child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def stop(proc: subprocess.Popen | None) -> None:
    if proc is None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait()


# ---------------------------------------------------------------------------------------------- the bench
def bench(rounds: int, warmup: float, seconds: float, settle: float,
          systems: tuple[str, ...] = SYSTEMS, workloads: tuple[str, ...] = WORKLOADS,
          conditions: tuple[str, ...] = CONDITIONS) -> dict[str, Any]:
    """Every (condition, system, workload) measured ``rounds`` times; returns the JSON payload."""
    got: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="aiayn-bench-contention-") as tmp:
        corpus = Path(tmp) / "corpus.json"
        write_corpus(corpus)
        for r in range(rounds):
            order = conditions if r % 2 == 0 else tuple(reversed(conditions))
            for condition in order:
                competitor = start_competitor(condition, corpus)
                try:
                    time.sleep(settle if competitor else 0.0)
                    for system in systems if r % 2 == 0 else tuple(reversed(systems)):
                        for workload in workloads:
                            res = run_child(system, workload, corpus, warmup, seconds)
                            got.setdefault((condition, system, workload), []).append(res)
                            print(f"round {r + 1} {condition:5s} {system:12s} {workload:6s} "
                                  f"{res['units_per_s']:8.2f}/s  threads {res['threads_start']}->{res['threads']}  "
                                  f"others_busy {res['others_busy']}", flush=True)
                finally:
                    stop(competitor)
    return summarize(got, systems, workloads, conditions)


def summarize(got: dict[tuple[str, str, str], list[dict[str, Any]]], systems: tuple[str, ...],
              workloads: tuple[str, ...], conditions: tuple[str, ...]) -> dict[str, Any]:
    """Rows of medians and busy/idle ratios (one per workload, condition and system)."""
    def undisturbed(condition: str, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        kept = [x for x in runs if (x["others_busy"] or 0.0) <= EXPECTED_OTHERS[condition] + DISTURBED_MARGIN]
        return kept or runs  # all disturbed: report them rather than nothing (the others_busy column shows it)

    rows = []
    for workload in workloads:
        for condition in conditions:
            for system in systems:
                runs = got.get((condition, system, workload), [])
                idle = got.get(("idle", system, workload), [])
                if not runs or not idle:
                    continue
                used, idle_used = undisturbed(condition, runs), undisturbed("idle", idle)
                rate = statistics.median(x["units_per_s"] for x in used)
                idle_rate = statistics.median(x["units_per_s"] for x in idle_used)
                rows.append({"workload": workload, "unit": "steps/s" if workload == "train" else "sentences/s",
                             "condition": condition, "system": system, "rate": rate,
                             "ratio_vs_idle": rate / idle_rate,
                             "threads": "/".join(sorted({str(x["threads"]) for x in used})),
                             "others_busy": statistics.median(x["others_busy"] or 0.0 for x in used),
                             "runs_used": f"{len(used)}/{len(runs)}",
                             "runs": [{"rate": round(x["units_per_s"], 3), "threads": x["threads"],
                                       "others_busy": x["others_busy"]} for x in runs]})
    return {"rows": rows, "target": "aiayn ratio_vs_idle >= 0.45 beside one busy process on 2 cores (fair: 0.5)",
            "beam": BEAM, "out_len": OUT_LEN, "decode_batch": DECODE_BATCH}


COLUMNS = ["workload", "unit", "condition", "system", "rate", "ratio_vs_idle", "threads", "others_busy", "runs_used"]


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="1 round, short windows")
    p.add_argument("--rounds", type=int, default=None, help="rounds over every condition (default 2; 1 --quick)")
    p.add_argument("--warmup", type=float, default=None,
                   help="seconds each child runs before it counts (default 12, past the thread policy's first re-check "
                        "of both processes; 4 with --quick)")
    p.add_argument("--seconds", type=float, default=None, help="seconds each child counts (default 12; 4 --quick)")
    p.add_argument("--settle", type=float, default=None,
                   help="seconds a competitor runs before the first child starts (default 8; 4 --quick)")
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    p.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    p.add_argument("--conditions", nargs="+", choices=CONDITIONS, default=list(CONDITIONS))
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--corpus", help=argparse.SUPPRESS)
    p.add_argument("--forever", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        system, workload = args.child.split(":")
        res = child(system, workload, Path(args.corpus), args.warmup or 0.0, args.seconds or 0.0, args.forever)
        print(json.dumps(res))
        return None
    quick = args.quick
    rounds = args.rounds or (1 if quick else 2)
    warmup = args.warmup if args.warmup is not None else (4.0 if quick else 12.0)
    seconds = args.seconds if args.seconds is not None else (4.0 if quick else 12.0)
    settle = args.settle if args.settle is not None else (4.0 if quick else 8.0)
    if "idle" not in args.conditions:
        p.error("--conditions must include idle: every ratio is against it")
    t0 = time.time()
    payload = bench(rounds, warmup, seconds, settle, tuple(args.systems), tuple(args.workloads),
                    tuple(args.conditions))
    payload.update({"rounds": rounds, "warmup_s": warmup, "seconds": seconds, "settle_s": settle,
                    "wall_s": time.time() - t0, "cores": len(os.sched_getaffinity(0))})
    benchlib.report("contention", payload, COLUMNS, quick)
    return payload


if __name__ == "__main__":
    main()
