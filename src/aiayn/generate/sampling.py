"""Token-by-token decoding (greedy or sampled), one loop for every model behind a :class:`Stepper`.

Each row stops on its own at a stop id (or at its length limit); the loop ends when every row has stopped,
checked with a single ``.all()`` per step; on an accelerator the host reads that flag one step late
(:class:`aiayn.generate.common.LaggedFlag`), so it never waits for the step it has just queued.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from aiayn.generate.common import LaggedFlag, force_token, next_log_probs, next_scores
from aiayn.generate.filtering import filter_logits
from aiayn.generate.steppers import Stepper

#: scores (N, V) -> chosen ids (N,). The scores are log-probs, or logits when the caller needs no log-probs
#: (``decode_loop(..., with_logprob=False)``), so a chooser must not depend on a per-row shift of them. With
#: ``with_logprob=False`` the stepper may also return hidden states (N, D) for a chooser that applies the output
#: layer itself (:func:`aiayn.generate.choosers.greedy_chooser`).
Chooser = Callable[[Tensor], Tensor]


def greedy_choice(scores: Tensor) -> Tensor:
    """The most likely token of each row (the first on ties): scores (N, V) -> (N,) long."""
    return scores.argmax(dim=-1)


def make_sampler(temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                 generator: torch.Generator | None = None) -> Chooser:
    """A chooser that samples from softmax(filter(logp / temperature)).

    Args:
        temperature: > 0; below 1 sharpens, above 1 flattens the distribution.
        top_k: keep only the k most likely tokens (see :func:`filter_logits`).
        top_p: keep only the nucleus of mass top_p.
        generator: random source (seeded for reproducible samples).
    """
    if not (temperature > 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature={temperature} must be a finite number > 0 for sampling (use greedy_choice "
                         "for 0)")
    t = min(max(temperature, 1e-30), 1e30)

    def choose(scores: Tensor) -> Tensor:  # log-probs or logits: softmax, top-k and top-p ignore a per-row shift
        # each row shifted so that its best is 0, and the temperature kept where float32 holds it and its inverse
        # (beyond, the result is the same: greedy below, uniform over the allowed tokens above), so that no
        # temperature, however small or large, makes an inf / inf or a 0 / 0
        shifted = (scores - scores.max(dim=-1, keepdim=True).values).float()  # (N, V), <= 0; banned stay -inf
        probs = filter_logits(shifted / t, top_k, top_p).softmax(dim=-1)  # (N, V)
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)

    return choose


def decode_loop(
    stepper: Stepper,
    choose: Chooser,
    max_steps: Tensor,
    *,
    stop_ids: Sequence[int],
    force_stop_id: int | None = None,
    banned_ids: Sequence[int] = (),
    pad_id: int = 0,
    on_token: Callable[[int, int], None] | None = None,
    with_logprob: bool = True,
) -> tuple[Tensor, Tensor, Tensor]:
    """Decode one token per row per step until every row has stopped.

    Args:
        stepper: the model behind the step interface; ``first()`` fixes the number of rows N.
        choose: picks a token per row from the log-probs, e.g. :func:`greedy_choice` or :func:`make_sampler`.
        max_steps: (N,) long, the most tokens (stop ids excluded) each row may produce.
        stop_ids: ids that end a row; they are not part of its output.
        force_stop_id: when given, a row that has produced ``max_steps`` tokens must produce this id next
            (so every output ends with it and its probability counts in the log-prob); otherwise the row ends.
        banned_ids: ids never produced (e.g. PAD, BOS).
        pad_id: filler after a row's end in the returned tokens.
        on_token: streaming callback ``on_token(row, token_id)`` for every output token as it is produced
            (costs one host sync per step).
        with_logprob: sum the output's log-probs. When False, ``choose`` sees the logits themselves (the same
            choices: greedy and sampling ignore a per-row shift) and no log-softmax pass is made per step; or
            the stepper's hidden states, for a chooser that projects them (pass no ``banned_ids`` then: the
            chooser bans its own).
    Returns:
        tokens (N, L) long (row i's output is ``tokens[i, :lengths[i]]``), lengths (N,) long, and logprob (N,)
        float32: the sum of the log-probs of the output tokens and of the stop token that ended the row (NaN
        when ``with_logprob`` is False).
    """
    logits = stepper.first()
    n, device = logits.shape[0], logits.device
    max_steps = max_steps.to(device)
    total = int(max_steps.max()) + (1 if force_stop_id is not None else 0)
    limit_steps = set(max_steps.tolist()) if force_stop_id is not None else set()
    out = torch.full((n, max(total, 1)), pad_id, dtype=torch.long, device=device)
    lengths = torch.zeros(n, dtype=torch.long, device=device)
    logprob = torch.zeros(n, dtype=torch.float32, device=device) if with_logprob else None
    finished = torch.zeros(n, dtype=torch.bool, device=device)
    stop = torch.tensor(list(stop_ids), dtype=torch.long, device=device)
    all_stopped = LaggedFlag(device, lagged=False if on_token is not None else None)  # streaming syncs anyway
    for t in range(total):
        scores = next_log_probs(logits, banned_ids) if with_logprob else next_scores(logits, banned_ids)  # (N, V)
        if force_stop_id is not None and t in limit_steps:
            scores = force_token(scores, max_steps == t, force_stop_id)
        tok = choose(scores)  # (N,)
        active = ~finished
        if logprob is not None:
            logprob += torch.where(active, scores.gather(1, tok[:, None]).squeeze(1), 0.0)
        is_stop = torch.isin(tok, stop)
        emit = active & ~is_stop
        out[:, t] = torch.where(emit, tok, pad_id)
        lengths += emit.long()
        finished = finished | is_stop
        if force_stop_id is None:
            finished = finished | (max_steps <= t + 1)
        if on_token is not None:
            rows = emit.nonzero().squeeze(1)
            for row, token in zip(rows.tolist(), tok[rows].tolist()):
                on_token(row, token)
        if t + 1 == total or all_stopped.seen(finished.all()):
            break
        logits = stepper.step(tok)
    return out, lengths, logprob if logprob is not None else torch.full((n,), float("nan"), device=device)
