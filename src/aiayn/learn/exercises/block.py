"""Lesson 6: the block: the position-wise feed-forward network, and the residual connection with its norm (post-LN,
the paper's, or pre-LN).

References: :class:`aiayn.nn.feedforward.FeedForward` and :class:`aiayn.nn.layers.Residual`.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.learn.checking import Case, Exercise, Mistake
from aiayn.learn.exercises.common import generator, randn
from aiayn.nn.feedforward import FeedForward
from aiayn.nn.layers import Residual


# ---------------------------------------------------------------------------------------------- feed_forward
def feed_forward_reference(x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor) -> Tensor:
    """max(0, x W1^T + b1) W2^T + b2 through :class:`FeedForward` holding these weights (nn.Linear's layout:
    w1 (d_ff, D), w2 (D, d_ff))."""
    ffn = FeedForward(w1.shape[1], w1.shape[0])
    with torch.no_grad():
        ffn.w_in.weight.copy_(w1), ffn.w_in.bias.copy_(b1), ffn.w_out.weight.copy_(w2), ffn.w_out.bias.copy_(b2)
    return ffn.eval()(x)


def feed_forward_variant(act: str = "relu", where: str = "hidden", bias: bool = True) -> Callable[..., Tensor]:
    """The FFN, or a wrong one: ``act`` "none" or "gelu"; ``where`` "output" (the ReLU after the second layer);
    ``bias`` False (biases left out)."""
    fn = {"relu": F.relu, "gelu": F.gelu, "none": lambda h: h}[act]

    def feed_forward(x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor) -> Tensor:
        h = x @ w1.T + (b1 if bias else 0)  # (B, T, d_ff)
        if where == "hidden":
            h = fn(h)
        out = h @ w2.T + (b2 if bias else 0)  # (B, T, D)
        return fn(out) if where == "output" else out

    return feed_forward


def _ffn_cases(rng: random.Random) -> list[Case]:
    g = generator(rng)

    def weights(d: int, d_ff: int) -> tuple[Tensor, ...]:
        return randn(g, d_ff, d, scale=0.5), randn(g, d_ff, scale=0.5), randn(g, d, d_ff, scale=0.5), randn(g, d)

    d = rng.randint(2, 8)
    return [Case("width 4, hidden 16, batch 2 x 3 tokens", (randn(g, 2, 3, 4), *weights(4, 16))),
            Case("width 6, hidden 8, one token", (randn(g, 1, 1, 6), *weights(6, 8))),
            Case(f"random: width {d}, hidden {4 * d}", (randn(g, 2, 5, d), *weights(d, 4 * d)))]


FEED_FORWARD = Exercise(
    name="feed_forward",
    signature="feed_forward(x, w1, b1, w2, b2): x (B, T, D), w1 (d_ff, D), b1 (d_ff,), w2 (D, d_ff), b2 (D,) "
              "(nn.Linear's layout) -> (B, T, D): max(0, x W1^T + b1) W2^T + b2",
    reference=feed_forward_reference,
    variant=feed_forward_variant,
    mistakes=(
        Mistake("act", "none", "no activation",
                "without the ReLU the two layers are one linear map; apply torch.relu to the hidden layer"),
        Mistake("act", "gelu", "GELU instead of ReLU",
                "the paper's FFN uses ReLU, max(0, h); GELU is BERT's and GPT's (a config option in aiayn)"),
        Mistake("where", "output", "ReLU after the second layer",
                "the ReLU goes between the two layers, on the hidden d_ff units; the output is left linear"),
        Mistake("bias", False, "biases left out", "add b1 after the first product and b2 after the second"),
    ),
    cases=_ffn_cases,
    lesson="06",
)


# ---------------------------------------------------------------------------------------------- sublayer
def sublayer_reference(x: Tensor, f: Callable[[Tensor], Tensor], norm: nn.Module, pre_norm: bool) -> Tensor:
    """Post-LN: norm(x + f(x)); pre-LN: x + f(norm(x)), as :class:`Residual` does (no dropout)."""
    residual = Residual(ModelConfig.preset("tiny", d_model=x.shape[-1], n_heads=1,
                                           norm_position="pre" if pre_norm else "post")).eval()
    residual.norm = norm
    return residual.exit(x, f(residual.enter(x)))


def sublayer_variant(placement: str = "right", residual: bool = True, pre_form: str = "x", post_form: str = "sum"
                     ) -> Callable[..., Tensor]:
    """The residual connection, or a wrong one: ``placement`` "swapped" (pre-LN's form for post-LN and the other way);
    ``residual`` False; ``pre_form`` "normed" (pre-LN adds norm(x), not x); ``post_form`` "norm_f" (post-LN
    computes x + norm(f(x)))."""
    def sublayer(x: Tensor, f: Callable[[Tensor], Tensor], norm: nn.Module, pre_norm: bool) -> Tensor:
        pre = pre_norm if placement == "right" else not pre_norm
        keep = 1.0 if residual else 0.0
        if pre:
            h = norm(x)
            return keep * (h if pre_form == "normed" else x) + f(h)
        if post_form == "norm_f":
            return keep * x + norm(f(x))
        return norm(keep * x + f(x))

    return sublayer


def _sublayer_cases(rng: random.Random) -> list[Case]:
    g = generator(rng)

    def parts(d: int) -> tuple[Callable[[Tensor], Tensor], nn.Module]:
        lin = nn.Linear(d, d)
        norm = nn.LayerNorm(d)
        with torch.no_grad():
            for p in (*lin.parameters(), *norm.parameters()):
                p.copy_(randn(g, *p.shape, scale=0.7))
            norm.weight.add_(1.0)

        def f(h: Tensor) -> Tensor:  # a sublayer: any function of the normalized or raw input
            return torch.tanh(lin(h)) * 2.0

        return f, norm

    d = rng.randint(3, 8)
    cases = []
    for pre in (False, True):
        kind = "pre-LN" if pre else "post-LN (the paper)"
        cases.append(Case(f"{kind}, width 6", (randn(g, 2, 3, 6, scale=3.0) + 1.0, *parts(6), pre)))
        cases.append(Case(f"{kind}, random width {d}", (randn(g, 1, 4, d, scale=2.0) - 0.5, *parts(d), pre)))
    return cases


SUBLAYER = Exercise(
    name="sublayer",
    signature="sublayer(x, f, norm, pre_norm): x (B, T, D), f a sublayer (B, T, D) -> (B, T, D), norm a LayerNorm; "
              "post-LN (pre_norm False, the paper): norm(x + f(x)); pre-LN: x + f(norm(x))",
    reference=sublayer_reference,
    variant=sublayer_variant,
    mistakes=(
        Mistake("placement", "swapped", "pre-LN and post-LN swapped",
                "post-LN (the paper, pre_norm=False) normalizes the SUM: norm(x + f(x)); pre-LN normalizes the "
                "sublayer's INPUT and leaves the residual path untouched: x + f(norm(x))"),
        Mistake("residual", False, "no residual connection",
                "add the input back: the sublayer computes a change to x, not a replacement"),
        Mistake("pre_form", "normed", "pre-LN adds the normalized input",
                "in pre-LN the residual path carries x itself: x + f(norm(x)), not norm(x) + f(norm(x))"),
        Mistake("post_form", "norm_f", "post-LN normalizes the sublayer only",
                "post-LN normalizes the sum, norm(x + f(x)), not x + norm(f(x))"),
    ),
    cases=_sublayer_cases,
    lesson="06",
)
