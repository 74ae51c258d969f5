"""Batched beam search: B sentences x K beams decoded as one (B*K) batch, with no per-beam Python loops.

Each step (for the sentences still active):

1. Candidates: every alive beam extended by every token, scored by its cumulative log-probability. The 2K
   best are kept (enough for K alive beams however many of them end in EOS); they are found among the 2K best
   tokens of each beam, so no top-k over K*V candidates is ever materialized.
2. Finished: a candidate ending in EOS that ranks among the K best of this step becomes a hypothesis, scored
   ``logprob / lp(length)`` with GNMT's length penalty, and joins the sentence's pool of the K best finished
   (fairseq's rule; with K = 1 it makes beam search exactly greedy search).
3. Alive: the K best candidates not ending in EOS; the KV cache follows them with ``reorder``. Each step records
   only the alive beams' new tokens and parent beams (a backpointer per beam); a hypothesis's tokens are read back
   through them on the host when its sentence is done, so no token buffer is gathered or copied per step.
4. A sentence is done when its pool holds K hypotheses and its best alive beam, scored at its current
   length, cannot beat the worst of them (exact when alpha = 0, where extending a beam only lowers its score;
   Hugging Face's default heuristic when alpha > 0), or when it reaches its maximum length (the last step
   allows only EOS). Done sentences leave the batch, so the work shrinks as sentences finish.

One host sync per step tells whether any sentence finished a hypothesis or is done; the pools are updated only
at steps where one did (most steps of a long output have none).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from aiayn.generate.choosers import row_top
from aiayn.generate.common import Hypothesis, length_penalty
from aiayn.generate.steppers import Stepper


class BeamHistory:
    """Every step's alive beams as backpointers: the token each one took and the beam of the previous step it
    extends, kept as that step's (rows, K) tensors and read on the host only to spell out a finished hypothesis.

    Rows are the active sentences of their step; when sentences leave the batch after step t, :meth:`renumber`
    records which old row each remaining row was.
    """

    def __init__(self) -> None:
        self._tokens: list[Tensor] = []  # step t -> (rows_t, K) token of each alive beam
        self._parents: list[Tensor] = []  # step t -> (rows_t, K) its beam at step t - 1
        self._host: dict[int, tuple[list[list[int]], list[list[int]]]] = {}  # step -> both as lists, once read
        self._kept: dict[int, list[int]] = {}  # step t -> old row of each row from step t + 1 on

    def record(self, tokens: Tensor, parents: Tensor) -> None:
        """Append the next step's (rows, K) tokens and parent beams."""
        self._tokens.append(tokens)
        self._parents.append(parents)

    def renumber(self, kept: list[int]) -> None:
        """Rows from the next step on are the current step's rows ``kept`` (in that order)."""
        self._kept[len(self._tokens) - 1] = kept

    def _read_back(self) -> dict[int, tuple[list[list[int]], list[list[int]]]]:
        """Every step not yet on the host, brought there in one transfer (a concatenation and one ``tolist`` for
        the tokens, one for the parents), not a transfer per step; returns the steps on the host."""
        todo = [t for t in range(len(self._tokens)) if t not in self._host]
        if todo:
            tokens = torch.cat([self._tokens[t] for t in todo]).tolist()
            parents = torch.cat([self._parents[t] for t in todo]).tolist()
            start = 0
            for t in todo:
                end = start + self._tokens[t].shape[0]
                self._host[t] = (tokens[start:end], parents[start:end])
                start = end
        return self._host

    def tokens(self, row: int, beam: int, length: int) -> list[int]:
        """The ``length`` tokens that lead to ``beam`` of step ``length - 1``, for the sentence in ``row`` of the
        last recorded step (empty for length 0)."""
        out = [0] * length
        numbering = len(self._tokens) - 1  # the step whose row numbers `row` is in
        for t in range(length - 1, -1, -1):
            while numbering > t:  # back to step t's row numbers
                numbering -= 1
                kept = self._kept.get(numbering)
                if kept is not None:
                    row = kept[row]
            host = self._host.get(t) or self._read_back()[t]
            out[t] = host[0][row][beam]
            beam = host[1][row][beam]
        return out


def beam_search(
    stepper: Stepper,
    max_steps: Tensor,
    *,
    beam_size: int = 4,
    alpha: float = 0.6,
    n_best: int = 1,
    eos_id: int = 2,
    banned_ids: Sequence[int] = (),
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
    Returns:
        For each sentence, up to ``n_best`` hypotheses, best first.
    """
    K = beam_size
    logits = stepper.first()  # (B, V)
    B, device = logits.shape[0], logits.device
    max_steps = max_steps.to(device)
    L = int(max_steps.max()) + 1  # steps, with room for the forced-EOS step
    results: list[list[Hypothesis]] = [[] for _ in range(B)]
    history = BeamHistory()

    sent = torch.arange(B, device=device)  # (Ba,) original index of each active sentence
    alive_cum = torch.zeros(B, 1, device=device)  # (Ba, k) cumulative log-prob; k = 1 before the first step
    fin_score = torch.full((B, K), float("-inf"), device=device)  # (Ba, K) the pool, best first
    fin_logprob = torch.zeros(B, K, device=device)
    fin_len = torch.zeros(B, K, dtype=torch.long, device=device)  # tokens before EOS = the step it ended at
    fin_beam = torch.zeros(B, K, dtype=torch.long, device=device)  # the beam it extended, of step fin_len - 1
    row_base, row_base_for = None, (0, 0)  # (Ba, 1) first cache row of each sentence, for (Ba, k)
    limit_steps = set(max_steps.tolist())  # one host sync up front instead of an (N, V) rewrite per step
    head = getattr(stepper, "head", None)
    top = row_top(head, logits, banned_ids, 2 * K)

    for t in range(L):
        ba, k = alive_cum.shape
        at_limit, lp = t in limit_steps, length_penalty(t + 1, alpha)
        row_lp, row_tok, eos_lp = top(logits, eos_id if at_limit else None)  # (Ba*k, c) each, c = min(2K, V)
        if at_limit:  # only at steps where some sentence reaches its length limit: EOS or nothing
            forced = (max_steps == t).repeat_interleave(k)[:, None]  # (Ba*k, 1)
            only_lp = torch.full_like(row_lp, float("-inf"))
            only_lp[:, :1] = eos_lp  # log p(EOS)
            row_lp = torch.where(forced, only_lp, row_lp)
            row_tok = torch.where(forced, torch.full_like(row_tok, eos_id), row_tok)
        c = row_lp.shape[1]
        # the 2K best extensions of each sentence are among the 2K best of each of its beams
        cand = (alive_cum.view(-1, 1) + row_lp).view(ba, k * c)  # (Ba*k, c) -> (Ba, k*c)
        padded = k * c < 2 * K
        if padded:  # tiny vocabularies: pad with impossible candidates
            cand = torch.cat([cand, cand.new_full((ba, 2 * K - k * c), float("-inf"))], dim=1)
        top_cum, top_idx = cand.topk(2 * K, dim=1)  # (Ba, 2K), best first
        if padded:
            top_idx = top_idx.clamp(max=k * c - 1)  # padding candidates point at a real one; they stay -inf
        top_beam = top_idx // c
        top_tok = row_tok.view(ba, k * c).gather(1, top_idx)
        is_eos = top_tok == eos_id

        # ---- alive: the K best candidates that do not end in EOS
        alive_cum, pos = torch.where(is_eos, float("-inf"), top_cum).topk(K, dim=1)  # (Ba, K)
        beam, tok = top_beam.gather(1, pos), top_tok.gather(1, pos)  # (Ba, K)
        history.record(tok, beam)
        if row_base_for != (ba, k):
            row_base, row_base_for = torch.arange(ba, device=device)[:, None] * k, (ba, k)
        index = (row_base + beam).view(-1)  # (Ba*K,) rows to keep

        # ---- finished: EOS candidates among this step's K best join the pool of the K best hypotheses; a
        # sentence is done when its best alive beam cannot beat the worst of its pool (a pool that is not full has
        # worst -inf, so only a sentence with no alive beam, best -inf, is done then) or at its length limit (only
        # at a limit step: sentences past theirs have left the batch)
        new_fin = is_eos[:, :K] & (top_cum[:, :K] > float("-inf"))  # (Ba, K)
        best_alive = alive_cum[:, 0] / lp
        done = _done(best_alive, fin_score, max_steps, t, at_limit)
        n_done = 0
        if int((done | new_fin.any(1)).sum()):  # the one host sync of most steps
            new_score = torch.where(new_fin, top_cum[:, :K] / lp, float("-inf"))
            fin_score, pick = torch.cat([fin_score, new_score], 1).topk(K, dim=1)  # (Ba, K)
            fin_logprob = torch.cat([fin_logprob, top_cum[:, :K]], 1).gather(1, pick)
            fin_len = torch.cat([fin_len, torch.full_like(fin_len, t)], 1).gather(1, pick)
            fin_beam = torch.cat([fin_beam, top_beam[:, :K]], 1).gather(1, pick)
            done = _done(best_alive, fin_score, max_steps, t, at_limit)  # against the updated pools
            n_done = int(done.sum())
        if n_done:
            _collect(results, history, done, sent, fin_score, fin_logprob, fin_len, fin_beam, n_best, alpha)
            if n_done == ba:
                break
            keep = (~done).nonzero().squeeze(1)  # (Ba',)
            history.renumber(keep.tolist())
            index = index.view(ba, K).index_select(0, keep).view(-1)
            sent, max_steps, alive_cum, tok = (x.index_select(0, keep) for x in (sent, max_steps, alive_cum, tok))
            fin_score, fin_logprob, fin_len, fin_beam = (
                x.index_select(0, keep) for x in (fin_score, fin_logprob, fin_len, fin_beam))
        # rows stay with their sentence unless beams were just expanded (k = 1 -> K) or sentences left;
        # either way each sentence's K rows are consecutive
        stepper.reorder(index, same_sources=k == K and not n_done, group=K)
        logits = stepper.step(tok.reshape(-1))
    return results


def _done(best_alive: Tensor, fin_score: Tensor, max_steps: Tensor, t: int, at_limit: bool) -> Tensor:
    """(Ba,) bool: sentences whose best alive score (Ba,) cannot beat the worst of their pool (Ba, K), or, at a
    step where some sentence reaches its limit (``at_limit``), whose limit ``max_steps`` (Ba,) is reached at ``t``."""
    done = best_alive <= fin_score[:, -1]
    return done | (max_steps <= t) if at_limit else done


def _collect(results: list[list[Hypothesis]], history: BeamHistory, done: Tensor, sent: Tensor, fin_score: Tensor,
             fin_logprob: Tensor, fin_len: Tensor, fin_beam: Tensor, n_best: int, alpha: float) -> None:
    """Move the best ``n_best`` finished hypotheses of the ``done`` (Ba,) sentences into ``results``, their tokens
    read back through ``history``."""
    rows = done.nonzero().squeeze(1)
    ok = fin_score[rows, :n_best].isfinite().tolist()
    lps = fin_logprob[rows, :n_best].tolist()
    lens = fin_len[rows, :n_best].tolist()
    beams = fin_beam[rows, :n_best].tolist()
    for i, (row, s) in enumerate(zip(rows.tolist(), sent[rows].tolist())):
        results[s] = [Hypothesis(tokens=history.tokens(row, beams[i][j], lens[i][j]), logprob=lps[i][j],
                                 score=lps[i][j] / length_penalty(lens[i][j] + 1, alpha))
                      for j in range(len(ok[i])) if ok[i][j]]
