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


@torch.no_grad()
def sliding_window_nll(
    logits_fn: Callable[[torch.Tensor], torch.Tensor],
    ids: torch.Tensor,
    context: int,
    stride: int,
) -> tuple[float, int]:
    """Total negative log-likelihood of a token sequence, with Hugging Face's strided windows.

    Windows start at ``0, stride, 2 * stride, ...`` and hold up to ``context`` tokens; each window
    scores only the tokens after the previous window's end (the first window scores all but its
    first token), and the last window is the one that reaches the end of ``ids``. The first token
    of ``ids`` has no history and is never scored: prepend a beginning-of-sequence id to score it.

    Args:
        logits_fn: maps ``x`` (1, L) LongTensor, L <= ``context``, to (1, L, V) next-token logits
            (position i predicts token i + 1).
        ids: (N,) LongTensor, the text.
        context: window length, at most the model's maximum sequence length; >= 2.
        stride: how far each window moves, 1 <= stride < ``context``. Smaller is slower and gives
            each token more history.

    Returns:
        ``(total_nll, n_scored)``: the summed NLL in nats and the number of tokens scored,
        ``max(N - 1, 0)``.

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
    if ids.dim() != 1:
        raise ValueError(f"sliding_window_nll: ids must be 1-D (N,), got shape {tuple(ids.shape)}")
    n = ids.numel()
    total = torch.zeros((), dtype=torch.float64)
    n_scored, prev_end = 0, 0
    for begin in range(0, max(n - 1, 0), stride):
        end = min(begin + context, n)
        first = max(prev_end, begin + 1)  # absolute index of the first token this window scores
        window = ids[begin:end].unsqueeze(0)  # (1, L)
        logits = logits_fn(window)
        if logits.dim() != 3 or logits.shape[:2] != window.shape:
            raise ValueError(
                f"sliding_window_nll: logits_fn returned shape {tuple(logits.shape)} for input "
                f"{tuple(window.shape)}; expected (1, L, V)"
            )
        pred = logits[0, first - 1 - begin : end - 1 - begin]  # (k, V) predicts ids[first:end]
        target = ids[first:end]
        total += F.cross_entropy(pred.double(), target, reduction="sum").cpu()
        n_scored += end - first
        prev_end = end
        if end == n:
            break
    return float(total), n_scored
