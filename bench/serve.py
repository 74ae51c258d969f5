"""Serving under load: ``aiayn serve`` against the same requests served one at a time and ``transformers serve``.

A GPT-2-like decoder (generate_lm.py's 6 x 384, vocabulary 50257, random weights) is saved as a transformers folder
with a word-level tokenizer (``w0 .. wN``) and converted with ``aiayn convert --from-hf`` semantics
(:func:`aiayn.hf.from_hf`), so both servers hold the same weights. Each contender runs as its own server process on
loopback, with the same torch thread count:

- ``aiayn``: ``aiayn serve --max-batch 64`` (continuous batching);
- ``aiayn, one at a time``: ``aiayn serve --max-batch 1`` (requests queue and decode alone);
- ``transformers``: ``transformers serve --continuous-batching --device cpu`` (its paged-attention batching).

For each number of concurrent clients (``--clients``, default 1 4 16 64) a load generator in this process sends a
fixed, seeded set of streaming ``/v1/completions`` requests (prompts of 8-48 words, 16-48 new tokens, greedy), each
client one request after another, bounded in count (``--requests`` per client) and time (``--max-seconds`` per
level). It reports output tokens/s over the level's wall time, and p50/p95 of the time to first token and of the
time per output token after the first. With ``--soak N`` it then sends N short requests to ``aiayn serve`` (16 at a
time) and reports its resident memory after the first 10% and after all of them.

    .venv/bin/python bench/serve.py                  # bench/results/serve.json
    .venv/bin/python bench/serve.py --quick          # a 2-layer model, 1 and 4 clients, aiayn only
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
from converted_gpt2 import save_word_tokenizer  # noqa: E402

CONTENDERS = ("aiayn", "aiayn, one at a time", "transformers")


def make_model(folder: Path, quick: bool) -> tuple[Path, Path, int]:
    """A random GPT-2-like transformers folder and its aiayn conversion: (hf folder, aiayn checkpoint, vocab)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from aiayn.hf import from_hf

    vocab = 50257
    layers, width = (2, 128) if quick else (6, 384)
    torch.manual_seed(0)
    config = GPT2Config(n_layer=layers, n_embd=width, n_head=width // 64, vocab_size=vocab, n_positions=1024,
                        bos_token_id=vocab - 1, eos_token_id=vocab - 1)
    hf = folder / "hf"
    GPT2LMHeadModel(config).eval().save_pretrained(hf)
    save_word_tokenizer(hf, vocab, vocab - 1, vocab - 1)
    return hf, from_hf(hf, folder / "aiayn"), vocab


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(contender: str, hf: Path, checkpoint: Path, threads: int) -> tuple[subprocess.Popen, str, str]:
    """The contender's server process, its base URL and model name, once it answers ``/v1/models``."""
    import httpx

    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    if contender == "transformers":
        cmd = [str(Path(sys.executable).with_name("transformers")), "serve", str(hf), "--continuous-batching",
               "--device", "cpu", "--port", str(port), "--host", "127.0.0.1", "--log-level", "error"]
        name = str(hf)
    else:
        batch = "1" if "one at a time" in contender else "64"
        cmd = [sys.executable, "-m", "aiayn", "serve", "--checkpoint", str(checkpoint), "--port", str(port),
               "--max-batch", batch, "--max-queue", "4096", "--threads", str(threads), "--name", "bench"]
        name = "bench"
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{contender}: the server exited ({proc.returncode}): {' '.join(cmd)}")
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                return proc, url, name
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"{contender}: no answer within 300 s")


def requests_for(clients: int, per_client: int, vocab: int, seed: int = 0) -> list[list[dict[str, Any]]]:
    """Each client's requests: prompts of 8-48 words, 16-48 new tokens (the same for every contender)."""
    rng = random.Random(seed * 1000 + clients)
    return [[{"prompt": " ".join(f"w{rng.randrange(1, vocab - 1)}" for _ in range(rng.randrange(8, 49))),
              "max_tokens": rng.randrange(16, 49)} for _ in range(per_client)] for _ in range(clients)]


async def one(client: Any, url: str, name: str, job: dict[str, Any]) -> dict[str, float] | None:
    """Stream one completion: its time to first token, time per later token and tokens; None when it failed."""
    body = {"model": name, "prompt": job["prompt"], "max_tokens": job["max_tokens"], "temperature": 0,
            "stream": True}
    sent = time.perf_counter()
    stamps = []
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            return None
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]" and '"text":""' not in line.replace(" ", ""):
                stamps.append(time.perf_counter())
    if not stamps:
        return None
    n = len(stamps)
    return {"ttft": stamps[0] - sent, "tpot": (stamps[-1] - stamps[0]) / (n - 1) if n > 1 else 0.0, "tokens": n}


async def load(url: str, name: str, jobs: list[list[dict[str, Any]]], max_seconds: float) -> dict[str, Any]:
    """Every client sends its requests one after another, all clients at once; the level's figures."""
    import httpx

    results: list[dict[str, float]] = []
    failed = 0
    stop_at = time.perf_counter() + max_seconds

    async def run_client(client: Any, mine: list[dict[str, Any]]) -> None:
        nonlocal failed
        for job in mine:
            if time.perf_counter() > stop_at:
                return
            got = await one(client, url, name, job)
            if got is None:
                failed += 1
            else:
                results.append(got)

    limits = httpx.Limits(max_connections=len(jobs) + 4, max_keepalive_connections=len(jobs) + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(run_client(client, mine) for mine in jobs))
        wall = time.perf_counter() - t0

    def pct(xs: list[float], q: float) -> float:
        return statistics.quantiles(xs, n=100)[q - 1] if len(xs) >= 2 else (xs[0] if xs else float("nan"))
    tokens = sum(r["tokens"] for r in results)
    ttft, tpot = [r["ttft"] for r in results], [r["tpot"] for r in results if r["tokens"] > 1]
    return {"requests": len(results), "failed": failed, "wall_s": wall, "tok_s": tokens / wall,
            "ttft_p50_ms": 1e3 * pct(ttft, 50), "ttft_p95_ms": 1e3 * pct(ttft, 95),
            "tpot_p50_ms": 1e3 * pct(tpot, 50), "tpot_p95_ms": 1e3 * pct(tpot, 95)}


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def soak(url: str, name: str, pid: int, total: int, vocab: int) -> dict[str, float]:
    """``total`` short requests, 16 at a time: resident memory after the first tenth and after all."""
    rng = random.Random(7)
    jobs = [{"prompt": " ".join(f"w{rng.randrange(1, vocab - 1)}" for _ in range(rng.randrange(4, 33))),
             "max_tokens": rng.randrange(2, 9)} for _ in range(total)]
    first = total // 10

    def chunked(part: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
        return [part[i::16] for i in range(16)]
    asyncio.run(load(url, name, chunked(jobs[:first]), 3600))
    early = rss_mb(pid)
    asyncio.run(load(url, name, chunked(jobs[first:]), 3600))
    late = rss_mb(pid)
    return {"requests": total, "rss_after_first_mb": early, "rss_after_all_mb": late, "growth": late / early - 1}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    benchlib.add_common_args(p, runs=None, malloc=False)
    p.add_argument("--clients", type=int, nargs="+", default=None)
    p.add_argument("--requests", type=int, default=None, help="requests per client per level (default 4)")
    p.add_argument("--max-seconds", type=float, default=120.0, help="the most seconds per level")
    p.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=None)
    p.add_argument("--soak", type=int, default=0, help="also send N short requests to aiayn serve (memory)")
    args = p.parse_args(argv)
    clients = args.clients or ([1, 4] if args.quick else [1, 4, 16, 64])
    contenders = args.contenders or (["aiayn"] if args.quick else list(CONTENDERS))
    per_client = args.requests or (2 if args.quick else 4)
    started = time.time()
    rows, soaked = [], None
    with tempfile.TemporaryDirectory() as tmp:
        hf, checkpoint, vocab = make_model(Path(tmp), args.quick)
        for contender in contenders:
            proc, url, name = start(contender, hf, checkpoint, args.threads)
            try:
                asyncio.run(load(url, name, requests_for(2, 1, vocab, seed=99), 60))  # warm-up
                for n in clients:
                    row = {"contender": contender, "clients": n,
                           **asyncio.run(load(url, name, requests_for(n, per_client, vocab), args.max_seconds))}
                    rows.append(row)
                    print(benchlib.table([row]), flush=True)
                if contender == "aiayn" and args.soak:
                    soaked = soak(url, name, proc.pid, args.soak, vocab)
                    print(f"soak: {soaked}", flush=True)
            finally:
                proc.terminate()
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
    for row in rows:  # against the same number of clients served one at a time, and by transformers
        for other, key in (("aiayn, one at a time", "vs_one_at_a_time"), ("transformers", "vs_transformers")):
            match = next((r for r in rows if r["contender"] == other and r["clients"] == row["clients"]), None)
            if match and row["contender"] == "aiayn":
                row[key] = row["tok_s"] / match["tok_s"]
    payload = {"rows": rows, "soak": soaked, "threads": args.threads, "per_client": per_client,
               "wall_s": time.time() - started}
    benchlib.report("serve", payload, ["contender", "clients", "requests", "failed", "tok_s", "ttft_p50_ms",
                                       "ttft_p95_ms", "tpot_p50_ms", "tpot_p95_ms", "vs_one_at_a_time",
                                       "vs_transformers"], quick=args.quick)
    return payload


if __name__ == "__main__":
    main()
