"""Per-head statistics of attention weights: how spread out a head is, how far it looks, and where it rests.

For weights ``w`` (H, T, S) of one example, each statistic is averaged over the query rows that attend to
something (a row with no allowed key has all-zero weights and is left out):

- ``entropy``: ``-sum_j w_ij log2 w_ij`` in bits; 0 is one key, log2(S) is uniform attention.
- ``distance``: ``sum_j w_ij |i - j|``, the mean distance in positions from a query to what it attends to (self-
  attention only: queries and keys are positions of the same sequence; None for cross-attention). Queries of a
  decoding step stand at the end of the keys.
- ``first``: the weight on the first key (BOS, CLS, or the first token): where heads with nothing to do rest.
- ``punctuation``: the weight on keys whose token is punctuation only (``.``, ``,``, ``</s>`` excluded).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

import torch
from torch import Tensor


def is_punctuation(token: str) -> bool:
    """Whether a token's visible characters are all punctuation (``.``, ``,``, ``▁.``, ``Ġ,``, ``"``)."""
    text = token.lstrip("▁Ġ ").removesuffix("</w>").removesuffix("@@")
    return bool(text) and all(unicodedata.category(ch).startswith("P") for ch in text)


def head_statistics(weights: Tensor, key_tokens: Sequence[str], *,
                    self_attention: bool) -> list[dict[str, float | None]]:
    """The statistics of each head of one example.

    Args:
        weights: (H, T, S) attention weights.
        key_tokens: the S key tokens (for the punctuation share).
        self_attention: queries are the last T of the S key positions (distance is defined).
    Returns:
        one dict per head: ``entropy``, ``distance`` (None for cross-attention), ``first``, ``punctuation``.
    """
    w = weights.detach().double()  # (H, T, S)
    h, t, s = w.shape
    if len(key_tokens) != s:
        raise ValueError(f"{len(key_tokens)} key tokens for {s} keys")
    live = w.sum(-1) > 0  # (H, T): rows that attend to something
    count = live.sum(-1).clamp(min=1)  # (H,)

    def mean_over_rows(x: Tensor) -> Tensor:  # (H, T) -> (H,)
        return (x * live).sum(-1) / count

    entropy = mean_over_rows(-(w * torch.log2(w.clamp(min=1e-30))).sum(-1))
    first = mean_over_rows(w[..., 0])
    punct = torch.tensor([is_punctuation(tok) for tok in key_tokens], dtype=torch.bool)
    punctuation = mean_over_rows(w[..., punct].sum(-1))
    distance = None
    if self_attention:
        q_pos = torch.arange(s - t, s, dtype=torch.float64)[:, None]  # (T, 1)
        k_pos = torch.arange(s, dtype=torch.float64)[None]  # (1, S)
        distance = mean_over_rows((w * (q_pos - k_pos).abs()).sum(-1))
    return [{"entropy": float(entropy[i]), "distance": None if distance is None else float(distance[i]),
             "first": float(first[i]), "punctuation": float(punctuation[i])} for i in range(h)]
