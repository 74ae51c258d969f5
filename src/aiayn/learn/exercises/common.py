"""Helpers the exercises share: seeded random tensors and the cases' wording."""

from __future__ import annotations

import random

import torch
from torch import Tensor


def generator(rng: random.Random) -> torch.Generator:
    """A torch generator seeded from ``rng`` (so a check's seed fixes every random tensor)."""
    return torch.Generator().manual_seed(rng.randrange(2**31))


def randn(g: torch.Generator, *shape: int, scale: float = 1.0) -> Tensor:
    """Standard normal float32 values of ``shape``, times ``scale``."""
    return torch.randn(*shape, generator=g) * scale


def plural(n: int, word: str) -> str:
    """``"1 query"``, ``"3 queries"``, ``"2 keys"``."""
    if n == 1:
        return f"1 {word}"
    return f"{n} {word[:-1]}ies" if word.endswith("y") and word[-2] not in "aeiou" else f"{n} {word}s"


def shape_label(b: int, h: int, t: int, s: int, dh: int, dv: int | None = None) -> str:
    """``"batch 2, 3 heads, 4 queries over 6 keys, d_k 8"`` (and ``d_v`` when it differs)."""
    text = f"batch {b}, {plural(h, 'head')}, {plural(t, 'query')} over {plural(s, 'key')}, d_k {dh}"
    return text if dv is None or dv == dh else f"{text}, d_v {dv}"
