"""Lesson 5: positions: the paper's sinusoidal table and rotary embeddings (RoPE).

References: :func:`aiayn.nn.positions.sinusoidal_table`, :class:`~aiayn.nn.positions.RotaryEmbedding` with
:func:`~aiayn.nn.positions.apply_rotary` (the rotate-half layout of LLaMA checkpoints).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch
from torch import Tensor

from aiayn.learn.checking import Case, Exercise, Mistake
from aiayn.learn.exercises.common import generator, randn
from aiayn.nn.positions import RotaryEmbedding, apply_rotary, sinusoidal_table


# ---------------------------------------------------------------------------------------------- sinusoidal
def sinusoidal_reference(max_len: int, d_model: int) -> Tensor:
    """(max_len, d_model): PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d))."""
    return sinusoidal_table(max_len, d_model)


def sinusoidal_variant(order: str = "sin_even", layout: str = "interleaved", exponent: str = "pair",
                       start: int = 0) -> Callable[..., Tensor]:
    """The table, or a wrong one: ``order`` "cos_even" (sine and cosine swapped); ``layout`` "halves" (sines in the
    first half of the columns); ``exponent`` "column" (each column's own index j/d) or "index" (i/d with i the pair
    index, not 2i/d); ``start`` 1 (positions from 1)."""
    def sinusoidal(max_len: int, d_model: int) -> Tensor:
        pos = torch.arange(start, start + max_len, dtype=torch.float64)[:, None]  # (L, 1)
        pair = torch.arange(0, d_model, 2, dtype=torch.float64)  # 2i
        power = {"pair": pair, "index": pair / 2}.get(exponent, pair)
        angle = pos / torch.pow(10000.0, power / d_model)  # (L, D/2)
        first, second = (torch.sin(angle), torch.cos(angle)) if order == "sin_even" else (torch.cos(angle),
                                                                                           torch.sin(angle))
        if exponent == "column":  # the odd columns with their own exponent (2i + 1) / d
            odd = pos / torch.pow(10000.0, (pair + 1) / d_model)
            second = torch.cos(odd) if order == "sin_even" else torch.sin(odd)
        pe = torch.zeros(max_len, d_model, dtype=torch.float64)
        if layout == "halves":
            pe[:, : d_model // 2], pe[:, d_model // 2:] = first, second
        else:
            pe[:, 0::2], pe[:, 1::2] = first, second
        return pe.float()

    return sinusoidal


def _sinusoidal_cases(rng: random.Random) -> list[Case]:
    d = 2 * rng.randint(1, 16)
    return [Case("50 positions, width 16", (50, 16)), Case("10 positions, width 6", (10, 6)),
            Case("3 positions, width 2", (3, 2)), Case("100 positions, width 64", (100, 64)),
            Case(f"random: 20 positions, width {d}", (20, d))]


SINUSOIDAL = Exercise(
    name="sinusoidal",
    signature="sinusoidal(max_len, d_model): -> (max_len, d_model) float: PE[pos, 2i] = sin(pos / 10000^(2i/d)), "
              "PE[pos, 2i+1] = cos(pos / 10000^(2i/d)); d_model even",
    reference=sinusoidal_reference,
    variant=sinusoidal_variant,
    mistakes=(
        Mistake("order", "cos_even", "sine and cosine swapped",
                "the even columns (0, 2, 4, ...) hold the sines and the odd ones the cosines"),
        Mistake("layout", "halves", "sines and cosines in halves",
                "you put the sines in the first half of the columns and the cosines in the second (Marian's and "
                "fairseq's layout); the paper interleaves them: pe[:, 0::2] = sin, pe[:, 1::2] = cos"),
        Mistake("exponent", "column", "each column with its own exponent",
                "columns 2i and 2i+1 share ONE frequency 1 / 10000^(2i/d), so that every pair is a sine and "
                "a cosine of the same angle (a rotation); you gave column 2i+1 the exponent (2i+1)/d"),
        Mistake("exponent", "index", "exponent i/d instead of 2i/d",
                "the exponent is 2i/d where 2i is the even column's index (i the pair's): torch.arange(0, d, 2) / d"),
        Mistake("start", 1, "positions counted from 1", "the first position is 0: torch.arange(max_len)"),
    ),
    cases=_sinusoidal_cases,
    lesson="05",
)


# ---------------------------------------------------------------------------------------------- rope
def rope_reference(x: Tensor, positions: Tensor) -> Tensor:
    """Rotate x (B, H, T, Dh) by its positions (T,): the pairs (x[i], x[i + Dh/2]) turn by position * theta_i,
    theta_i = 10000^(-2i/Dh)."""
    cos, sin = RotaryEmbedding(x.shape[-1])(positions[None])  # (1, T, Dh) each
    return apply_rotary(x, cos, sin)


def rope_variant(pairs: str = "halves", direction: str = "forward", freq: str = "2i", positions_used: str = "given"
                 ) -> Callable[..., Tensor]:
    """RoPE, or a wrong one: ``pairs`` "adjacent" (x[2i], x[2i+1], GPT-J's layout); ``direction`` "backward" (the
    sine's sign flipped); ``freq`` "i" (10000^(-i/Dh)); ``positions_used`` "arange" (0 .. T-1, ignoring the given
    positions)."""
    def rope(x: Tensor, positions: Tensor) -> Tensor:
        dh = x.shape[-1]
        i = torch.arange(0, dh, 2, dtype=torch.float32) if freq == "2i" else torch.arange(dh // 2,
                                                                                             dtype=torch.float32)
        inv_freq = 1.0 / 10000.0 ** (i / dh)  # (Dh/2,)
        pos = positions if positions_used == "given" else torch.arange(x.shape[-2])
        angle = pos[:, None].float() * inv_freq  # (T, Dh/2)
        cos, sin = angle.cos(), angle.sin() * (1 if direction == "forward" else -1)
        if pairs == "adjacent":
            a, b = x[..., 0::2], x[..., 1::2]
            out = torch.empty_like(x)
            out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
            return out
        a, b = x[..., : dh // 2], x[..., dh // 2:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)

    return rope


def _rope_cases(rng: random.Random) -> list[Case]:
    g = generator(rng)
    start = rng.randint(1, 30)
    return [Case("batch 2, 2 heads, 4 tokens at positions 0..3, head width 8", (randn(g, 2, 2, 4, 8), torch.arange(4))),
            Case("1 head, 3 tokens at positions 5, 6, 7 (after a cache of 5), head width 4",
                 (randn(g, 1, 1, 3, 4), torch.arange(5, 8))),
            Case("one decoding step at position 9, head width 16", (randn(g, 1, 2, 1, 16), torch.tensor([9]))),
            Case("head width 2: one pair", (randn(g, 1, 1, 5, 2), torch.arange(5))),
            Case(f"random: 6 tokens at positions {start}..{start + 5}, head width 32",
                 (randn(g, 2, 3, 6, 32), torch.arange(start, start + 6)))]


ROPE = Exercise(
    name="rope",
    signature="rope(x, positions): x (B, H, T, Dh), positions (T,) long -> (B, H, T, Dh): the pair (x[..., i], "
              "x[..., i + Dh/2]) rotated by the angle position * 10000^(-2i/Dh)",
    reference=rope_reference,
    variant=rope_variant,
    mistakes=(
        Mistake("pairs", "adjacent", "adjacent pairs rotated",
                "you rotated (x[2i], x[2i+1]) (GPT-J's layout); aiayn and LLaMA checkpoints pair x[i] with "
                "x[i + Dh/2]: split the last axis into halves a, b and return cat([a cos - b sin, a sin + b cos])"),
        Mistake("direction", "backward", "rotation in the wrong direction",
                "the sine's sign is flipped: the rotation is (a cos - b sin, a sin + b cos)"),
        Mistake("freq", "i", "frequencies 10000^(-i/Dh)",
                "pair i turns at 10000^(-2i/Dh): the exponents are torch.arange(0, Dh, 2) / Dh"),
        Mistake("positions_used", "arange", "positions ignored",
                "you rotated by 0 .. T-1; use the positions given (after a KV cache of n tokens the new ones are at "
                "n, n + 1, ...)"),
    ),
    cases=_rope_cases,
    lesson="05",
)
