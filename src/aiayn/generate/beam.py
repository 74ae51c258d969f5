"""Batched beam search: B sentences x K beams decoded as one (B*K) batch, with no per-beam Python loops.

Each step (for the sentences still active):

1. Candidates: every alive beam extended by every token, scored by its cumulative log-probability. The 2K
   best are kept (enough for K alive beams however many of them end in EOS); they are found among the 2K best
   tokens of each beam, so no (N, V) log-softmax or top-k over K*V candidates is ever materialized.
2. Finished: a candidate ending in EOS that ranks among the K best of this step becomes a hypothesis, scored
   ``logprob / lp(length)`` with GNMT's length penalty, and joins the sentence's pool of the K best finished
   (fairseq's rule; with K = 1 it makes beam search exactly greedy search).
3. Alive: the K best candidates not ending in EOS; the KV cache follows them with ``reorder``.
4. A sentence is done when its pool holds K hypotheses and its best alive beam, scored at its current
   length, cannot beat the worst of them (exact when alpha = 0, where extending a beam only lowers its score;
   Hugging Face's default heuristic when alpha > 0), or when it reaches its maximum length (the last step
   allows only EOS). Done sentences leave the batch, so the work shrinks as sentences finish.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from aiayn.generate.common import Hypothesis, length_penalty
from aiayn.generate.steppers import Stepper
from aiayn.generate.topk import row_topk


def beam_search(
    stepper: Stepper,
    max_steps: Tensor,
    *,
    beam_size: int = 4,
    alpha: float = 0.6,
    n_best: int = 1,
    eos_id: int = 2,
    banned_ids: Sequence[int] = (),
    pad_id: int = 0,
) -> list[list[Hypothesis]]:
    """Beam search over a :class:`Stepper` whose ``first()`` returns one row per sentence.

    Args:
        stepper: the model behind the step interface (rows: B sentences at first, then B*K beams).
        max_steps: (B,) long, the most output tokens (EOS excluded) per sentence.
        beam_size: K.
        alpha: length-penalty strength (0 = plain log-probability).
        n_best: hypotheses to return per sentence (<= K).
        eos_id: end of sentence.
        banned_ids: ids never produced (e.g. PAD, BOS).
        pad_id: filler in the internal token buffers.
    Returns:
        For each sentence, up to ``n_best`` hypotheses, best first.
    """
    K = beam_size
    logits = stepper.first()  # (B, V)
    B, device = logits.shape[0], logits.device
    max_steps = max_steps.to(device)
    L = int(max_steps.max()) + 1  # token buffer width (room for the forced-EOS step)
    results: list[list[Hypothesis]] = [[] for _ in range(B)]

    sent = torch.arange(B, device=device)  # (Ba,) original index of each active sentence
    alive_cum = torch.zeros(B, 1, device=device)  # (Ba, k) cumulative log-prob; k = 1 before the first step
    alive_tokens = torch.full((B, 1, L), pad_id, dtype=torch.long, device=device)  # (Ba, k, L)
    fin_score = torch.full((B, K), float("-inf"), device=device)  # (Ba, K) best first
    fin_logprob = torch.zeros(B, K, device=device)
    fin_len = torch.zeros(B, K, dtype=torch.long, device=device)
    fin_tokens = torch.full((B, K, L), pad_id, dtype=torch.long, device=device)
    in_top_k = torch.arange(2 * K, device=device) < K  # (2K,) the K best of a step's 2K candidates
    row_base, row_base_for = None, (0, 0)  # (Ba, 1) first cache row of each sentence, for (Ba, k)
    limit_steps = set(max_steps.tolist())  # one host sync up front instead of an (N, V) rewrite per step
    ids = list(banned_ids)
    banned = torch.tensor(ids, dtype=torch.long, device=device) if ids else None  # (nb,), made once

    for t in range(L):
        ba, k = alive_cum.shape
        row_lp, row_tok, log_probs = _row_top(logits, 2 * K, banned)  # (Ba*k, c) each, c = min(2K, V); (Ba*k, V)
        if t in limit_steps:  # only at steps where some sentence reaches its length limit: EOS or nothing
            forced = (max_steps == t).repeat_interleave(k)[:, None]  # (Ba*k, 1)
            only_lp = torch.full_like(row_lp, float("-inf"))
            only_lp[:, :1] = log_probs[:, eos_id:eos_id + 1]  # log p(EOS)
            row_lp = torch.where(forced, only_lp, row_lp)
            row_tok = torch.where(forced, torch.full_like(row_tok, eos_id), row_tok)
        c = row_lp.shape[1]
        # the 2K best extensions of each sentence are among the 2K best of each of its beams
        cand = (alive_cum[:, :, None] + row_lp.view(ba, k, c)).view(ba, k * c)  # (Ba, k*c)
        padded = k * c < 2 * K
        if padded:  # tiny vocabularies: pad with impossible candidates
            cand = torch.cat([cand, cand.new_full((ba, 2 * K - k * c), float("-inf"))], dim=1)
        top_cum, top_idx = cand.topk(2 * K, dim=1)  # (Ba, 2K), best first
        if padded:
            top_idx = top_idx.clamp(max=k * c - 1)  # padding candidates point at a real one; they stay -inf
        top_beam = top_idx // c
        top_tok = row_tok.view(ba, k * c).gather(1, top_idx)
        is_eos = top_tok == eos_id

        # ---- finished: EOS candidates among this step's K best join the pool of the K best hypotheses
        new_fin = is_eos & in_top_k & top_cum.isfinite()  # (Ba, 2K)
        new_score = torch.where(new_fin, top_cum / length_penalty(t + 1, alpha), float("-inf"))
        new_tokens = alive_tokens.gather(1, top_beam[:, :, None].expand(ba, 2 * K, L))  # (Ba, 2K, L)
        pool_score, pick = torch.cat([fin_score, new_score], 1).topk(K, dim=1)  # (Ba, K)
        fin_score = pool_score
        fin_logprob = torch.cat([fin_logprob, top_cum], 1).gather(1, pick)
        fin_len = torch.cat([fin_len, torch.full_like(top_cum, t, dtype=torch.long)], 1).gather(1, pick)
        fin_tokens = torch.cat([fin_tokens, new_tokens], 1).gather(1, pick[:, :, None].expand(ba, K, L))

        # ---- alive: the K best candidates that do not end in EOS
        alive_cum, pos = torch.where(is_eos, float("-inf"), top_cum).topk(K, dim=1)  # (Ba, K)
        beam, tok = top_beam.gather(1, pos), top_tok.gather(1, pos)  # (Ba, K)
        alive_tokens = alive_tokens.gather(1, beam[:, :, None].expand(ba, K, L))
        alive_tokens[:, :, t] = tok
        if row_base_for != (ba, k):
            row_base, row_base_for = torch.arange(ba, device=device)[:, None] * k, (ba, k)
        index = (row_base + beam).view(-1)  # (Ba*K,) rows to keep

        # ---- which sentences are done: the best alive beam cannot beat the worst of a full pool (a pool that is
        # not full has worst -inf, so only a sentence with no alive beam, best -inf, is done then), or the length
        # limit is reached (only at a limit step: sentences past theirs have left the batch)
        best_alive = alive_cum[:, 0] / length_penalty(t + 1, alpha)
        done = best_alive <= fin_score[:, -1]
        if t in limit_steps:
            done |= max_steps <= t
        n_done = int(done.sum())  # the one host sync per step
        if n_done:
            _collect(results, done, sent, fin_score, fin_logprob, fin_len, fin_tokens, n_best, alpha)
            if n_done == ba:
                break
            keep = (~done).nonzero().squeeze(1)  # (Ba',)
            index = index.view(ba, K).index_select(0, keep).view(-1)
            sent, max_steps, alive_cum, alive_tokens, tok = (
                x.index_select(0, keep) for x in (sent, max_steps, alive_cum, alive_tokens, tok))
            fin_score, fin_logprob, fin_len, fin_tokens = (
                x.index_select(0, keep) for x in (fin_score, fin_logprob, fin_len, fin_tokens))
        # rows stay with their sentence unless beams were just expanded (k = 1 -> K) or sentences left;
        # either way each sentence's K rows are consecutive
        stepper.reorder(index, same_sources=k == K and not n_done, group=K)
        logits = stepper.step(tok.reshape(-1))
    return results


def _row_top(logits: Tensor, n: int, banned: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """The ``n`` most likely next tokens of each row: log-probs (N, c) float32 and ids (N, c), c = min(n, V), and
    the log-probabilities of the whole vocabulary (N, V) float32, -inf at the banned ids.

    Log-probabilities are normalized over the whole vocabulary (banned ids included, as
    :func:`~aiayn.generate.common.next_log_probs`), then banned ids are excluded. One ``log_softmax`` (torch's kernel
    fuses its max, exp-sum and subtraction passes) and one blocked top-k (:func:`~aiayn.generate.topk.row_topk`)
    replace a top-k over every beam's whole vocabulary; the normalizer needs no passes of its own.

    Args:
        logits: (N, V), left unchanged.
        banned: (nb,) long ids never produced, or None.
    """
    log_probs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)  # (N, V)
    if banned is not None:
        log_probs.index_fill_(1, banned, float("-inf"))
    top_lp, top_tok = row_topk(log_probs, min(n, log_probs.shape[-1]))
    return top_lp, top_tok, log_probs


def _collect(results: list[list[Hypothesis]], done: Tensor, sent: Tensor, fin_score: Tensor,
             fin_logprob: Tensor, fin_len: Tensor, fin_tokens: Tensor, n_best: int, alpha: float) -> None:
    """Move the best ``n_best`` finished hypotheses of the ``done`` (Ba,) sentences into ``results``."""
    rows = done.nonzero().squeeze(1)
    ok = fin_score[rows, :n_best].isfinite().tolist()
    lps = fin_logprob[rows, :n_best].tolist()
    lens = fin_len[rows, :n_best].tolist()
    toks = fin_tokens[rows, :n_best].tolist()
    for i, s in enumerate(sent[rows].tolist()):
        results[s] = [Hypothesis(tokens=toks[i][j][:lens[i][j]], logprob=lps[i][j],
                                 score=lps[i][j] / length_penalty(lens[i][j] + 1, alpha))
                      for j in range(len(ok[i])) if ok[i][j]]
