"""``aiayn train RECIPE --dry-run``: a recipe checked end to end on this machine, nothing written.

The recipe is validated as ``aiayn train`` validates it, its data read, its tokenizer trained in memory and its model
built at the recipe's vocabulary size (a small stand-in corpus gives a smaller tokenizer; the model is the full
one). Then a few optimizer steps run on the current device at a reduced token budget, and the run is planned from
them: parameters by part, tokens per step, memory per rank, the time per step measured here and scaled to the
recipe's step, and the time of ``max_steps`` on named GPUs from the FLOPs (:mod:`aiayn.train.estimates`).
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from aiayn.devices import pick_device
from aiayn.errors import AiaynError
from aiayn.output_folder import check_run_folder
from aiayn.tasks.registry import train_config
from aiayn.tasks.translation import TranslationTask
from aiayn.train.distributed import Ranks
from aiayn.train.estimates import GPUS, MFU, activation_bytes, hours_on, rank_memory, step_flops
from aiayn.train.parallel import parallelize
from aiayn.train.precision import Precision
from aiayn.train.recipe import load_recipe, validate_recipe, with_data_dir
from aiayn.train.step import TrainStep
from aiayn.train.train_config import TrainConfig

PLANNED_RANKS = (1, 8)  # the data-parallel sizes the plan is printed for
SENTENCE_TOKENS = 32  # the padded sentence length the activation and FLOP estimates assume (WMT 2014 BPE: ~30)


@dataclass
class DryRun:
    """What a dry run found (the figures :func:`format_report` prints).

    Attributes:
        recipe: the recipe's path.
        parts: parameters by part of the model, tied weights counted once, in the part that holds them first.
        params: all parameters.
        device: where the timed steps ran.
        step_tokens: the padded tokens a side per micro-batch of the timed steps.
        timed: per timed step, (seconds for forward and backward, seconds for the update, target tokens).
        step_seconds: the recipe's whole step (every rank's micro-batches) on this one device, scaled from ``timed``
            (0.0 without timed steps).
        measured_peak: the peak bytes the timed steps allocated on CUDA, or this process's peak RSS on the CPU.
        plan: per planned rank count, the tokens per step, memory per rank and time estimates.
        notes: what a real run would say beside (an out_dir it would refuse, a stand-in vocabulary).
        cfg: the recipe's ``[train]`` settings.
    """

    recipe: str
    parts: dict[str, int]
    params: int
    device: str
    step_tokens: int
    timed: list[tuple[float, float, int]]
    step_seconds: float
    measured_peak: float
    plan: dict[int, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    cfg: TrainConfig = field(default_factory=TrainConfig)


def dry_run(path: str | Path, overrides: list[str] | None = None, *, data_dir: str | None = None, steps: int = 3,
            step_tokens: int | None = None) -> DryRun:
    """Check ``path`` with ``overrides`` end to end and plan its run; writes nothing.

    Args:
        path: the recipe.
        overrides: ``section.key=value`` overrides.
        data_dir: a folder holding the recipe's data files by name (:func:`~aiayn.train.recipe.with_data_dir`).
        steps: timed optimizer steps after one untimed warm-up step (0: no steps, the plan from FLOPs alone).
        step_tokens: padded tokens a side per micro-batch of the timed steps (default: the recipe's on CUDA, 256 on
            the CPU).

    Raises:
        AiaynError: any problem of the recipe, its data or its model, as ``aiayn train`` would raise it.
    """
    recipe = load_recipe(path, overrides)
    if recipe["task"] != "translation":
        raise AiaynError(f"{path}: --dry-run plans translation recipes (token budgets a side, an encoder-decoder); "
                         f"this is a {recipe['task']!r} recipe: train it with a small train.max_steps instead")
    if data_dir is not None:
        with_data_dir(recipe, data_dir)
    validate_recipe(recipe)
    cfg = train_config(recipe)
    notes = []
    try:
        check_run_folder(cfg.out_dir)
    except AiaynError as e:
        notes.append(f"a real run would refuse its out_dir: {e}")
    task = _build(recipe, cfg)
    model = task.model
    parts, params = parameter_parts(model)
    budget = task.data["batch_tokens"]
    device = next(model.parameters()).device
    tokens = step_tokens or (budget if device.type == "cuda" else 256)
    timed, peak = _timed_steps(task, cfg, steps, tokens)
    result = DryRun(str(path), parts, params, str(device), tokens, timed, 0.0, peak, notes=notes, cfg=cfg)
    _plan(result, task, cfg, budget)
    return result


def _build(recipe: dict[str, Any], cfg: TrainConfig) -> TranslationTask:
    """The recipe's task as ``aiayn train`` builds it, its model at the recipe's vocabulary size."""
    vocab = int(recipe["tokenizer"].get("vocab_size", 0) or 0)
    return TranslationTask(recipe, device=pick_device(cfg.device), seed=cfg.seed, model_vocab_size=vocab)


def parameter_parts(model: nn.Module) -> tuple[dict[str, int], int]:
    """({child module name: its parameters not already counted in an earlier child}, all parameters): a tied
    output layer shows only what it does not share."""
    seen: set[int] = set()
    parts: dict[str, int] = {}
    for name, child in model.named_children():
        count = 0
        for p in child.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                count += p.numel()
        parts[name] = count
    rest = sum(p.numel() for p in model.parameters() if id(p) not in seen)
    if rest:
        parts["(own)"] = rest
    return parts, sum(parts.values())


def _timed_steps(task: TranslationTask, cfg: TrainConfig, steps: int,
                 tokens: int) -> tuple[list[tuple[float, float, int]], float]:
    """One warm-up step, then ``steps`` timed optimizer steps of ``cfg.accum`` micro-batches of ``tokens`` padded
    tokens a side; returns (forward + backward seconds, update seconds, target tokens) per step and the peak
    memory (CUDA: allocated bytes; CPU: this process's peak RSS)."""
    if steps < 1:
        return [], 0.0
    on_cpu = next(task.model.parameters()).device.type == "cpu"
    task.data = {**task.data, "batch_tokens": tokens}  # the task's in-memory copy; the recipe is unchanged
    par = parallelize(task, "single", Ranks(), cfg, on_cpu=on_cpu)
    step = TrainStep.build(task, par, Precision(cfg.dtype, "cpu" if on_cpu else "cuda"), cfg)
    if not on_cpu:
        torch.cuda.reset_peak_memory_stats()
    stream = task.batches(None)
    task.model.train()
    out = []
    for i in range(steps + 1):
        micro = [next(stream)[0] for _ in range(cfg.accum)]
        _sync(on_cpu)
        started = time.perf_counter()
        record = step(micro, late=lambda: False)
        _sync(on_cpu)
        backward = time.perf_counter()
        if record.problem is None:
            step.update()
        _sync(on_cpu)
        if i:  # the first step warms up kernels and allocators
            out.append((backward - started, time.perf_counter() - backward, record.targets))
    peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0 if on_cpu
            else float(torch.cuda.max_memory_allocated()))
    return out, peak


def _sync(on_cpu: bool) -> None:
    if not on_cpu:
        torch.cuda.synchronize()


def _plan(result: DryRun, task: TranslationTask, cfg: TrainConfig, budget: int) -> None:
    """Fill ``result.step_seconds`` and ``result.plan``: per planned rank count, tokens per step, memory per rank
    and times, for the recipe's micro-batches of ``budget`` padded tokens a side."""
    config = task.model.config
    sentences = budget / SENTENCE_TOKENS
    bf16 = cfg.dtype == "bfloat16"
    acts = activation_bytes(config, sentences, SENTENCE_TOKENS, SENTENCE_TOKENS, bf16)
    planned_ranks = max(PLANNED_RANKS)
    step_tokens = budget * cfg.accum * planned_ranks  # the recipe's step, as set for the planned ranks
    micro, update = 0.0, 0.0  # seconds of one micro-batch of `budget` tokens, and of one update, on this device
    if result.timed:  # compute runs over padded tensors, so the time scales with padded tokens
        forward_backward = sum(t[0] for t in result.timed) / len(result.timed)
        update = sum(t[1] for t in result.timed) / len(result.timed)
        micro = forward_backward * budget / (cfg.accum * result.step_tokens)
        result.step_seconds = micro * step_tokens / budget + update
    flops = step_flops(config, step_tokens, SENTENCE_TOKENS, SENTENCE_TOKENS) * cfg.max_steps
    for ranks in PLANNED_RANKS:
        shards = ranks if (cfg.parallel == "fsdp" and ranks > 1) else 1
        accum = cfg.accum * planned_ranks // ranks  # the same tokens per step on fewer ranks
        result.plan[ranks] = {
            "accum": accum, "tokens_per_step": budget * accum * ranks,
            "memory": rank_memory(result.params, shards, acts), "sharded": shards > 1,
            "gpus": {gpu.name: hours_on(gpu, ranks, flops) for gpu in GPUS}, "total_flops": flops,
            "device_step_seconds": micro * accum + update if result.timed else None,
        }


def format_report(r: DryRun, wall_seconds: float) -> str:
    """The dry run as the lines ``aiayn train --dry-run`` prints."""
    cfg = r.cfg
    gib = 2.0**30
    lines = [f"{r.recipe}: dry run, nothing written", "parameters by part (tied weights counted once):"]
    lines += [f"  {name:<12} {count:>13,}" for name, count in r.parts.items()]
    lines.append(f"  {'total':<12} {r.params:>13,}  ({r.params / 1e6:.1f}M)")
    for ranks, p in r.plan.items():
        m = p["memory"]
        sharded = ", FSDP-sharded" if p["sharded"] else ""
        lines.append(f"{ranks} rank(s): train.accum={p['accum']}, {p['tokens_per_step']:,} padded tokens a side per "
                     f"step; memory per rank (estimate{sharded}): weights "
                     f"{m.weights / gib:.2f} GiB, gradients {m.gradients / gib:.2f}, Adam state "
                     f"{m.optimizer / gib:.2f}, activations {m.activations / gib:.2f} (formula, "
                     f"{SENTENCE_TOKENS}-token sentences), total {m.total / gib:.2f} GiB"
                     + (f"; rank 0 holds one more whole copy of the weights ({4 * r.params / gib:.2f} GiB) to evaluate "
                        "and save" if p["sharded"] else ""))
    if r.timed:
        fb = ", ".join(f"{t[0]:.2f}+{t[1]:.2f} s ({t[2]} targets)" for t in r.timed)
        peak = "peak allocated" if r.device.startswith("cuda") else "peak RSS of this process"
        lines.append(f"timed steps on {r.device} at {r.step_tokens} padded tokens a side x accum {cfg.accum} "
                     f"(forward+backward + update): {fb}; {peak} {r.measured_peak / gib:.2f} GiB")
        for ranks, p in r.plan.items():
            seconds, micro = p["device_step_seconds"], p["tokens_per_step"] // (ranks * p["accum"])
            lines.append(f"  on {ranks} device(s) like this one, each its {p['accum']} micro-batch(es) of "
                         f"{micro:,} tokens (forward+backward scaled linearly in padded tokens, plus one update; "
                         f"communication not counted): {seconds:.2f} s a step, "
                         f"{seconds * cfg.max_steps / 3600:,.1f} h for {cfg.max_steps:,} steps")
    any_plan = next(iter(r.plan.values()))
    lines.append(f"estimates from FLOPs ({any_plan['total_flops']:.3g} for {cfg.max_steps:,} steps, "
                 f"{MFU:.0%} of each GPU's dense peak; a lower bound where a step is too small to keep a GPU busy):")
    for ranks, p in r.plan.items():
        cells = "; ".join(f"{name} {wall:,.2f} h ({gpu_h:,.1f} GPU-h)" for name, (wall, gpu_h) in p["gpus"].items())
        lines.append(f"  {ranks} GPU(s): {cells}")
    lines += [f"note: {n}" for n in r.notes]
    lines.append(f"dry run took {wall_seconds:.1f} s")
    return "\n".join(lines)
