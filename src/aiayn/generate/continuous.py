"""Continuous batching: sequences join a running decode at step boundaries and leave it when they end.

A server's requests arrive while others decode. :class:`ContinuousBatch` keeps one :class:`LMStepper` of every
running sequence and, at each :meth:`~ContinuousBatch.step`:

1. drops the rows of sequences that ended or were cancelled (one ``reorder`` of the cache);
2. admits waiting sequences (up to ``max_batch`` rows): their prompts are prefilled as one left-padded batch of
   their own, at most ``prefill_chunk`` columns a step, so that a long prompt does not stall the rows already
   decoding; when the prefill is done each new row chooses its first token and the batch joins the running one
   (:meth:`LMStepper.join`: the shorter rows right-aligned, their first positions masked);
3. feeds every running row its last token through the core's decoding step and chooses each row's next token.

Each row is the same computation as the sequence decoded alone by :func:`aiayn.generate.generate` (its own
positions, its keys masked from the other rows), with the same chooser: greedy through the model's
``greedy_chooser`` (the accelerator's screened argmax included), sampling through :func:`make_sampler` with the
sequence's own generator, so a seeded request draws the same tokens alone and beside others. Only the float rounding
of batched products can differ, which moves a token only at a near tie.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from aiayn.generate.choosers import greedy_chooser
from aiayn.generate.lm import left_pad
from aiayn.generate.sampling import make_sampler
from aiayn.generate.steppers import LMStepper, eval_mode
from aiayn.models.decoder import DecoderModel
from aiayn.models.heads import next_scores


@dataclass
class Continuation:
    """One sequence to continue, and where its tokens go.

    Attributes:
        prompt: the prompt's token ids (non-empty).
        max_new_tokens: the most tokens to produce (stop ids excluded).
        stop_ids: ids that end it (not produced).
        greedy: take the most likely token; else sample with ``temperature``, ``top_k``, ``top_p`` and ``seed``.
        logprobs: also report each chosen token's log-probability and the ``logprobs`` most likely alternatives
            (None: none).
        on_token: called with each new token id, its log-probability (None unless ``logprobs`` is set) and the
            top alternatives as [(id, logprob), ...].
        on_end: called once with the reason it ended: "stop" (a stop id), "length" or "cancelled".
    """

    prompt: Sequence[int]
    max_new_tokens: int
    stop_ids: frozenset[int] = frozenset()
    greedy: bool = True
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    logprobs: int | None = None
    on_token: Callable[[int, float | None, list[tuple[int, float]]], None] = lambda token, lp, top: None
    on_end: Callable[[str], None] = lambda reason: None
    tokens: list[int] = field(default_factory=list)
    cancelled: bool = False
    ended: bool = False
    _choose: Callable[[Tensor], Tensor] | None = None


class ContinuousBatch:
    """Decodes many :class:`Continuation` s in one batch that they join and leave (see the module docstring).

    Not thread-safe: one thread calls :meth:`add` (or hands sequences to that thread), :meth:`cancel` and
    :meth:`step`.

    Args:
        model: a decoder-only model (its KV cache addressed by position: no sliding window, no compiled step).
        pad_id: the padding id.
        banned_ids: ids never produced, as :func:`aiayn.generate.generate` bans them (the padding id, unless it is
            also a stop id).
        max_batch: the most rows decoding at once.
        prefill_chunk: the most prompt columns prefilled per step.
    """

    def __init__(self, model: DecoderModel, pad_id: int, banned_ids: Sequence[int] = (), max_batch: int = 16,
                 prefill_chunk: int = 512) -> None:
        if model.config.sliding_window is not None or getattr(model, "step_compiler", None) is not None:
            raise ValueError("continuous batching needs a KV cache addressed by position: no sliding window and no "
                             "compiled decoding step")
        self.model, self.pad_id = model, pad_id
        self.max_batch, self.prefill_chunk = max_batch, prefill_chunk
        self.device = next(model.parameters()).device
        self.waiting: list[Continuation] = []
        self.rows: list[Continuation | None] = []  # the batch's rows in cache order; None: a free row
        self._stepper: LMStepper | None = None
        self._last: Tensor | None = None  # (rows,) each running row's last token, fed at the next step
        self._lengths: list[int] = []  # each running row's cached positions (prompt + fed tokens)
        self._prefill: tuple[list[Continuation], LMStepper] | None = None  # a batch being prefilled
        self.banned_ids = tuple(banned_ids)
        self._greedy = greedy_chooser(model.lm_head, self.banned_ids)
        self._scope: contextlib.ExitStack | None = None  # eval_mode, held while the batch is busy

    def add(self, seq: Continuation) -> None:
        """Queue ``seq``; it joins the batch at a coming step."""
        if not seq.prompt:
            raise ValueError("a prompt needs at least one token")
        if seq.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        self.waiting.append(seq)

    def cancel(self, seq: Continuation) -> None:
        """Stop ``seq``: it leaves the batch at the next step (its ``on_end`` gets "cancelled")."""
        seq.cancelled = True

    @property
    def running(self) -> int:
        """Sequences decoding now."""
        return sum(s is not None for s in self.rows)

    @property
    def queued(self) -> int:
        """Sequences added that are not yet decoding: waiting, or being prefilled."""
        prefilling = self._prefill
        return len(self.waiting) + (len(prefilling[0]) if prefilling else 0)

    @property
    def busy(self) -> bool:
        """Whether anything is waiting, prefilling or decoding."""
        return bool(self.waiting or self.running or self._prefill)

    def step(self) -> None:
        """One step of the batch: retire, admit or prefill, then decode one token of every running row.

        The model stays in :func:`eval_mode` from the step that finds work until the one that leaves the batch
        empty: its weights count as frozen for that stretch (the accelerator keeps its per-shape choices), so change
        them only while the batch is idle."""
        if self._scope is None:
            self._scope = contextlib.ExitStack()
            self._scope.enter_context(eval_mode(self.model))
        try:
            self._retire()
            self._admit()
            if self.rows:
                self._decode()
            self._retire()
        except BaseException:
            self._close_scope()
            raise
        if not self.busy:
            self._close_scope()

    def _close_scope(self) -> None:
        if self._scope is not None:
            scope, self._scope = self._scope, None
            scope.close()

    def abandon(self, reason: str) -> None:
        """End every sequence, waiting, prefilling or decoding, with ``reason`` (the model failed), and start empty."""
        pending = [s for s in self.rows if s is not None] + self.waiting + (self._prefill[0] if self._prefill else [])
        self.rows, self.waiting, self._prefill = [], [], None
        self._stepper, self._last, self._lengths = None, None, []
        self._close_scope()
        for seq in pending:
            if not seq.ended:
                self._end(seq, reason)

    # ---------------------------------------------------------------------------------------------- the parts
    def _admit(self) -> None:
        """Start prefilling waiting sequences (when none is prefilling), or prefill the next chunk; a finished
        prefill chooses its rows' first tokens and takes the rows of sequences that left, or joins the batch."""
        if self._prefill is None:
            self.waiting = [s for s in self.waiting if not self._end_if_cancelled(s)]
            room = self.max_batch - self.running
            if room <= 0 or not self.waiting:
                return
            group, self.waiting = self.waiting[:room], self.waiting[room:]
            ids, is_token = left_pad([list(s.prompt) for s in group], self.pad_id, self.device)
            capacity = ids.shape[1] + max(s.max_new_tokens for s in group)
            self._prefill = group, LMStepper(self.model, ids, is_token, capacity, project=False)
        group, stepper = self._prefill
        hidden = stepper.prefill(self.prefill_chunk)
        if hidden is None:
            return
        self._prefill = None
        first = self._choose(group, hidden)
        width = stepper.ids.shape[1]  # each new row's span of cache columns: its group's width (+ fed tokens)
        free = [i for i, s in enumerate(self.rows) if s is None]
        if self._stepper is None:
            self._stepper, self._last, self._lengths, self.rows = stepper, first, [width] * len(group), list(group)
        elif len(free) >= len(group) and width <= self._stepper.cache.length:  # into rows that left: no copy
            slots = free[:len(group)]
            index = torch.tensor(slots, dtype=torch.long, device=self.device)
            self._stepper.fill(index, stepper)
            self._last = self._last.index_copy(0, index, first)
            for i, seq in zip(slots, group):
                self.rows[i], self._lengths[i] = seq, width
        else:
            self._compact()
            self._stepper.join(stepper)
            self._last = torch.cat([self._last, first])
            self._lengths = self._lengths + [width] * len(group)
            self.rows = self.rows + list(group)

    def _decode(self) -> None:
        """Feed every row its last token (a free row pad, its result unread); choose the next."""
        hidden = self._stepper.step(self._last)
        self._lengths = [n + 1 for n in self._lengths]
        self._last = self._choose(self.rows, hidden)

    def _choose(self, rows: list[Continuation | None], hidden: Tensor) -> Tensor:
        """hidden (N, D) of ``rows`` -> (N,) tokens: greedy rows through the model's chooser, sampled ones through
        their own samplers; every token reported, and the rows that end marked (free and ended rows get pad)."""
        tokens = torch.full((len(rows),), self.pad_id, dtype=torch.long, device=hidden.device)
        live = [(i, s) for i, s in enumerate(rows) if s is not None and not s.ended]
        greedy = [i for i, s in live if s.greedy]
        sampled = [i for i, s in live if not s.greedy]
        wants_logprobs = [i for i, s in live if s.logprobs is not None]
        if greedy:
            tokens[greedy] = self._greedy(hidden[greedy])
        logits = {}
        needs_logits = sorted(set(sampled) | set(wants_logprobs))
        if needs_logits:
            scores = next_scores(self.model.lm_head(hidden[needs_logits]), self.banned_ids)  # (n, V)
            logits = {i: scores[j:j + 1] for j, i in enumerate(needs_logits)}
        for i in sampled:
            tokens[i] = self._sampler(rows[i])(logits[i])[0]
        chosen = tokens.tolist()
        for i, seq in live:
            token = chosen[i]
            lp, top = None, []
            if seq.logprobs is not None:
                logp = logits[i][0].float().log_softmax(-1)
                lp = float(logp[token])
                if seq.logprobs:
                    values, ids = logp.topk(seq.logprobs)
                    top = list(zip(ids.tolist(), values.tolist()))
            self._report(seq, token, lp, top)
        return tokens

    def _sampler(self, seq: Continuation) -> Callable[[Tensor], Tensor]:
        if seq._choose is None:
            generator = None if seq.seed is None else torch.Generator(device=self.device).manual_seed(seq.seed)
            seq._choose = make_sampler(seq.temperature, seq.top_k, seq.top_p, generator)
        return seq._choose

    def _report(self, seq: Continuation, token: int, lp: float | None, top: list[tuple[int, float]]) -> None:
        """Hand ``token`` to ``seq`` or end it (a stop id); end it at its length limit."""
        if seq.cancelled:
            self._end(seq, "cancelled")
        elif token in seq.stop_ids:
            self._end(seq, "stop")
        else:
            seq.tokens.append(token)
            seq.on_token(token, lp, top)
            if len(seq.tokens) >= seq.max_new_tokens:
                self._end(seq, "length")

    def _end(self, seq: Continuation, reason: str) -> None:
        seq.ended = True
        seq.on_end(reason)

    def _end_if_cancelled(self, seq: Continuation) -> bool:
        if seq.cancelled and not seq.ended:
            self._end(seq, "cancelled")
        return seq.cancelled

    def _retire(self) -> None:
        """Free the rows of sequences that ended or were cancelled (new sequences take them; the batch is compacted
        once most of its rows are free) and forget cache positions that only they used."""
        ended = False
        for i, seq in enumerate(self.rows):
            if seq is not None and (seq.ended or self._end_if_cancelled(seq)):
                self.rows[i], ended = None, True
        if not ended:
            return
        if self.running == 0:
            self.rows, self._stepper, self._last, self._lengths = [], None, None, []
            return
        if 2 * self.running <= len(self.rows):
            self._compact()
        unused = self._stepper.cache.length - max(n for n, s in zip(self._lengths, self.rows) if s is not None)
        if unused > 0:
            self._stepper.cache.drop_front(unused)

    def _compact(self) -> None:
        """Drop the free rows from the cache (one copy of its filled part)."""
        keep = [i for i, s in enumerate(self.rows) if s is not None]
        if len(keep) == len(self.rows):
            return
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        self._stepper.reorder(index)
        self.rows = [self.rows[i] for i in keep]
        self._last = self._last.index_select(0, index)
        self._lengths = [self._lengths[i] for i in keep]
