"""Lessons 1 and 2: attention as a soft dictionary lookup, then scaled dot-product attention.

References: :func:`aiayn.nn.attention.scaled_dot_product_attention` (the reference backend).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.learn.checking import Case, Exercise, Mistake
from aiayn.learn.exercises.common import generator, plural, randn, shape_label
from aiayn.nn.attention import scaled_dot_product_attention


# ---------------------------------------------------------------------------------------------- soft_lookup
def soft_lookup_reference(query: Tensor, keys: Tensor, values: Tensor) -> Tensor:
    """softmax(keys . query) . values: query (Dk,), keys (S, Dk), values (S, Dv) -> (Dv,), unscaled."""
    out, _ = scaled_dot_product_attention(query[None, None, None], keys[None, None], values[None, None],
                                          backend="reference", scale=1.0)
    return out[0, 0, 0]


def soft_lookup_variant(weights: str = "softmax", read: str = "values") -> Callable[..., Tensor]:
    """A soft lookup, or a wrong one: ``weights`` "hard" (argmax), "exp" (not normalized), "raw" (scores as they
    are), "scaled" (divided by sqrt(Dk)); ``read`` "keys" (reads the keys instead of the values)."""
    def soft_lookup(query: Tensor, keys: Tensor, values: Tensor) -> Tensor:
        scores = keys @ query  # (S,)
        if weights == "hard":
            w = F.one_hot(scores.argmax(), scores.shape[0]).to(scores.dtype)
        elif weights == "exp":
            w = scores.exp()
        elif weights == "raw":
            w = scores
        elif weights == "scaled":
            w = torch.softmax(scores / math.sqrt(query.shape[0]), dim=-1)
        else:
            w = torch.softmax(scores, dim=-1)
        return w @ (keys if read == "keys" else values)

    return soft_lookup


def _soft_lookup_cases(rng: random.Random) -> list[Case]:
    g = generator(rng)
    keys = torch.eye(4)  # four keys, one per direction
    values = torch.tensor([[10.0, 0.0], [0.0, 10.0], [5.0, 5.0], [-10.0, 0.0]])
    cases = [
        Case("a query close to key 2 of four one-hot keys", (torch.tensor([0.0, 0.5, 3.0, 0.0]), keys, values)),
        Case("a zero query: every key scores 0", (torch.zeros(3), randn(g, 5, 3), randn(g, 5, 2))),
        Case("one key", (randn(g, 4), randn(g, 1, 4), randn(g, 1, 3))),
        Case("values wider than keys", (randn(g, 3), randn(g, 6, 3), randn(g, 6, 5))),
    ]
    for _ in range(2):
        d, s, dv = rng.randint(2, 8), rng.randint(2, 8), rng.randint(1, 6)
        cases.append(Case(f"random: {plural(s, 'key')} of width {d}, values of width {dv}",
                          (randn(g, d), randn(g, s, d), randn(g, s, dv))))
    return cases


SOFT_LOOKUP = Exercise(
    name="soft_lookup",
    signature="soft_lookup(query, keys, values): query (Dk,), keys (S, Dk), values (S, Dv) -> (Dv,): "
              "softmax(keys @ query) @ values, no scale",
    reference=soft_lookup_reference,
    variant=soft_lookup_variant,
    mistakes=(
        Mistake("weights", "hard", "hard lookup",
                "you read only the best-matching value (argmax); attention blends every value, weighted by "
                "softmax(scores), so that it can be trained by gradients"),
        Mistake("weights", "exp", "weights not normalized",
                "exp(scores) is not a distribution: divide by its sum (that is the softmax), so the weights add to 1"),
        Mistake("weights", "raw", "no softmax",
                "you weighted the values by the raw scores; turn them into weights that are positive and add to 1 "
                "with torch.softmax(scores, dim=-1)"),
        Mistake("weights", "scaled", "scaled too early",
                "this lookup has no scale: dividing by sqrt(d_k) comes in lesson 2 (scaled dot-product attention)"),
        Mistake("read", "keys", "read the keys",
                "the weights must mix the values (what is stored), not the keys (what is matched)"),
    ),
    cases=_soft_lookup_cases,
    lesson="01",
)


# ---------------------------------------------------------------------------------------------- attention
def attention_reference(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """softmax(q k^T / sqrt(d_k)) v: q (B, H, T, Dk), k (B, H, S, Dk), v (B, H, S, Dv) -> (B, H, T, Dv)."""
    return scaled_dot_product_attention(q, k, v, backend="reference")[0]


def attention_variant(scale: str = "sqrt_dk", axis: int = -1, scores: str = "qk",
                      returns: str = "output") -> Callable[..., Tensor]:
    """Attention, or a wrong one: ``scale`` "none", "dk" (divided by d_k), "times" (multiplied by sqrt(d_k)),
    "sqrt_dv" (by the values' width); ``axis`` -2 (softmax over the queries); ``scores`` "kq" (K Q^T);
    ``returns`` "weights"."""
    def attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        dk, dv = q.shape[-1], v.shape[-1]
        s = q @ k.transpose(-2, -1) if scores == "qk" else k @ q.transpose(-2, -1)  # (B, H, T, S)
        factor = {"sqrt_dk": 1 / math.sqrt(dk), "none": 1.0, "dk": 1 / dk, "times": math.sqrt(dk),
                  "sqrt_dv": 1 / math.sqrt(dv)}[scale]
        w = torch.softmax(s * factor, dim=axis)
        return w if returns == "weights" else w @ v

    return attention


def _attention_cases(rng: random.Random) -> list[Case]:
    g = generator(rng)
    seed_q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])[None, None]  # the seeds' worked example
    seed_k = torch.tensor([[1.0, 0.0], [1.0, 1.0]])[None, None]
    seed_v = torch.tensor([[1.0, 2.0], [3.0, 4.0]])[None, None]
    cases = [Case("the worked example: Q = [[1, 0], [0, 1]], K = [[1, 0], [1, 1]], V = [[1, 2], [3, 4]]",
                  (seed_q, seed_k, seed_v))]
    for b, h, t, s, dk, dv in [(2, 3, 4, 6, 8, 8), (1, 2, 5, 5, 4, 6), (2, 1, 1, 7, 16, 16)]:
        cases.append(Case(shape_label(b, h, t, s, dk, dv),
                          (randn(g, b, h, t, dk, scale=1.5), randn(g, b, h, s, dk, scale=1.5), randn(g, b, h, s, dv))))
    for _ in range(2):
        b, h, t, s, dk = rng.randint(1, 3), rng.randint(1, 4), rng.randint(1, 6), rng.randint(1, 6), rng.randint(2, 16)
        cases.append(Case("random: " + shape_label(b, h, t, s, dk),
                          (randn(g, b, h, t, dk, scale=1.5), randn(g, b, h, s, dk, scale=1.5), randn(g, b, h, s, dk))))
    return cases


ATTENTION = Exercise(
    name="attention",
    signature="attention(q, k, v): q (B, H, T, Dk), k (B, H, S, Dk), v (B, H, S, Dv) -> (B, H, T, Dv): "
              "softmax(q k^T / sqrt(d_k)) v",
    reference=attention_reference,
    variant=attention_variant,
    mistakes=(
        Mistake("scale", "none", "missing scale",
                "the scores are q k^T without the 1/sqrt(d_k): divide them by math.sqrt(q.shape[-1]) before the "
                "softmax (large d_k makes dot products large and the softmax nearly one-hot)"),
        Mistake("scale", "dk", "wrong scale: 1/d_k",
                "you divided by d_k; the paper divides by sqrt(d_k), which keeps the scores' variance near 1"),
        Mistake("scale", "times", "wrong scale: times sqrt(d_k)",
                "you multiplied by sqrt(d_k); divide by it"),
        Mistake("scale", "sqrt_dv", "wrong scale: the values' width",
                "you scaled by the width of v; the scale comes from the width of the queries and keys, d_k = "
                "q.shape[-1]"),
        Mistake("axis", -2, "softmax over the wrong axis",
                "the softmax ran over the queries (dim=-2); each query's weights over the keys must add to 1: "
                "torch.softmax(scores, dim=-1)"),
        Mistake("scores", "kq", "scores transposed",
                "you computed k q^T, whose rows are keys; the scores are q @ k.transpose(-2, -1), shape (..., T, S)"),
        Mistake("returns", "weights", "returned the weights",
                "you returned the attention weights (..., T, S); return the weighted values: weights @ v"),
    ),
    cases=_attention_cases,
    lesson="02",
)
