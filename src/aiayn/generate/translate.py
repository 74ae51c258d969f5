"""Translation with an encoder-decoder model: beam search (the paper's decoding) and greedy search.

Paper section 6.1: "We used beam search with a beam size of 4 and length penalty alpha = 0.6 ... We set the
maximum output length during inference to input length + 50, but terminate early when possible."
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from torch import Tensor

from aiayn.errors import AiaynError
from aiayn.generate.beam import beam_search
from aiayn.generate.common import Hypothesis, length_penalty
from aiayn.generate.ensemble import EnsembleStepper
from aiayn.generate.sampling import decode_loop, greedy_choice
from aiayn.generate.steppers import Seq2SeqStepper, Stepper, eval_mode
from aiayn.models.seq2seq import EncoderDecoderModel
from aiayn.tokenize import Tokenizer
from aiayn.tokenize.pretrained import PretrainedTokenizer

Models = EncoderDecoderModel | Sequence[EncoderDecoderModel]
#: a recipe's [decode] section, and a checkpoint's decoding settings, where they name nothing
DECODE_DEFAULTS: dict[str, Any] = {"beam": 4, "alpha": 0.6, "max_len_a": 1.0, "max_len_b": 50}


def seq2seq_models(model: object) -> list[EncoderDecoderModel]:
    """One model or a sequence of them (an ensemble) -> a non-empty list of encoder-decoder models with one
    target vocabulary; anything else is a clear error."""
    models = list(model) if isinstance(model, (list, tuple)) else [model]
    if not models:
        raise AiaynError("translation needs at least one model")
    for m in models:
        if not isinstance(m, EncoderDecoderModel):
            raise AiaynError(f"translation needs an encoder-decoder model, got {type(m).__name__}; "
                             "use aiayn.generate.generate() for decoder-only models")
    vocab = {m.config.target_vocab_size for m in models}
    if len(vocab) > 1:
        raise AiaynError(f"ensemble members have different target vocabularies {sorted(vocab)}; "
                         "ensemble only models trained with the same tokenizer")
    return models


def banned_output_ids(pad_id: int, bos_id: int | None, eos_id: int, vocab_size: int | None = None,
                      output_size: int | None = None) -> list[int]:
    """The ids a translation never outputs: pad and BOS (when the vocabulary has one), never EOS (a vocabulary
    may pad with EOS, or start its decoder from EOS); and, when the model's output layer has more rows
    (``output_size``) than the tokenizer has tokens (``vocab_size``; T5: 32128 rows for 32100 tokens), the ids
    from ``vocab_size`` on, which no token has."""
    special = sorted({pad_id, bos_id} - {eos_id, None})  # type: ignore[operator]  # None removed
    if vocab_size is None or output_size is None or output_size <= vocab_size:
        return special
    return [*(i for i in special if i < vocab_size), *range(vocab_size, output_size)]


class _ForcedFirst:
    """A stepper whose decoder input starts with ``start_id`` and then ``token_id`` (BART models trained to begin
    every output with BOS: transformers' ``forced_bos_token_id``): ``first()`` feeds both and returns the logits
    after the second. The forced token is a prefix of the decoder's input, not part of the output: it is outside
    the output budget and adds nothing to the log-probability (transformers scores it 0)."""

    def __init__(self, stepper: Stepper, token_id: int) -> None:
        self.inner, self.token_id = stepper, token_id
        self.head = getattr(stepper, "head", None)

    def first(self) -> Tensor:
        logits = self.inner.first()  # (B, V)
        return self.inner.step(torch.full((logits.shape[0],), self.token_id, dtype=torch.long, device=logits.device))

    def step(self, tokens: Tensor) -> Tensor:
        return self.inner.step(tokens)

    def reorder(self, index: Tensor, same_sources: bool | None = None, group: int | None = None) -> None:
        self.inner.reorder(index, same_sources, group)


@contextmanager
def _decoding(models: list[EncoderDecoderModel], src: Tensor, budget: Tensor, start_id: int,
              pad_id: int, forced_first_id: int | None = None) -> Iterator[Stepper]:
    """Every model in eval mode under inference mode, and one stepper over all of them (B, S) -> (B, V), whose
    decoder input begins with ``forced_first_id`` after the start token when one is given."""
    with ExitStack() as stack:
        for m in models:
            stack.enter_context(eval_mode(m))
        capacity = int(budget.max()) + 1 + (forced_first_id is not None)
        steppers = [Seq2SeqStepper(m, src, capacity=capacity, bos_id=start_id, src_is_token=src != pad_id)
                    for m in models]
        stepper: Stepper = steppers[0] if len(steppers) == 1 else EnsembleStepper(steppers)
        yield stepper if forced_first_id is None else _ForcedFirst(stepper, forced_first_id)


def _budget(models: list[EncoderDecoderModel], src: Tensor, max_len_a: float, max_len_b: int, pad_id: int,
            forced_first_id: int | None) -> Tensor:
    """:func:`max_output_lengths`, one token fewer for models with absolute positions when a forced first token
    takes one of their ``max_len`` decoder positions."""
    budget = max_output_lengths(models, src, max_len_a, max_len_b, pad_id)
    if forced_first_id is not None:
        for m in models:
            if m.config.position in ("sinusoidal", "learned"):
                budget = budget.clamp(max=max(m.config.max_len - 2, 0))
    return budget


def _banned(models: list[EncoderDecoderModel], pad_id: int, bos_id: int | None, eos_id: int,
            vocab_size: int | None) -> list[int]:
    return banned_output_ids(pad_id, bos_id, eos_id, vocab_size, models[0].config.target_vocab_size)


def max_output_lengths(model: Models, src: Tensor, max_len_a: float, max_len_b: int,
                       pad_id: int) -> Tensor:
    """Per-sentence output budget ``floor(a * src_len + b)`` tokens (EOS excluded).

    Models with absolute positions (sinusoidal, learned) are capped at ``max_len - 1`` tokens, since the
    decoder input (BOS + tokens) must fit in ``max_len`` positions (for an ensemble, every member's).

    Args:
        src: (B, S) right-padded source ids.
    Returns:
        (B,) long.
    """
    src_len = (src != pad_id).sum(1).double()
    budget = torch.floor(max_len_a * src_len + max_len_b).long().clamp(min=0)
    for m in seq2seq_models(model):
        if m.config.position in ("sinusoidal", "learned"):
            budget = budget.clamp(max=m.config.max_len - 1)
    return budget


def source_limit(model: Models) -> int:
    """The most source tokens a model (every member of an ensemble) takes: its ``max_len``; translation cuts
    longer sources to this."""
    return min(m.config.max_len for m in seq2seq_models(model))


def max_output_length(model: Models, src_len: int, max_len_a: float, max_len_b: int) -> int:
    """The output budget (EOS excluded) of one source sentence of ``src_len`` tokens, as
    :func:`max_output_lengths` gives it."""
    src = torch.ones(1, src_len, dtype=torch.long)  # (1, S), no padding
    return int(max_output_lengths(model, src, max_len_a, max_len_b, pad_id=0)[0])


def _start(start_id: int | None, bos_id: int | None) -> int:
    if start_id is not None:
        return start_id
    if bos_id is None:
        raise AiaynError("the target vocabulary has no BOS token; pass start_id (the tokenizer's decoder_start_id)")
    return bos_id


def translate(
    model: Models,
    src: Tensor,
    *,
    beam_size: int = 4,
    alpha: float = 0.6,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    n_best: int = 1,
    bos_id: int | None = 1,
    eos_id: int = 2,
    pad_id: int = 0,
    start_id: int | None = None,
    vocab_size: int | None = None,
    forced_first_id: int | None = None,
) -> list[list[Hypothesis]]:
    """Beam-search translation of a batch of source sentences (all sentences x beams as one batch).

    Args:
        model: an encoder-decoder model (put in eval mode for the call, then restored), or a sequence of them
            with one target vocabulary: an ensemble, decoding with the mean of their next-token distributions
            (:class:`~aiayn.generate.ensemble.EnsembleStepper`).
        src: (B, S) long source ids, right-padded with ``pad_id``.
        beam_size: K (the paper: 4). ``beam_size=1`` gives exactly :func:`greedy_translate`.
        alpha: GNMT length penalty ``((5 + |Y|) / 6) ** alpha`` (the paper: 0.6).
        max_len_a, max_len_b: at most ``a * src_len + b`` output tokens per sentence (the paper: a=1, b=50).
        n_best: hypotheses per sentence, best first (<= beam_size).
        bos_id, eos_id, pad_id: the target vocabulary's special ids (``tokenizer.bos_id`` ...); PAD and BOS are
            never produced (``bos_id=None``: the vocabulary has no BOS).
        start_id: the decoder's first input token (``tokenizer.decoder_start_id``: T5 and Marian start from pad,
            BART from EOS); None: ``bos_id``.
        vocab_size: the target tokenizer's vocabulary size (``tokenizer.vocab_size``): ids from it on, which a
            model's output layer padded past the vocabulary has (T5: 32128 rows for 32100 tokens), are never
            produced; None: every id of the output layer may be.
        forced_first_id: a token the decoder's input carries after ``start_id`` before any output (BART models with
            ``forced_bos_token_id``: BOS); it is not part of the hypotheses, their budget or their scores.
    Returns:
        For each sentence, a list of up to ``n_best`` :class:`Hypothesis`, best first.
    """
    models = seq2seq_models(model)
    if beam_size < 1:
        raise AiaynError(f"beam_size={beam_size} must be >= 1")
    if not 1 <= n_best <= beam_size:
        raise AiaynError(f"n_best={n_best} must be between 1 and beam_size={beam_size}; raise beam_size")
    if vocab_size is not None and beam_size > vocab_size:
        raise AiaynError(f"beam_size={beam_size} is more than the {vocab_size} tokens of the target vocabulary; use a "
                         f"beam of at most {vocab_size}")
    if not math.isfinite(alpha):
        raise AiaynError(f"alpha={alpha} must be a finite number (the length penalty's exponent, e.g. 0.6)")
    if src.shape[0] == 0:
        return []
    budget = _budget(models, src, max_len_a, max_len_b, pad_id, forced_first_id)
    with _decoding(models, src, budget, _start(start_id, bos_id), pad_id, forced_first_id) as stepper:
        return beam_search(stepper, budget, beam_size=beam_size, alpha=alpha, n_best=n_best, eos_id=eos_id,
                           banned_ids=_banned(models, pad_id, bos_id, eos_id, vocab_size))


def greedy_translate(
    model: Models,
    src: Tensor,
    *,
    alpha: float = 0.6,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    bos_id: int | None = 1,
    eos_id: int = 2,
    pad_id: int = 0,
    start_id: int | None = None,
    vocab_size: int | None = None,
    forced_first_id: int | None = None,
) -> list[Hypothesis]:
    """Greedy translation: the most likely token at every step, until EOS or the length limit.

    Args:
        model: an encoder-decoder model, or a sequence of them (an ensemble, as in :func:`translate`).
        src: (B, S) long source ids, right-padded with ``pad_id``.
        alpha: only for the reported score (``logprob / lp``), so it compares with beam search's.
        max_len_a, max_len_b: at most ``a * src_len + b`` output tokens per sentence (then EOS is forced).
        bos_id, eos_id, pad_id, start_id, vocab_size, forced_first_id: as in :func:`translate`.
    Returns:
        One :class:`Hypothesis` per sentence.
    """
    models = seq2seq_models(model)
    if src.shape[0] == 0:
        return []
    budget = _budget(models, src, max_len_a, max_len_b, pad_id, forced_first_id)
    with _decoding(models, src, budget, _start(start_id, bos_id), pad_id, forced_first_id) as stepper:
        tokens, lengths, logprob = decode_loop(stepper, greedy_choice, budget, stop_ids=(eos_id,),
                                               force_stop_id=eos_id,
                                               banned_ids=_banned(models, pad_id, bos_id, eos_id, vocab_size),
                                               pad_id=pad_id)
    out = []
    for row, n, lp in zip(tokens.tolist(), lengths.tolist(), logprob.tolist()):
        out.append(Hypothesis(tokens=row[:n], score=lp / length_penalty(n + 1, alpha), logprob=lp))
    return out


def source_ids(tok: Tokenizer, text: str, limit: int | None = None) -> list[int]:
    """A source sentence's ids as the model reads them, at most ``limit`` of them (None: all).

    A pretrained vocabulary frames the text as its model was trained on (:meth:`PretrainedTokenizer.encode_with_special
    <aiayn.tokenize.pretrained.PretrainedTokenizer.encode_with_special>`: T5 and Marian ``... </s>``, BART ``<s> ...
    </s>``, as transformers' tokenizer does); a longer source keeps that framing and loses its last text tokens (as
    transformers' truncation does). The built-in tokenizers' sources carry no BOS or EOS (as in training: only the
    target is framed), so their sources are the plain ``encode`` cut to ``limit``.
    """
    if not isinstance(tok, PretrainedTokenizer):
        ids = tok.encode(text)
        return ids if limit is None else ids[:limit]
    framed = tok.encode_with_special(text)
    if limit is None or len(framed) <= limit:
        return framed
    raw = tok.encode(text)
    extra = len(framed) - len(raw)  # the framing tokens
    for p in range(extra + 1):
        if framed[p:p + len(raw)] == raw:
            return [*framed[:p], *raw[:max(0, limit - extra)], *framed[p + len(raw):]]
    return framed[:limit]
