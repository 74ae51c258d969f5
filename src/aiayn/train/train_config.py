"""The ``[train]`` section of a recipe: optimization and bookkeeping settings, validated at construction."""

from __future__ import annotations

from dataclasses import dataclass

from aiayn import accel
from aiayn.errors import AiaynError


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

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)  # type: ignore[assignment]
        bad = []
        if self.max_steps < 1:
            bad.append(f"max_steps={self.max_steps} must be >= 1")
        if self.accum < 1:
            bad.append(f"accum={self.accum} must be >= 1")
        if not 0 <= self.label_smoothing < 1:
            bad.append(f"label_smoothing={self.label_smoothing} must be in [0, 1)")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            bad.append(f"dtype={self.dtype!r} must be float32, bfloat16 or float16")
        if self.accel is not None and self.accel not in accel.CHOICES:
            bad.append(f"accel={self.accel!r} must be one of {', '.join(accel.CHOICES)}")
        if bad:
            raise AiaynError("invalid [train] settings:\n  - " + "\n  - ".join(bad))
