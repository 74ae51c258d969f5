"""The one interface every decoding strategy drives: a *stepper* turns chosen tokens into next-token logits.

Greedy search, sampling and beam search never touch a model directly. They call

- ``first()``: logits (N0, V) for the first new token (seq2seq: encode the source once and feed BOS;
  decoder-only: prefill the whole prompt),
- ``step(tokens)``: feed one token per row (N,) and get logits (N, V) for the next one, using the KV cache,
- ``reorder(index)``: keep/duplicate/permute rows (N',) long: beam expansion after the first step, beam
  reordering, dropping finished sentences.

So the same search code decodes decoder-only and encoder-decoder models.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

import torch
from torch import Tensor, nn

from aiayn.models.decoder import DecoderModel
from aiayn.models.heads import LMHead
from aiayn.models.seq2seq import EncoderDecoderModel
from aiayn.nn.cache import DecoderCache


class Stepper(Protocol):
    """What a search strategy needs from a model (see the module docstring). ``head`` is the model's output layer
    where there is one model (its kernels choose beam search's candidates, :func:`aiayn.generate.choosers.row_top`),
    else None."""

    head: LMHead | None

    def first(self) -> Tensor:
        """Logits (N0, V) for the first generated token."""
        ...

    def step(self, tokens: Tensor) -> Tensor:
        """tokens (N,) long, one per row -> next-token logits (N, V)."""
        ...

    def reorder(self, index: Tensor, same_sources: bool | None = None, group: int | None = None) -> None:
        """Keep rows ``index`` (N',) long (may repeat rows, e.g. to expand to beams).

        ``same_sources=True`` promises that new row i comes from a row of the same input as old row i (beams
        reordered within their sentence); None means unknown. ``group=g`` promises that the new rows come in
        runs of g consecutive rows that share one input (a sentence's beams), so an encoder-decoder can keep
        one copy of each input's projected memory for its g rows.
        """
        ...


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Run in ``model.eval()`` (no dropout) under ``torch.inference_mode()``; restore every module's training flag.

    A model may carry a ``decoding_scope`` (a context-manager factory, set by an accelerator): the block then also
    runs inside it, a promise that the weights do not change until it ends.
    """
    training = [m for m in model.modules() if m.training]  # usually none: the model is already in eval mode
    for m in training:
        m.training = False
    scope = getattr(model, "decoding_scope", None)
    try:
        with torch.inference_mode(), (scope() if scope is not None else contextlib.nullcontext()):
            yield
    finally:
        for m in training:
            m.training = True


def lm_step(model: DecoderModel, tokens: Tensor, positions: Tensor | None, cache: DecoderCache,
            project: bool) -> Tensor:
    """One decoding step of a decoder-only model: tokens (N,) long at positions (N,) long (None: the next position
    of the cache, every row's) -> next-token logits (N, V), or the final hidden states (N, D) when not ``project``;
    the keys and values go into ``cache``."""
    at = None if positions is None else positions[:, None]
    hidden = model(tokens[:, None], positions=at, cache=cache, compute_logits=False).hidden[:, -1]
    return model.lm_head(hidden) if project else hidden


def seq2seq_step(model: EncoderDecoderModel, tokens: Tensor, src_is_token: Tensor, cache: DecoderCache) -> Tensor:
    """One decoding step of an encoder-decoder model whose cache holds the projected memory: tokens (N,) long ->
    next-token logits (N, V); ``src_is_token`` (Bm, S) bool are the memory rows' padding flags."""
    return model.decode(tokens[:, None], None, src_is_token, cache=cache).logits[:, -1]


def step_function(model: nn.Module, step: Callable[..., Tensor]) -> tuple[Callable[..., Tensor], bool]:
    """The step a stepper runs: ``step`` itself, or the compiled version a transform gave the model
    (``model.step_compiler``, :func:`aiayn.accel.compile_decoding`); and whether the cache must be static."""
    compiler = getattr(model, "step_compiler", None)
    return (step, False) if compiler is None else (compiler(step), True)


def use_room(room: int | None) -> int | None:
    """One more position in a static cache with ``room`` left (None: a cache that grows); raises when it is full."""
    if room is None:
        return None
    if room <= 0:
        raise ValueError("the static cache of the compiled decoding step is full; give the stepper a capacity of "
                         "every position it will decode")
    return room - 1


class Seq2SeqStepper:
    """Encoder-decoder stepper: encodes the source once; the decoder then runs one token at a time.

    The cross-attention keys/values are projected from the memory on the first step and kept in the cache,
    so later steps need only the source padding flags; beams share their sentence's copy (see :meth:`reorder`).

    Args:
        model: the encoder-decoder model.
        src: (B, S) source ids, right-padded with ``pad_id``.
        capacity: decoder cache capacity (max decoder steps); the cache grows if exceeded.
        bos_id: the decoder's start token.
        src_is_token: (B, S) bool, default ``src != pad_id``.
    """

    def __init__(self, model: EncoderDecoderModel, src: Tensor, capacity: int, bos_id: int = 1,
                 src_is_token: Tensor | None = None) -> None:
        self.model, self.bos_id, self.head = model, bos_id, model.lm_head
        memory, src_is_token, _ = model.encode(src, src_is_token)
        self.memory: Tensor | None = memory  # (B, S, D) until the first step projects it into the cache
        self.src_is_token = src_is_token  # (Bm, S)
        self._step, static = step_function(model, seq2seq_step)
        self.cache = model.new_cache(capacity, static)
        self.room = capacity if static else None  # a static cache's positions left (it cannot grow)
        self.group = 1  # consecutive rows per memory row: row i reads memory row i // group

    def first(self) -> Tensor:
        """Feed BOS to every sentence: logits (B, V)."""
        b = self.src_is_token.shape[0]
        bos = torch.full((b, 1), self.bos_id, dtype=torch.long, device=self.src_is_token.device)
        self.room = use_room(self.room)
        logits = self.model.decode(bos, self.memory, self.src_is_token, cache=self.cache).logits
        self.memory = None  # projected into the cross-attention cache; no longer needed
        return logits[:, -1]

    def step(self, tokens: Tensor) -> Tensor:
        """tokens (N,) -> logits (N, V)."""
        self.room = use_room(self.room)
        return self._step(self.model, tokens, self.src_is_token, self.cache)

    def reorder(self, index: Tensor, same_sources: bool | None = None, group: int | None = None) -> None:
        """Keep rows ``index`` (N',) of the cache; the projected memory follows the rows' source sentences.

        The cross-attention caches and source padding flags hold one row per source sentence in use (``Bm``),
        shared by ``group`` consecutive decoder rows. Beams reordered within their own sentence
        (``same_sources=True``) leave them alone. With ``group=g`` (runs of g rows per source, as beam search
        promises) each run keeps one memory row: K beams share one copy and fold their queries into one
        attention block per sentence. Otherwise every row gets its own memory row (group 1); ``same_sources``
        None first checks whether the sources are unchanged, which costs a host sync.
        """
        if same_sources is None and group is None:
            same_sources = (index.shape[0] == self.src_is_token.shape[0] * self.group
                            and bool((index // self.group == torch.arange(index.shape[0], device=index.device)
                                      // self.group).all()))
        if same_sources:
            self.cache.reorder(index)
            return
        group = group or 1
        memory_index = index[::group] // self.group  # (N'/g,) the memory row of each run of rows
        self.cache.reorder(index, memory_index, group)
        self.group = group
        self.src_is_token = self.src_is_token.index_select(0, memory_index)
        if self.memory is not None:
            self.memory = self.memory.index_select(0, memory_index)


class LMStepper:
    """Decoder-only stepper: prefills a left-padded prompt batch, then feeds one token per step.

    Position ids count real tokens only (``cumsum(is_token) - 1``, clamped at 0 on the padding), so a
    left-padded prompt sees the same positions as it would alone; padding keys are masked by the cache's
    key mask.

    Args:
        model: the decoder-only model.
        ids: (B, P) prompt ids, left-padded.
        is_token: (B, P) bool, False on the padding.
        capacity: cache capacity (prompt + new tokens); the cache grows if exceeded.
        prefix_lm: the prompt block is a bidirectional prefix (prefix-LM). With left padding every prompt
            ends at column P - 1, so a prefix of P columns (padding included, and masked) is each prompt.
        project: return logits (N, V). False returns the final hidden states (N, D) instead, for a chooser
            that applies the output layer itself (:func:`aiayn.generate.choosers.greedy_chooser`).
    """

    def __init__(self, model: DecoderModel, ids: Tensor, is_token: Tensor, capacity: int,
                 prefix_lm: bool = False, project: bool = True) -> None:
        self.model, self.ids, self.is_token, self.prefix_lm = model, ids, is_token, prefix_lm
        self.project, self.head = project, model.lm_head
        self._step, static = step_function(model, lm_step)
        self.cache = model.new_cache(capacity, static)
        self.room = capacity - ids.shape[1] if static else None  # a static cache's positions left (it cannot grow)
        # (B,) position id of the first new token; None for prompts without padding (one host sync a decode),
        # which take the cache's own positions: a step spends no operation on them (none stored, counted, gathered)
        self.next_pos = None if bool(is_token.all()) else is_token.long().sum(1)
        self._positions: Tensor | None = None  # (B, P) the prompt's position ids, made when its prefill starts

    def first(self) -> Tensor:
        """Prefill the prompts: logits (B, V) after the last prompt token (hidden states (B, D) when not
        ``project``)."""
        out = self.prefill(self.ids.shape[1])
        assert out is not None
        return out

    def prefill(self, columns: int) -> Tensor | None:
        """Prefill the next ``columns`` prompt columns (a long prompt in chunks, between other rows' steps): what
        :meth:`first` returns once the last column is in, else None. A prefix-LM prompt goes in one chunk."""
        b, p = self.ids.shape
        start = self.cache.length
        end = p if self.prefix_lm else min(p, start + columns)
        if start == 0:
            self._positions = None if self.next_pos is None else (self.is_token.long().cumsum(1) - 1).clamp(min=0)
        positions = None if self._positions is None else self._positions[:, start:end]  # (B, T)
        prefix_len = torch.full((b,), p, dtype=torch.long, device=self.ids.device) if self.prefix_lm else None
        out = self.model(self.ids[:, start:end], is_token=self.is_token[:, start:end], positions=positions,
                         prefix_len=prefix_len, cache=self.cache, compute_logits=False)
        return self._output(out.hidden[:, -1]) if end == p else None  # the last position only: (B, V)

    def join(self, other: LMStepper) -> None:
        """Append ``other``'s rows (prefilled, their first token chosen but not fed) after this stepper's, which
        are between steps: a batch that new requests join while it decodes (:meth:`DecoderCache.joined`)."""
        if self.project != other.project:
            raise ValueError("join steppers that return the same thing (logits, or hidden states)")
        next_pos = torch.cat([self._next_positions(), other._next_positions()])
        self.cache, self.next_pos = self.cache.joined(other.cache), next_pos

    def fill(self, slots: Tensor, other: LMStepper) -> None:
        """Put ``other``'s rows (prefilled, first token chosen) into rows ``slots`` (G,) long of this stepper, whose
        sequences have left: :meth:`DecoderCache.fill_rows`, with their next positions."""
        next_pos = self._next_positions().index_copy(0, slots, other._next_positions())
        self.cache.fill_rows(slots, other.cache)
        self.next_pos = next_pos

    def _next_positions(self) -> Tensor:
        """(B,) long: each row's next position id."""
        if self.next_pos is not None:
            return self.next_pos
        rows = self.cache.store.data.shape[1]
        return torch.full((rows,), self.cache.length, dtype=torch.long, device=self.cache.store.data.device)

    def step(self, tokens: Tensor) -> Tensor:
        """tokens (N,) -> logits (N, V) (hidden states (N, D) when not ``project``)."""
        self.room = use_room(self.room)
        if self.next_pos is None:
            return self._step(self.model, tokens, None, self.cache, self.project)
        out = self._step(self.model, tokens, self.next_pos, self.cache, self.project)
        self.next_pos = self.next_pos + 1
        return out

    def _output(self, hidden: Tensor) -> Tensor:
        """(N, D) final hidden states -> what a step returns: logits (N, V), or the states themselves."""
        return self.model.lm_head(hidden) if self.project else hidden

    def reorder(self, index: Tensor, same_sources: bool | None = None, group: int | None = None) -> None:
        """Keep rows ``index`` (N',) of the cache and the position counters (the hints are unused)."""
        self.cache.reorder(index)
        if self.next_pos is not None:
            self.next_pos = self.next_pos.index_select(0, index)
