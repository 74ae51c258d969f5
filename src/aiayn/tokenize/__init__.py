"""Tokenizers: BPE (Hugging Face `tokenizers`), character and word level, and pretrained vocabularies, behind
one protocol.

The trainable tokenizers share the special ids ``<pad>=0 <s>=1 </s>=2 <unk>=3 <mask>=4``; a pretrained
vocabulary (:class:`PretrainedTokenizer`, read from a transformers tokenizer folder) keeps its model's own
special tokens and ids. Every kind saves to one JSON file and loads back with :func:`load_tokenizer`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from aiayn.errors import AiaynError
from aiayn.tokenize.base import (
    BOS,
    BOS_ID,
    EOS,
    EOS_ID,
    MASK,
    MASK_ID,
    NUM_SPECIAL,
    PAD,
    PAD_ID,
    SPECIAL_TOKENS,
    UNK,
    UNK_ID,
    Tokenizer,
    checkpoint_tokenizer,
    load_tokenizer,
    parse_tokenizer,
)
from aiayn.tokenize.bpe import BPETokenizer
from aiayn.tokenize.char import CharTokenizer
from aiayn.tokenize.pretrained import PretrainedTokenizer
from aiayn.tokenize.word import WordTokenizer

TOKENIZER_KINDS: tuple[str, ...] = ("bpe", "char", "word")
DEFAULT_BPE_VOCAB_SIZE = 8000
_OPTIONS: dict[str, set[str]] = {
    "bpe": {"min_frequency", "split_punctuation"}, "char": set(), "word": {"min_frequency"},
}


def training_options(section: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword options of :func:`train_tokenizer` that a recipe's ``[tokenizer]`` section sets for its kind.

    ``{"kind": "bpe", "vocab_size": 8000, "min_frequency": 2, "split_punctuation": True, "joint": True}``
    gives ``{"min_frequency": 2, "split_punctuation": True}``; for ``"char"`` it gives ``{}``.
    """
    return {k: section[k] for k in sorted(_OPTIONS.get(section["kind"], ())) if k in section}


def train_tokenizer(kind: str, texts: Iterable[str], vocab_size: int | None = None, **kw: Any) -> Tokenizer:
    """Train a tokenizer of the given kind.

    Args:
        kind: ``"bpe"``, ``"char"`` or ``"word"``.
        texts: the training corpus.
        vocab_size: total vocabulary size, special tokens included. BPE: the target size (default
            8000). Word: keeps the ``vocab_size - 5`` most frequent words (default: all). Char:
            ignored (the vocabulary is every character seen).
        **kw: passed on to the kind's ``train`` (``min_frequency`` for BPE and word,
            ``split_punctuation`` for BPE).

    Raises:
        AiaynError: unknown kind (the message lists the valid ones), or a bad ``vocab_size``.
    """
    if kind not in TOKENIZER_KINDS:
        raise AiaynError(f"unknown tokenizer kind {kind!r}; choose one of {', '.join(TOKENIZER_KINDS)}")
    bad = sorted(set(kw) - _OPTIONS[kind])
    if bad:
        raise AiaynError(
            f"tokenizer kind {kind!r} takes no option(s) {bad}; it accepts {sorted(_OPTIONS[kind]) or 'none'}"
        )
    if kind == "bpe":
        size = DEFAULT_BPE_VOCAB_SIZE if vocab_size is None else vocab_size
        return BPETokenizer.train(texts, vocab_size=size, **kw)
    if kind == "char":
        return CharTokenizer.train(texts)
    if vocab_size is not None and vocab_size < NUM_SPECIAL:
        raise AiaynError(f"vocab_size must be at least {NUM_SPECIAL} (the special tokens), got {vocab_size}")
    max_size = None if vocab_size is None else vocab_size - NUM_SPECIAL
    return WordTokenizer.train(texts, max_size=max_size, **kw)


__all__ = [
    "BOS",
    "BOS_ID",
    "DEFAULT_BPE_VOCAB_SIZE",
    "EOS",
    "EOS_ID",
    "MASK",
    "MASK_ID",
    "NUM_SPECIAL",
    "PAD",
    "PAD_ID",
    "SPECIAL_TOKENS",
    "TOKENIZER_KINDS",
    "UNK",
    "UNK_ID",
    "BPETokenizer",
    "CharTokenizer",
    "PretrainedTokenizer",
    "Tokenizer",
    "WordTokenizer",
    "checkpoint_tokenizer",
    "load_tokenizer",
    "parse_tokenizer",
    "train_tokenizer",
    "training_options",
]
