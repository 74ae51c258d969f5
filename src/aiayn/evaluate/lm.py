"""Language-model metrics: perplexity, bits per character, and strided sliding-window scoring.

A text longer than the model's context cannot be scored in one pass. Cutting it into disjoint
chunks leaves the first tokens of every chunk with little history and inflates perplexity;
sliding one token at a time is exact but costs one forward pass per token. The strided method
(Hugging Face's "Perplexity of fixed-length models" guide) slides a ``context``-token window by
``stride`` tokens and scores only the tokens not scored by an earlier window, so every token is
scored exactly once and, after the first window, with at least ``context - stride`` tokens of
history.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from aiayn.errors import AiaynError


def perplexity(total_nll: float, n_tokens: int) -> float:
    """``exp(total_nll / n_tokens)``: the perplexity of a text.

    Args:
        total_nll: summed negative log-likelihood in nats.
        n_tokens: number of tokens scored.

    Raises:
        AiaynError: if no tokens were scored.
    """
    if n_tokens <= 0:
        raise AiaynError(
            f"perplexity: {n_tokens} tokens were scored; the evaluation text is empty or one token"
        )
    return math.exp(total_nll / n_tokens)


def bits_per_character(total_nll_nats: float, n_chars: int) -> float:
    """Bits per character: ``total_nll_nats / (n_chars * ln 2)``.

    Args:
        total_nll_nats: summed negative log-likelihood in nats (of any tokenization of the text).
        n_chars: number of characters in the scored text.

    Raises:
        AiaynError: if ``n_chars`` is not positive.
    """
    if n_chars <= 0:
        raise AiaynError(f"bits_per_character: {n_chars} characters; the evaluation text is empty")
    return total_nll_nats / (n_chars * math.log(2))


def window_plan(n: int, context: int, stride: int) -> list[tuple[int, int, int]]:
    """The strided windows of :func:`sliding_window_nll` over ``n`` tokens: ``(begin, end, first)`` each.

    A window holds ``ids[begin:end]`` and scores ``ids[first:end]``. Every window is ``context`` tokens long
    but possibly the last, the one that reaches ``n``.

    Raises:
        AiaynError: if ``context`` or ``stride`` are out of range.
    """
    if context < 2:
        raise AiaynError(f"sliding_window_nll: context={context}; it must be at least 2")
    if not 1 <= stride < context:
        raise AiaynError(
            f"sliding_window_nll: stride={stride} with context={context}; use 1 <= stride < context "
            f"(stride={context - 1} gives windows that do not overlap)"
        )
    plan: list[tuple[int, int, int]] = []
    prev_end = 0
    for begin in range(0, max(n - 1, 0), stride):
        end = min(begin + context, n)
        plan.append((begin, end, max(prev_end, begin + 1)))  # first: the first token not scored before
        prev_end = end
        if end == n:
            break
    return plan


@torch.no_grad()
def sliding_window_nll(
    logits_fn: Callable[[torch.Tensor], torch.Tensor],
    ids: torch.Tensor,
    context: int,
    stride: int,
    batch_size: int = 1,
    progress: Callable[[int], None] | None = None,
) -> tuple[float, int]:
    """Total negative log-likelihood of a token sequence, with Hugging Face's strided windows.

    Windows start at ``0, stride, 2 * stride, ...`` and hold up to ``context`` tokens; each window
    scores only the tokens after the previous window's end (the first window scores all but its
    first token), and the last window is the one that reaches the end of ``ids``. The first token
    of ``ids`` has no history and is never scored: prepend a beginning-of-sequence id to score it.

    Windows are independent, so up to ``batch_size`` of them go through ``logits_fn`` together as
    one (B, context) batch; no padding is ever needed, since only the last window can be shorter and
    it goes alone. The result equals one window at a time up to float rounding.

    Args:
        logits_fn: maps ``x`` (B, L) LongTensor, L <= ``context``, to (B, L, V) next-token logits
            (position i predicts token i + 1).
        ids: (N,) LongTensor, the text.
        context: window length, at most the model's maximum sequence length; >= 2.
        stride: how far each window moves, 1 <= stride < ``context``. Smaller is slower and gives
            each token more history.
        batch_size: windows per call of ``logits_fn`` (>= 1). More is faster until the batch's
            activations and (B, context, V) logits no longer fit in memory.
        progress: called with the number of windows each batch finished (e.g. a progress bar's
            ``update``).

    Returns:
        ``(total_nll, n_scored)``: the summed NLL in nats and the number of tokens scored,
        ``max(N - 1, 0)``.

    Raises:
        AiaynError: if ``context``, ``stride`` or ``batch_size`` are out of range.
    """
    if ids.dim() != 1:
        raise ValueError(f"sliding_window_nll: ids must be 1-D (N,), got shape {tuple(ids.shape)}")
    if batch_size < 1:
        raise AiaynError(f"sliding_window_nll: batch_size={batch_size}; it must be at least 1")
    plan = window_plan(ids.numel(), context, stride)
    total = torch.zeros((), dtype=torch.float64)
    n_scored = 0
    i = 0
    while i < len(plan):
        width = plan[i][1] - plan[i][0]
        j = i + 1  # windows i..j-1 share one length (all but possibly the last have ``context``)
        while j < len(plan) and j - i < batch_size and plan[j][1] - plan[j][0] == width:
            j += 1
        windows = plan[i:j]
        x = torch.stack([ids[b:e] for b, e, _ in windows])  # (B, L)
        logits = logits_fn(x)
        if logits.dim() != 3 or logits.shape[:2] != x.shape:
            raise ValueError(
                f"sliding_window_nll: logits_fn returned shape {tuple(logits.shape)} for input "
                f"{tuple(x.shape)}; expected (B, L, V)"
            )
        # row r's positions first-1-begin .. end-2-begin predict ids[first:end]
        pred = torch.cat([logits[r, f - 1 - b : e - 1 - b] for r, (b, e, f) in enumerate(windows)])  # (k, V)
        target = torch.cat([ids[f:e] for b, e, f in windows]).to(pred.device)  # (k,)
        total += F.cross_entropy(pred.double(), target, reduction="sum").cpu()
        n_scored += target.numel()
        if progress is not None:
            progress(len(windows))
        i = j
    return float(total), n_scored
