"""How far past their training context do position schemes carry? Char-level Tiny Shakespeare models trained at
context 128, scored at 128, 256, 512 and 1024.

Five models differ only in ``position``: sinusoidal (with the paper's sqrt(d_model) embedding scale, so that the
encodings do not swamp the embeddings), learned (a 1024-row table of which training reaches the first 128), RoPE,
ALiBi and T5's relative bias. The RoPE model is scored four ways: as trained, and with linear position
interpolation, NTK-aware scaling and YaRN, each with the factor L / 128 at length L (applied only past 128). Each
score is the mean per-character loss (nats) over the validation text (the last 10%, as the recipe splits it) cut
into non-overlapping windows of L characters, every position of a window scored.

    .venv/bin/python recipes/sweeps/position_extrapolation.py OUT [--steps 600] [--threads 1]

Writes ``OUT/position_extrapolation.json`` and ``OUT/position_extrapolation.png`` and prints the table; a model
already trained under OUT (its ``best/``) is reused.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "shakespeare-char-cpu.toml"
SCHEMES = ("sinusoidal", "learned", "rope", "alibi", "t5")
LENGTHS = (128, 256, 512, 1024)
ROPE_SCALINGS = ("linear", "ntk", "yarn")


def train(out: Path, scheme: str, steps: int, threads: int) -> Path:
    """Train (or reuse) the model of one position scheme; returns its best checkpoint."""
    from aiayn.tasks.registry import run_recipe

    run = out / f"pos-{scheme}"
    if (run / "best" / "model.safetensors").is_file():
        return run / "best"
    overrides = [f"model.position={scheme}", "model.max_len=1024", "model.d_model=128", "model.n_layers=4",
                 "model.d_ff=512", f"train.max_steps={steps}", f"train.warmup={max(1, steps // 10)}",
                 f"train.out_dir={run.as_posix()}", f"train.threads={threads}", "train.max_minutes=120",
                 f"train.eval_every={steps}", "train.progress=false", "data.block_size=128"]
    if scheme == "sinusoidal":  # the paper scales embeddings by sqrt(d_model) to the encodings' size
        overrides.append("model.scale_embeddings=true")
    run_recipe(str(RECIPE), overrides)
    return run / "best"


def validation_ids(tokenizer: Any) -> torch.Tensor:
    """The recipe's validation text (its last 10%) as token ids."""
    text = (ROOT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    return torch.tensor(tokenizer.encode(text[int(len(text) * 0.9):]))


@torch.no_grad()
def window_loss(model: torch.nn.Module, ids: torch.Tensor, length: int, batch: int = 8) -> float:
    """Mean loss (nats per token) over non-overlapping windows of ``length`` tokens, every position scored."""
    n = (ids.numel() - 1) // length
    x = ids[: n * length].view(n, length)
    y = ids[1: n * length + 1].view(n, length)
    total = 0.0
    for i in range(0, n, batch):
        logits = model(x[i:i + batch]).logits  # (b, L, V)
        total += float(F.cross_entropy(logits.flatten(0, 1), y[i:i + batch].flatten(), reduction="sum"))
    return total / (n * length)


def scaled(pre: Any, scaling: str, factor: float) -> torch.nn.Module:
    """The RoPE model with its frequencies rescaled at evaluation (no training)."""
    from aiayn.accel import accelerate
    from aiayn.models.build import build_model

    config = pre.config.replace(rope_scaling=scaling, rope_scaling_factor=factor, rope_original_max_len=128)
    model = build_model(config).eval()
    model.load_state_dict(pre.model.state_dict())
    return accelerate(model, "decode")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", type=Path, help="folder for the five runs and the results")
    p.add_argument("--steps", type=int, default=600, help="training steps of each model (default 600)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    from aiayn.pretrained import load_pretrained

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    rows: dict[str, list[float | None]] = {}
    for scheme in SCHEMES:
        pre = load_pretrained(train(args.out, scheme, args.steps, args.threads))
        ids = validation_ids(pre.tokenizers["text"])
        rows[scheme] = [window_loss(pre.model, ids, n) for n in LENGTHS]
        if scheme == "rope":
            for scaling in ROPE_SCALINGS:
                rows[f"rope + {scaling}"] = [window_loss(pre.model if n == 128 else scaled(pre, scaling, n / 128),
                                                         ids, n) for n in LENGTHS]
        print(scheme, [f"{x:.3f}" for x in rows[scheme]], flush=True)
    result = {"lengths": list(LENGTHS), "loss": rows, "steps": args.steps, "threads": args.threads,
              "wall_s": time.perf_counter() - t0}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "position_extrapolation.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print("| scheme | " + " | ".join(f"loss at {n}" for n in LENGTHS) + " |")
    print("| --- |" + " --- |" * len(LENGTHS))
    for name, losses in rows.items():
        print(f"| {name} | " + " | ".join(f"{x:.3f}" if math.isfinite(x) else "inf" for x in losses) + " |")
    plot(result, args.out / "position_extrapolation.png")
    return result


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, losses in result["loss"].items():
        ax.plot(result["lengths"], [min(x, 6.0) for x in losses], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(result["lengths"], [str(n) for n in result["lengths"]])
    ax.set_xlabel("evaluation context (characters); trained at 128")
    ax.set_ylabel("validation loss (nats/char), capped at 6")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
