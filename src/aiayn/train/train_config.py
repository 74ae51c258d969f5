"""The ``[train]`` section of a recipe: optimization and bookkeeping settings, validated at construction."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

import torch

from aiayn import accel
from aiayn.errors import AiaynError
from aiayn.train.optim import OPTIMIZERS
from aiayn.train.schedules import SCHEDULES
from aiayn.validation import Problems, Rule, above, at_least, choice, dataclass_types, rule, within

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
    save_every_minutes: float | None = None  # also write step-N/ once this many minutes passed since the last one
    keep_checkpoints: int = 5
    average_last: int = 0
    device: str = "auto"
    dtype: str = "float32"
    threads: int | None = None
    progress: bool = True
    accel: str | None = None  # "none" | "auto"; None: $AIAYN_ACCEL, else "auto" (aiayn.accel.resolve)
    freeze: list[str] | None = None  # fnmatch patterns of parameter names left untrained (aiayn.train.freeze)
    adapter: str | None = None  # "lora": train low-rank adapters on a frozen model (aiayn.nn.lora)
    lora_rank: int = 8
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    lora_targets: list[str] | None = None  # layer groups, name endings or patterns (default: ["attention"])
    lora_trainable: list[str] | None = None  # name prefixes of parameters that train too (e.g. ["cls_head"])
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

    def to_dict(self) -> dict[str, Any]:
        """The settings as plain data (tuples as lists), as a training state saves them."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}

    def problems(self) -> list[str]:
        """Every problem with these settings, each as ``key=value: problem; fix`` (empty when valid): types from
        the annotations, each setting's own rule (:data:`_RULES`), then the checks across settings."""
        p = Problems(vars(self))
        annotations, defaults = dataclass_types(self)
        for name in ("freeze", "lora_targets", "lora_trainable"):  # lists of patterns: their rules check them
            annotations.pop(name)
        p.check_types(annotations, defaults)
        p.check_all(_RULES)
        if p.ok("optimizer", "weight_decay") and self.optimizer == "adam" and self.weight_decay > 0:
            p.add("weight_decay", "optimizer 'adam' would decay norms, biases and embeddings too; set "
                                  "optimizer = \"adamw\", or weight_decay = 0")
        if p.ok("schedule", "warmup", "max_steps"):
            if self.schedule == "inverse_sqrt_warmup" and self.warmup < 1:
                p.add("warmup", "schedule 'inverse_sqrt_warmup' needs warmup >= 1; raise warmup, or use "
                                "schedule = \"constant_warmup\"")
            if self.schedule == "warmup_cosine" and 0 <= self.warmup and self.warmup >= self.max_steps:
                p.add("warmup", f"schedule 'warmup_cosine' needs warmup below max_steps={self.max_steps} (the cosine "
                                "ends at max_steps); lower warmup or raise max_steps")
        if (p.ok("average_last", "save_every", "save_every_minutes") and self.average_last > 0
                and self.save_every is None and self.save_every_minutes is None):
            p.add("average_last", "averages the periodic checkpoints, but neither save_every nor save_every_minutes "
                                  "is set; set one of them, or average_last = 0")
        if p.ok("average_last", "adapter") and self.average_last > 0 and self.adapter is not None:
            p.add("average_last", "averaging LoRA factors is not averaging the updates they make (B A); set "
                                  "average_last = 0, and average merged checkpoints (aiayn merge-adapter, then "
                                  "aiayn average)")
        if p.ok("parallel", "fsdp_cpu_offload") and self.fsdp_cpu_offload and self.parallel != "fsdp":
            p.add("fsdp_cpu_offload", 'offloads the shards of FSDP; set parallel = "fsdp", or fsdp_cpu_offload = false')
        if p.ok("parallel", "dtype") and self.parallel == "fsdp" and self.dtype == "float16":
            p.add("dtype", 'float16 loss scaling is not sharded with FSDP; use dtype = "bfloat16" (no scaling needed), '
                           'or parallel = "ddp"')
        return p.lines

    @classmethod
    def check(cls, data: dict[str, Any]) -> list[str]:
        """The problems constructing ``TrainConfig(**data)`` would raise (unknown keys first), as a list of
        ``key=value: problem; fix``; nothing is built."""
        known = {f.name for f in fields(cls)}
        unknown = Problems(data)
        unknown.unknown(known)
        config = cls.__new__(cls)
        for f in fields(cls):  # settings that skipped __post_init__, so that their problems can be listed
            setattr(config, f.name, data.get(f.name, f.default))
        if isinstance(config.betas, list):
            config.betas = tuple(config.betas)  # type: ignore[assignment]
        return unknown.lines + config.problems()


def device_problem(name: Any) -> str | None:
    """Why ``name`` is not a device torch understands (or ``auto``), or None when it is."""
    if not isinstance(name, str) or name == "auto":
        return None
    try:
        torch.device(name)
    except (RuntimeError, ValueError):
        return "not a device; use auto, cpu, cuda, cuda:N or mps"
    return None


#: each setting's own rule (its type comes from its annotation); TrainConfig.problems adds the checks across settings
_RULES: dict[str, Rule] = {
    "out_dir": rule(lambda v: bool(v.strip()), 'must name a directory, e.g. "runs/model"'),
    "max_steps": at_least(1),
    "max_minutes": above(0, finite=True, unset="none (no time limit)"),
    "seed": rule(lambda v: 0 <= v <= MAX_SEED, f"must be a whole number from 0 to {MAX_SEED}"),
    "optimizer": choice(OPTIMIZERS),
    "lr": above(0, finite=True),
    "betas": rule(lambda v: all(0 <= b < 1 for b in v), "each must be in [0, 1), e.g. [0.9, 0.98]"),
    "eps": above(0, finite=True),
    "weight_decay": at_least(0, finite=True),
    "schedule": choice(SCHEDULES),
    "warmup": at_least(0),
    "min_lr_ratio": within(0, 1, closed_high=True),
    "accum": at_least(1),
    "clip_norm": above(0, finite=True, unset="none (no clipping)"),
    "label_smoothing": within(0, 1),
    "max_nonfinite_steps": at_least(1),
    "eval_every": at_least(1),
    "log_every": at_least(1),
    "save_every": at_least(1, unset="none (no periodic checkpoints)"),
    "save_every_minutes": above(0, finite=True, unset="none (no timed checkpoints)"),
    "keep_checkpoints": at_least(0),
    "average_last": at_least(0),
    "device": rule(lambda v: device_problem(v) is None, "not a device; use auto, cpu, cuda, cuda:N or mps"),
    "dtype": choice(DTYPES),
    "threads": at_least(1, unset="none (one per free core)"),
    "accel": choice(accel.CHOICES, optional=True),
    "parallel": choice(PARALLELS, optional=True, note=" (used when several processes train)"),
    "freeze": rule(lambda v: v is None or (isinstance(v, (list, tuple)) and all(isinstance(x, str) and x for x in v)),
                   'must be a list of parameter-name patterns, e.g. freeze = ["encoder.*", "*.embed.*"]'),
    "adapter": choice(("lora",), optional=True, note=" (or leave it out to train every weight)"),
    "lora_rank": at_least(1, whole=True),
    "lora_alpha": above(0, finite=True),
    "lora_dropout": within(0, 1),
    "lora_targets": rule(lambda v: v is None or (isinstance(v, (list, tuple)) and v
                                                 and all(isinstance(x, str) and x for x in v)),
                         'must be a list of layer groups, name endings or patterns, e.g. lora_targets = '
                         '["attention", "ffn"]'),
    "lora_trainable": rule(lambda v: v is None or (isinstance(v, (list, tuple))
                                                   and all(isinstance(x, str) and x for x in v)),
                           'must be a list of parameter-name prefixes, e.g. lora_trainable = ["cls_head"]'),
}
