"""Lesson 3: masks (causal, padding and causal together) and attention under a mask, an empty row included.

References: :func:`aiayn.nn.masks.causal_mask`, :func:`~aiayn.nn.masks.padding_mask`, :func:`~aiayn.nn.masks.combine`
and :func:`aiayn.nn.attention.scaled_dot_product_attention` with a mask (True = may attend; a query row with no
allowed key gives zeros).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import torch
from torch import Tensor

from aiayn.learn.checking import Case, Exercise, Mistake
from aiayn.learn.exercises.common import generator, randn, shape_label
from aiayn.nn import masks as M
from aiayn.nn.attention import scaled_dot_product_attention


# ---------------------------------------------------------------------------------------------- causal_mask
def causal_mask_reference(t: int, s: int | None = None) -> Tensor:
    """(T, S) bool: query i (at position S - T + i) may attend key j when j <= S - T + i."""
    return M.causal_mask(t, s)


def causal_mask_variant(diagonal: int = 0, direction: str = "past", align: str = "end", polarity: str = "allow",
                        dtype: str = "bool") -> Callable[..., Tensor]:
    """A causal mask, or a wrong one: ``diagonal`` -1 (a query cannot see itself) or 1 (sees the next key);
    ``direction`` "future"; ``align`` "start" (queries at the first positions, not the last); ``polarity`` "block"
    (True = masked); ``dtype`` "float" (0/1) or "additive" (0/-inf)."""
    def causal_mask(t: int, s: int | None = None) -> Tensor:
        s = t if s is None else s
        q = torch.arange(s - t, s) if align == "end" else torch.arange(t)  # (T,) query positions
        k = torch.arange(s)  # (S,)
        ahead = k[None, :] - q[:, None]  # (T, S): how far key j is after query i
        allowed = ahead <= diagonal if direction == "past" else -ahead <= diagonal
        if polarity == "block":
            allowed = ~allowed
        if dtype == "float":
            return allowed.float()
        if dtype == "additive":
            return torch.zeros(t, s).masked_fill(~allowed, float("-inf"))
        return allowed

    return causal_mask


def _causal_cases(rng: random.Random) -> list[Case]:
    cases = [Case("causal_mask(4): four tokens", (4,)), Case("causal_mask(1): one token", (1,)),
             Case("causal_mask(3, 7): 3 new queries after 4 cached keys", (3, 7)),
             Case("causal_mask(1, 5): one decoding step over 5 keys", (1, 5))]
    t = rng.randint(2, 9)
    s = t + rng.randint(1, 5)
    cases += [Case(f"causal_mask({t})", (t,)), Case(f"causal_mask({t}, {s})", (t, s))]
    return cases


CAUSAL_MASK = Exercise(
    name="causal_mask",
    signature="causal_mask(t, s=None): -> (T, S) bool, True = may attend; the T queries are the LAST T of the S "
              "positions (s defaults to t)",
    reference=causal_mask_reference,
    variant=causal_mask_variant,
    mistakes=(
        Mistake("diagonal", 1, "causal mask off by one: sees the next token",
                "query i may also attend key i + 1, the token it has to predict: training looks perfect and "
                "generation fails. Allow keys j <= i (torch.tril, or k <= q), not j <= i + 1"),
        Mistake("diagonal", -1, "causal mask off by one: cannot see itself",
                "query i may attend keys j < i only, so the first query has no key at all; allow j <= i (keep the "
                "diagonal: torch.tril(..., diagonal=0))"),
        Mistake("direction", "future", "causal mask transposed",
                "your mask lets each query see the keys AFTER it (upper triangle); a causal mask lets it see the keys "
                "before it and itself (lower triangle, torch.tril)"),
        Mistake("align", "start", "queries not aligned to the end of the keys",
                "with S > T (a KV cache) the T queries are the last T positions: query i sits at S - T + i. "
                "Compare key positions arange(S) with query positions arange(S - T, S)"),
        Mistake("polarity", "block", "mask inverted",
                "True must mean 'may attend' (the SDPA convention aiayn uses); yours is True where attention is "
                "blocked: negate it"),
        Mistake("dtype", "float", "mask as numbers",
                "return a bool tensor (True = may attend), not 0/1 numbers: compare positions (k <= q) and keep the "
                "bool"),
        Mistake("dtype", "additive", "additive mask",
                "you returned 0/-inf scores to add; aiayn's masks are bool (True = may attend), and attention fills "
                "the blocked scores itself"),
    ),
    cases=_causal_cases,
    lesson="03",
)


# ---------------------------------------------------------------------------------------------- decoder_mask
def decoder_mask_reference(is_token: Tensor) -> Tensor:
    """is_token (B, T) bool -> (B, 1, T, T): causal AND the key is a real token."""
    return M.combine(M.padding_mask(is_token), M.causal_mask(is_token.shape[1]))


def decoder_mask_variant(combine: str = "and", padding: str = "keys", causal: bool = True,
                         polarity: str = "allow") -> Callable[..., Tensor]:
    """A decoder's self-attention mask, or a wrong one: ``combine`` "or"; ``padding`` "none" (padding ignored, or
    applied to the query rows only); ``causal`` False; ``polarity`` "block"."""
    def decoder_mask(is_token: Tensor) -> Tensor:
        b, t = is_token.shape
        future = torch.ones(t, t, dtype=torch.bool).tril() if causal else torch.ones(t, t, dtype=torch.bool)
        keys = is_token[:, None, None, :] if padding == "keys" else torch.ones(b, 1, 1, t, dtype=torch.bool)
        mask = (future | keys) if combine == "or" else (future & keys)  # (B, 1, T, T)
        return ~mask if polarity == "block" else mask

    return decoder_mask


def _ignore_padded_queries(mask: object, case: Case) -> object:
    """The rows of padded queries are not compared (their outputs are never used): set to False."""
    is_token = case.info["is_token"]
    b, t = is_token.shape
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.dim() > 4:
        return mask
    try:
        full = mask.expand(b, 1, t, t)
    except RuntimeError:
        return mask
    return full & is_token[:, None, :, None]


def _decoder_mask_cases(rng: random.Random) -> list[Case]:
    def case(label: str, rows: list[list[int]]) -> Case:
        is_token = torch.tensor(rows, dtype=torch.bool)
        return Case(label, (is_token,), info={"is_token": is_token})

    t = rng.randint(3, 8)
    lengths = [rng.randint(1, t) for _ in range(3)]
    return [
        case("no padding: 2 sentences of 4 tokens", [[1, 1, 1, 1], [1, 1, 1, 1]]),
        case("right padding: lengths 5 and 3", [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]),
        case("left padding (batched generation): lengths 5, 3 and 2", [[1, 1, 1, 1, 1], [0, 0, 1, 1, 1],
                                                                       [0, 0, 0, 1, 1]]),
        case(f"random left padding, lengths {lengths} of {t}", [[0] * (t - n) + [1] * n for n in lengths]),
    ]


DECODER_MASK = Exercise(
    name="decoder_mask",
    signature="decoder_mask(is_token): is_token (B, T) bool, False at padding -> (B, 1, T, T) bool: query i may "
              "attend key j when j <= i AND key j is a real token",
    reference=decoder_mask_reference,
    variant=decoder_mask_variant,
    mistakes=(
        Mistake("combine", "or", "masks combined with OR",
                "a key must pass BOTH masks: combine them with & (logical AND); with | a query sees every real "
                "token, the future included"),
        Mistake("padding", "none", "padding not masked on the keys",
                "with left padding, real queries still see the padding before them: mask the KEYS that are "
                "padding, is_token[:, None, None, :] of shape (B, 1, 1, T), not the query rows"),
        Mistake("causal", False, "not causal",
                "the decoder's self-attention must not see later tokens: AND the padding mask with a causal mask"),
        Mistake("polarity", "block", "mask inverted",
                "True must mean 'may attend'; yours is True where attention is blocked: negate it"),
    ),
    cases=_decoder_mask_cases,
    prepare=_ignore_padded_queries,
    broadcast=True,
    lesson="03",
)


# ---------------------------------------------------------------------------------------------- masked_attention
def masked_attention_reference(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """softmax(q k^T / sqrt(d_k), masked) v; a row with no allowed key gives zeros."""
    return scaled_dot_product_attention(q, k, v, mask=mask, backend="reference")[0]


def masked_attention_variant(mask_use: str = "fill", empty: str = "zeros", scale: bool = True,
                             axis: int = -1) -> Callable[..., Tensor]:
    """Masked attention, or a wrong one: ``mask_use`` "inverted", "transposed", "after_softmax" (weights times the
    mask), "added" (the mask added to the scores), "zero_fill" (blocked scores set to 0) or "ignored"; ``empty``
    "uniform" (a fully masked row keeps a uniform softmax: the mean of the values) or "nan" (-inf everywhere:
    0/0); ``scale`` False; ``axis`` -2."""
    def masked_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        scores = q @ k.transpose(-2, -1)  # (B, H, T, S)
        if scale:
            scores = scores / math.sqrt(q.shape[-1])
        m = mask
        if m is not None and mask_use == "inverted":
            m = ~m
        elif m is not None and mask_use == "transposed":
            m = m.transpose(-2, -1)
        fills = m is not None and mask_use in ("fill", "inverted", "transposed")
        if fills:
            scores = scores.masked_fill(~m, float("-inf") if empty == "nan" else torch.finfo(scores.dtype).min)
        elif m is not None and mask_use == "added":
            scores = scores + m.to(scores.dtype)
        elif m is not None and mask_use == "zero_fill":
            scores = scores.masked_fill(~m, 0.0)
        w = torch.softmax(scores, dim=axis)
        if m is not None and mask_use == "after_softmax":
            w = w * m
        if fills and empty == "zeros":
            w = w.masked_fill(~m.any(dim=-1, keepdim=True), 0.0)
        return w @ v

    return masked_attention


def _masked_cases(rng: random.Random) -> list[Case]:
    g = generator(rng)

    def qkv(b: int, h: int, t: int, s: int, d: int) -> tuple[Tensor, Tensor, Tensor]:
        return randn(g, b, h, t, d, scale=1.5), randn(g, b, h, s, d, scale=1.5), randn(g, b, h, s, d)

    square = torch.tensor([[1, 0, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0], [0, 1, 1, 1]], dtype=torch.bool)  # row 2 empty
    padding = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]], dtype=torch.bool)[:, None, None, :]
    left = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)
    decoder = left[:, None, None, :] & M.causal_mask(5)  # (2, 1, 5, 5): the padded queries' rows are empty
    t, s = rng.randint(1, 5), rng.randint(2, 7)
    random_mask = torch.rand(t, s, generator=g) < 0.6
    return [
        Case("a 4 x 4 mask that is not symmetric, row 2 with no allowed key", (*qkv(1, 2, 4, 4, 8), square)),
        Case("padding (B, 1, 1, S): " + shape_label(2, 2, 3, 6, 4), (*qkv(2, 2, 3, 6, 4), padding)),
        Case("causal (T, S), 3 queries after 4 cached keys: " + shape_label(1, 2, 3, 7, 8),
             (*qkv(1, 2, 3, 7, 8), M.causal_mask(3, 7))),
        Case("left padding AND causal (B, 1, T, T): the padded queries have no allowed key",
             (*qkv(2, 1, 5, 5, 4), decoder)),
        Case("no mask (None)", (*qkv(1, 1, 3, 3, 4), None)),
        Case(f"random (T, S) mask: {t} queries over {s} keys", (*qkv(2, 2, t, s, 6), random_mask)),
    ]


MASKED_ATTENTION = Exercise(
    name="masked_attention",
    signature="masked_attention(q, k, v, mask=None): q (B, H, T, Dk), k and v (B, H, S, D), mask bool broadcastable "
              "to (B, H, T, S), True = may attend -> (B, H, T, Dv); a query row with no allowed key gives zeros",
    reference=masked_attention_reference,
    variant=masked_attention_variant,
    mistakes=(
        Mistake("mask_use", "inverted", "mask inverted",
                "True means 'may attend': block the scores where the mask is False, scores.masked_fill(~mask, ...), "
                "not where it is True"),
        Mistake("mask_use", "transposed", "mask transposed",
                "the mask is (..., T, S): rows are queries, columns keys, like the scores q @ k^T; do not transpose "
                "it"),
        Mistake("mask_use", "after_softmax", "mask applied after the softmax",
                "multiplying the weights by the mask after the softmax leaves rows that no longer add to 1 (the "
                "blocked keys' share is lost); block the SCORES before the softmax, so the allowed keys share all "
                "the weight"),
        Mistake("mask_use", "added", "bool mask added to the scores",
                "adding a bool mask adds 1 to the allowed scores and blocks nothing; fill the blocked scores with "
                "the lowest float instead: scores.masked_fill(~mask, torch.finfo(scores.dtype).min)"),
        Mistake("mask_use", "zero_fill", "blocked scores set to 0",
                "a score of 0 still gets weight exp(0) = 1 in the softmax; fill blocked scores with the lowest "
                "float, torch.finfo(scores.dtype).min, so their weight is 0"),
        Mistake("mask_use", "ignored", "mask ignored", "the mask is not used: block the scores where it is False"),
        Mistake("empty", "nan", "NaN on a fully masked row",
                "a query with no allowed key has every score at -inf, and softmax gives 0/0 = NaN, which spreads "
                "through the whole model; aiayn gives zeros there: zero the weights of rows where ~mask.any(-1)"),
        Mistake("empty", "uniform", "a fully masked row gives the mean of the values",
                "with a large finite fill (-1e9 or the lowest float) a query with no allowed key gets a uniform "
                "softmax, the mean of ALL values, padding included; aiayn gives zeros: zero the weights of rows "
                "where ~mask.any(-1)"),
        Mistake("scale", False, "missing scale", "divide the scores by sqrt(d_k) = math.sqrt(q.shape[-1])"),
        Mistake("axis", -2, "softmax over the wrong axis",
                "each query's weights over the keys must add to 1: torch.softmax(scores, dim=-1)"),
    ),
    cases=_masked_cases,
    lesson="03",
)
