"""Lesson 4: multi-head attention: splitting the width into heads, merging them back, and the whole module.

References: :class:`aiayn.nn.attention.MultiHeadAttention` (its ``_heads`` split, the merge in its forward, and the
module itself).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import torch
from torch import Tensor

from aiayn.learn.checking import Case, Exercise, Mistake
from aiayn.learn.exercises.common import generator, plural, randn
from aiayn.nn.attention import MultiHeadAttention


# ---------------------------------------------------------------------------------------------- split / merge
def split_heads_reference(x: Tensor, n_heads: int) -> Tensor:
    """(B, T, D) -> (B, H, T, D / H), as :class:`MultiHeadAttention` splits its projections."""
    mha = MultiHeadAttention(x.shape[-1], n_heads)
    return mha._heads(x, n_heads)


def merge_heads_reference(x: Tensor) -> Tensor:
    """(B, H, T, Dh) -> (B, T, H * Dh), as :class:`MultiHeadAttention`'s forward joins its heads."""
    b, h, t, dh = x.shape
    return x.transpose(1, 2).reshape(b, t, h * dh)


def split_heads_variant(order: str = "tokens_heads") -> Callable[..., Tensor]:
    """Splitting, or a wrong one: ``order`` "no_transpose" (viewed as (B, H, T, Dh) directly), "interleaved" (head h
    gets columns h, h + H, ...) or "not_moved" (left as (B, T, H, Dh))."""
    def split_heads(x: Tensor, n_heads: int) -> Tensor:
        b, t, d = x.shape
        dh = d // n_heads
        if order == "no_transpose":
            return x.reshape(b, n_heads, t, dh)
        if order == "interleaved":
            return x.reshape(b, t, dh, n_heads).permute(0, 3, 1, 2)
        if order == "not_moved":
            return x.reshape(b, t, n_heads, dh)
        return x.reshape(b, t, n_heads, dh).transpose(1, 2)

    return split_heads


def merge_heads_variant(order: str = "tokens_heads") -> Callable[..., Tensor]:
    """Merging, or a wrong one: ``order`` "no_transpose" (reshaped without moving the heads back) or "interleaved"
    (the heads' columns interleaved)."""
    def merge_heads(x: Tensor) -> Tensor:
        b, h, t, dh = x.shape
        if order == "no_transpose":
            return x.reshape(b, t, h * dh)
        if order == "interleaved":
            return x.permute(0, 2, 3, 1).reshape(b, t, h * dh)
        return x.transpose(1, 2).reshape(b, t, h * dh)

    return merge_heads


def _split_cases(rng: random.Random) -> list[Case]:
    g = generator(rng)
    cases = [Case("batch 2, 3 tokens, width 8, 2 heads", (randn(g, 2, 3, 8), 2)),
             Case("batch 1, 5 tokens, width 12, 3 heads", (randn(g, 1, 5, 12), 3)),
             Case("batch 2, 4 tokens, width 8, 4 heads (as many heads as tokens)", (randn(g, 2, 4, 8), 4)),
             Case("one head", (randn(g, 2, 3, 6), 1))]
    h, dh, t = rng.randint(2, 4), rng.randint(2, 5), rng.randint(1, 6)
    cases.append(Case(f"random: {plural(t, 'token')}, {plural(h, 'head')} of width {dh}", (randn(g, 2, t, h * dh), h)))
    return cases


def _merge_cases(rng: random.Random) -> list[Case]:
    g = generator(rng)
    cases = [Case("batch 2, 2 heads, 3 tokens, head width 4", (randn(g, 2, 2, 3, 4),)),
             Case("batch 1, 3 heads, 5 tokens, head width 2", (randn(g, 1, 3, 5, 2),)),
             Case("4 heads over 4 tokens of width 4", (randn(g, 2, 4, 4, 4),))]
    h, dh, t = rng.randint(2, 4), rng.randint(2, 5), rng.randint(1, 6)
    cases.append(Case(f"random: {plural(h, 'head')}, {plural(t, 'token')}, head width {dh}", (randn(g, 2, h, t, dh),)))
    return cases


_SPLIT_ORDER = ("the width D is H heads of Dh columns each, per token: x.view(B, T, H, Dh).transpose(1, 2), so that "
                "head h gets columns h*Dh .. (h+1)*Dh - 1 of every token")

SPLIT_HEADS = Exercise(
    name="split_heads",
    signature="split_heads(x, n_heads): x (B, T, D) -> (B, H, T, D / H), head h holding columns h*Dh .. (h+1)*Dh - 1",
    reference=split_heads_reference,
    variant=split_heads_variant,
    mistakes=(
        Mistake("order", "no_transpose", "heads split in the wrong order",
                "x.view(B, H, T, Dh) reads the memory as if heads came first, so a 'head' gets whole tokens "
                f"and rows mix tokens; {_SPLIT_ORDER}"),
        Mistake("order", "interleaved", "heads interleaved",
                f"head h got columns h, h + H, h + 2H, ...; {_SPLIT_ORDER}"),
        Mistake("order", "not_moved", "heads axis not moved forward",
                "you returned (B, T, H, Dh); attention works on (B, H, T, Dh): transpose(1, 2) after the view"),
    ),
    cases=_split_cases,
    lesson="04",
)

MERGE_HEADS = Exercise(
    name="merge_heads",
    signature="merge_heads(x): x (B, H, T, Dh) -> (B, T, H * Dh), the inverse of split_heads",
    reference=merge_heads_reference,
    variant=merge_heads_variant,
    mistakes=(
        Mistake("order", "no_transpose", "heads merged in the wrong order",
                "x.reshape(B, T, H*Dh) straight from (B, H, T, Dh) mixes tokens across heads; move the heads back "
                "next to the width first: x.transpose(1, 2).reshape(B, T, H * Dh)"),
        Mistake("order", "interleaved", "heads interleaved",
                "the heads' columns came out interleaved; concatenate whole heads: "
                "x.transpose(1, 2).reshape(B, T, -1)"),
    ),
    cases=_merge_cases,
    lesson="04",
)


# ---------------------------------------------------------------------------------------------- multi_head_attention
def multi_head_attention_reference(x: Tensor, mha: MultiHeadAttention) -> Tensor:
    """Self-attention of x (B, T, D) through ``mha`` (H heads, fused ``qkv_proj``, ``out_proj``) -> (B, T, D)."""
    return mha(x)[0]


def multi_head_attention_variant(split: str = "tokens_heads", merge: str = "tokens_heads", scale: str = "head",
                                 heads: str = "many", out_proj: bool = True) -> Callable[..., Tensor]:
    """Multi-head self-attention, or a wrong one: ``split``/``merge`` as :func:`split_heads_variant`; ``scale``
    "model" (sqrt(D) instead of sqrt(Dh)); ``heads`` "one" (one head over the whole width); ``out_proj`` False."""
    split_fn, merge_fn = split_heads_variant(split), merge_heads_variant(merge)

    def multi_head_attention(x: Tensor, mha: MultiHeadAttention) -> Tensor:
        b, t, d = x.shape
        h = mha.n_heads if heads == "many" else 1
        q, k, v = mha.qkv_proj(x).split(d, dim=-1)  # (B, T, D) each
        q, k, v = split_fn(q, h), split_fn(k, h), split_fn(v, h)  # (B, H, T, Dh)
        dk = q.shape[-1] if scale == "head" else d
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(dk), dim=-1)
        out = merge_fn(w @ v)  # (B, T, D)
        return mha.out_proj(out) if out_proj else out

    return multi_head_attention


def _mha_cases(rng: random.Random) -> list[Case]:
    g = generator(rng)

    def module(d: int, h: int) -> MultiHeadAttention:
        mha = MultiHeadAttention(d, h).eval()
        with torch.no_grad():
            for p in mha.parameters():
                p.copy_(randn(g, *p.shape, scale=0.6))
        return mha

    h, t = rng.randint(2, 4), rng.randint(2, 6)
    return [Case("width 8, 2 heads, 3 tokens", (randn(g, 2, 3, 8), module(8, 2))),
            Case("width 12, 3 heads, 5 tokens", (randn(g, 1, 5, 12), module(12, 3))),
            Case("width 16, 4 heads, 4 tokens", (randn(g, 2, 4, 16), module(16, 4))),
            Case(f"random: width {4 * h}, {plural(h, 'head')}, {plural(t, 'token')}", (randn(g, 2, t, 4 * h),
                                                                                        module(4 * h, h)))]


MULTI_HEAD_ATTENTION = Exercise(
    name="multi_head_attention",
    signature="multi_head_attention(x, mha): x (B, T, D), mha an aiayn MultiHeadAttention (mha.n_heads, "
              "mha.qkv_proj: D -> 3D as [q | k | v], mha.out_proj: D -> D) -> (B, T, D), self-attention, no mask",
    reference=multi_head_attention_reference,
    variant=multi_head_attention_variant,
    mistakes=(
        Mistake("split", "no_transpose", "heads split in the wrong order",
                f"x.view(B, H, T, Dh) gives a head whole tokens; {_SPLIT_ORDER}"),
        Mistake("split", "interleaved", "heads interleaved", f"head h got columns h, h + H, ...; {_SPLIT_ORDER}"),
        Mistake("merge", "no_transpose", "heads merged in the wrong order",
                "move the heads back next to the width before the reshape: out.transpose(1, 2).reshape(B, T, D)"),
        Mistake("scale", "model", "scaled by the model width",
                "each head's scores are scaled by sqrt(Dh), its own width (D / H), not sqrt(D)"),
        Mistake("heads", "one", "one head",
                "you attended over the whole width at once; split q, k and v into mha.n_heads heads of width D / H"),
        Mistake("out_proj", False, "no output projection",
                "after merging the heads, mix them with W^O: return mha.out_proj(merged)"),
    ),
    cases=_mha_cases,
    lesson="04",
)
