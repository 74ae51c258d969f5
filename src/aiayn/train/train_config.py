"""The ``[train]`` section of a recipe: optimization and bookkeeping settings, validated at construction."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch

from aiayn import accel
from aiayn.config import type_problems, unknown_key
from aiayn.errors import AiaynError

PARALLELS = ("ddp", "fsdp")  # aiayn.train.parallel's engines

DTYPES = ("float32", "bfloat16", "float16")
MAX_SEED = 10_000_000  # tasks derive per-epoch seeds as seed * 1_000_003^2 + ..., which must fit in 64 bits


@dataclass
class TrainConfig:
    """Optimization and bookkeeping settings (the ``[train]`` section of a recipe)."""

    out_dir: str = "runs/model"
    max_steps: int = 1000
    max_minutes: float | None = None
    seed: int = 1
    optimizer: str = "adam"
    lr: float = 1.0
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-9
    weight_decay: float = 0.0
    schedule: str = "inverse_sqrt_warmup"
    warmup: int = 4000
    min_lr_ratio: float = 0.0
    accum: int = 1
    clip_norm: float | None = 1.0
    label_smoothing: float = 0.1
    max_nonfinite_steps: int = 8  # consecutive steps with a non-finite loss or gradient norm that end the run
    eval_every: int = 500
    log_every: int = 50
    save_every: int | None = None
    keep_checkpoints: int = 5
    average_last: int = 0
    device: str = "auto"
    dtype: str = "float32"
    threads: int | None = None
    progress: bool = True
    accel: str | None = None  # "none" | "auto"; None: $AIAYN_ACCEL, else "auto" (aiayn.accel.resolve)
    freeze: list[str] | None = None  # fnmatch patterns of parameter names left untrained (aiayn.train.freeze)
    parallel: str | None = None  # "ddp" | "fsdp" when several processes train (None: "ddp"; aiayn.train.parallel)
    fsdp_cpu_offload: bool = False  # FSDP keeps parameter and optimizer shards in CPU memory (CUDA only)
    compile: bool = False  # torch.compile every layer and the loss for training
    activation_checkpointing: bool = False  # recompute each layer's activations in the backward pass

    def __post_init__(self) -> None:
        if isinstance(self.betas, list):
            self.betas = tuple(self.betas)  # type: ignore[assignment]
        problems = self.problems()
        if problems:
            raise AiaynError("invalid [train] settings:\n  - " + "\n  - ".join(problems))

    def problems(self) -> list[str]:
        """Every problem with these settings, each as ``key=value: problem; fix`` (empty when valid)."""
        from aiayn.train.optim import OPTIMIZERS
        from aiayn.train.schedules import SCHEDULES

        p = [x for x in type_problems(self) if not x.startswith("freeze=")]
        if self.freeze is not None and (not isinstance(self.freeze, (list, tuple))
                                        or not all(isinstance(x, str) and x for x in self.freeze)):
            p.append(f"freeze={self.freeze!r}: must be a list of parameter-name patterns, e.g. freeze = "
                     '["encoder.*", "*.embed.*"]')
        typed = {m.split("=", 1)[0] for m in p}  # keys whose value has the wrong type: no further rules

        def rule(name: str, good: Callable[[Any], bool], problem: str) -> None:
            value = getattr(self, name)
            if name not in typed and not good(value):
                p.append(f"{name}={value!r}: {problem}")

        def bad(name: str, problem: str) -> None:
            p.append(f"{name}={getattr(self, name)!r}: {problem}")

        def at_least(name: str, low: int, unset: str | None = None) -> None:
            value = getattr(self, name)
            if name not in typed and value is not None and value < low:
                p.append(f"{name}={value!r}: must be >= {low}" + (f", or none ({unset})" if unset else ""))

        def positive(name: str, unset: str | None = None) -> None:
            value = getattr(self, name)
            if name not in typed and value is not None and not (value > 0 and math.isfinite(value)):
                p.append(f"{name}={value!r}: must be a finite number > 0" + (f", or none ({unset})" if unset else ""))

        rule("out_dir", lambda v: bool(v.strip()), 'must name a directory, e.g. "runs/model"')
        at_least("max_steps", 1)
        positive("max_minutes", "no time limit")
        rule("seed", lambda v: 0 <= v <= MAX_SEED, f"must be a whole number from 0 to {MAX_SEED}")
        rule("optimizer", lambda v: v in OPTIMIZERS, f"unknown; choose one of {', '.join(OPTIMIZERS)}")
        positive("lr")
        rule("betas", lambda v: all(0 <= b < 1 for b in v), "each must be in [0, 1), e.g. [0.9, 0.98]")
        positive("eps")
        rule("weight_decay", lambda v: 0 <= v < math.inf, "must be a finite number >= 0")
        if not typed & {"optimizer", "weight_decay"} and self.optimizer == "adam" and self.weight_decay > 0:
            bad("weight_decay", "optimizer 'adam' would decay norms, biases and embeddings too; set "
                                "optimizer = \"adamw\", or weight_decay = 0")
        rule("schedule", lambda v: v in SCHEDULES, f"unknown; choose one of {', '.join(SCHEDULES)}")
        at_least("warmup", 0)
        if not typed & {"schedule", "warmup", "max_steps"}:
            if self.schedule == "inverse_sqrt_warmup" and self.warmup < 1:
                bad("warmup", "schedule 'inverse_sqrt_warmup' needs warmup >= 1; raise warmup, or use "
                              "schedule = \"constant_warmup\"")
            if self.schedule == "warmup_cosine" and 0 <= self.warmup and self.warmup >= self.max_steps:
                bad("warmup", f"schedule 'warmup_cosine' needs warmup below max_steps={self.max_steps} (the cosine "
                              "ends at max_steps); lower warmup or raise max_steps")
        rule("min_lr_ratio", lambda v: 0 <= v <= 1, "must be in [0, 1]")
        at_least("accum", 1)
        positive("clip_norm", "no clipping")
        rule("label_smoothing", lambda v: 0 <= v < 1, "must be in [0, 1)")
        at_least("max_nonfinite_steps", 1)
        at_least("eval_every", 1)
        at_least("log_every", 1)
        at_least("save_every", 1, "no periodic checkpoints")
        at_least("keep_checkpoints", 0)
        at_least("average_last", 0)
        if not typed & {"average_last", "save_every"} and self.average_last > 0 and self.save_every is None:
            bad("average_last", "averages the periodic checkpoints, but save_every is not set; set save_every, "
                                "or average_last = 0")
        rule("device", lambda v: device_problem(v) is None, "not a device; use auto, cpu, cuda, cuda:N or mps")
        rule("dtype", lambda v: v in DTYPES, f"unknown; choose one of {', '.join(DTYPES)}")
        at_least("threads", 1, "one per free core")
        rule("accel", lambda v: v is None or v in accel.CHOICES,
             f"unknown; choose one of {', '.join(accel.CHOICES)}")
        rule("parallel", lambda v: v is None or v in PARALLELS,
             f"unknown; choose one of {', '.join(PARALLELS)} (used when several processes train)")
        if not typed & {"parallel", "fsdp_cpu_offload"} and self.fsdp_cpu_offload and self.parallel != "fsdp":
            bad("fsdp_cpu_offload", 'offloads the shards of FSDP; set parallel = "fsdp", or fsdp_cpu_offload = false')
        if not typed & {"parallel", "dtype"} and self.parallel == "fsdp" and self.dtype == "float16":
            bad("dtype", 'float16 loss scaling is not sharded with FSDP; use dtype = "bfloat16" (no scaling needed), '
                         'or parallel = "ddp"')
        return p

    @classmethod
    def check(cls, data: dict[str, Any]) -> list[str]:
        """The problems constructing ``TrainConfig(**data)`` would raise (unknown keys first), as a list of
        ``key=value: problem; fix``; nothing is built."""
        known = {f.name for f in fields(cls)}
        p = [unknown_key(k, data[k], known) for k in data if k not in known]
        config = cls.__new__(cls)
        for f in fields(cls):  # settings that skipped __post_init__, so that their problems can be listed
            setattr(config, f.name, data.get(f.name, f.default))
        if isinstance(config.betas, list):
            config.betas = tuple(config.betas)  # type: ignore[assignment]
        return p + config.problems()


def device_problem(name: Any) -> str | None:
    """Why ``name`` is not a device torch understands (or ``auto``), or None when it is."""
    if not isinstance(name, str) or name == "auto":
        return None
    try:
        torch.device(name)
    except (RuntimeError, ValueError):
        return "not a device; use auto, cpu, cuda, cuda:N or mps"
    return None
