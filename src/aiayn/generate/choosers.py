"""How a search picks next tokens from the output layer: greedy's argmax and beam search's best candidates per row.

Each is the reference in plain torch, unless the model's :class:`~aiayn.models.heads.LMHead` has a kernel for it
(``greedy_kernel``, ``row_top_kernel``: seams an accelerator fills, e.g. a screened argmax that reads the output
layer in int8 first and rescores the few candidates exactly). Both give the same tokens up to exact ties.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from aiayn.models.heads import LMHead, RowTop, next_log_probs, next_scores


def greedy_chooser(head: LMHead, banned_ids: Sequence[int] = ()) -> Callable[[Tensor], Tensor]:
    """A chooser for greedy decoding over hidden states: h (N, D) -> each row's most likely id (N,) long (the first on
    ties), ``banned_ids`` never chosen; the head's ``greedy_kernel`` where it has one."""
    kernel = head.greedy_kernel(banned_ids) if head.greedy_kernel is not None else None  # None: declined
    if kernel is not None:
        return kernel
    banned = list(banned_ids)

    def choose(h: Tensor) -> Tensor:
        return next_scores(head(head.in_weight_dtype(h)), banned).argmax(dim=-1)  # (N,)

    return choose


def row_top(head: LMHead | None, logits: Tensor, banned_ids: Sequence[int], n: int) -> RowTop:
    """Beam search's chooser: ``top(logits, eos_id)`` gives each row's ``min(n, V)`` best next tokens as
    log-probabilities normalized over the whole vocabulary (banned ids included in the normalizer, excluded from the
    choice), best first, and log p(``eos_id``) (N, 1) where ``eos_id`` is given; the head's ``row_top_kernel`` where
    it has one.

    Args:
        head: the output layer the logits come from (None: an ensemble's mixed distribution).
        logits: (N, V) an example of the logits it will get (vocabulary size, dtype, device).
        banned_ids: ids never chosen.
        n: how many per row.
    """
    kernel = head.row_top_kernel(logits, banned_ids, n) if head is not None and head.row_top_kernel else None
    if kernel is not None:  # None: declined
        return kernel
    n = min(n, logits.shape[-1])
    banned = torch.tensor(list(banned_ids), dtype=torch.long, device=logits.device) if banned_ids else None

    def top(logits: Tensor, eos_id: int | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
        log_probs = next_log_probs(logits)  # (N, V) float32
        if banned is not None:  # the index built once per search, not per step
            log_probs.index_fill_(1, banned, float("-inf"))
        top_lp, top_tok = log_probs.topk(n, dim=-1)  # (N, n) each, best first
        return top_lp, top_tok, None if eos_id is None else log_probs[:, eos_id:eos_id + 1]

    return top
