"""Byte-pair encoding (Sennrich et al., 2016) on Hugging Face ``tokenizers``.

The paper's translation models use a shared source-target BPE vocabulary of about 37,000 tokens. The
pipeline here: NFKC, every whitespace run becomes one space and the ends are stripped, then the
Metaspace pre-tokenizer marks word starts with ``▁`` (as SentencePiece does), each punctuation character
is split off into a piece of its own (``"▁zaun."`` -> ``"▁zaun"``, ``"."``; as Moses tokenization does
before BPE, so that "zaun" and "zaun." share one embedding), and BPE splits words into subwords.
Decoding reverses the Metaspace step exactly (a piece without ``▁`` joins the one before it), so
``decode(encode(x)) == normalize(x)``. Tokenizers trained before punctuation splitting existed keep
their own pipeline, which is saved with them.

The five special tokens are ordinary vocabulary entries at ids 0-4, not HF "added tokens": a literal
``"<pad>"`` typed in the input is text like any other, never the padding id.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from aiayn.errors import AiaynError
from aiayn.tokenize.base import NUM_SPECIAL, SPECIAL_TOKENS, UNK, Tokenizer, require_keys

_META = "\u2581"  # "▁", the word-start marker


def _hf_pipeline(model: models.Model, split_punctuation: bool = True) -> HFTokenizer:
    """An HF tokenizer around ``model`` with our normalizer, pre-tokenizer and decoder.

    ``split_punctuation``: isolate every Unicode punctuation character (``,.!?-'"()`` ...) after the
    Metaspace split, so BPE never merges punctuation into a word.
    """
    tok = HFTokenizer(model)
    tok.normalizer = normalizers.Sequence(
        [
            normalizers.NFKC(),
            normalizers.Replace(_META, " "),  # a literal ▁ in the text would decode as a space
            normalizers.Replace(Regex(r"\s+"), " "),
            normalizers.Strip(),
        ]
    )
    words = pre_tokenizers.Metaspace(replacement=_META, prepend_scheme="always", split=True)
    tok.pre_tokenizer = (
        pre_tokenizers.Sequence([words, pre_tokenizers.Punctuation(behavior="isolated")])
        if split_punctuation else words
    )
    tok.decoder = decoders.Metaspace(replacement=_META, prepend_scheme="always", split=True)
    return tok


def _without_added_tokens(tok: HFTokenizer) -> HFTokenizer:
    """Drop HF's added-token table so special strings in raw text are not matched as specials."""
    data = json.loads(tok.to_str())
    data["added_tokens"] = []
    return HFTokenizer.from_str(json.dumps(data))


class BPETokenizer(Tokenizer):
    """Subword tokenizer: a trained HF ``tokenizers`` BPE model behind the :class:`Tokenizer` protocol.

    ``normalize(x)`` is NFKC, whitespace runs collapsed to one space, ends stripped, ``▁`` read as a
    space, and characters never seen in training removed (they encode to ``<unk>``, which decoding
    drops).

    Args:
        hf: a Hugging Face tokenizer whose vocabulary holds the special tokens at ids 0-4.
    """

    kind = "bpe"

    def __init__(self, hf: HFTokenizer) -> None:
        for i, tok in enumerate(SPECIAL_TOKENS):
            if hf.token_to_id(tok) != i:
                raise AiaynError(
                    f"BPE vocabulary has {tok!r} at id {hf.token_to_id(tok)}, expected {i}; "
                    "the tokenizer file is corrupt or not made by aiayn: train it again"
                )
        self._hf = hf
        vocab = hf.get_vocab(with_added_tokens=False)
        self._alphabet = frozenset(t for t in vocab if len(t) == 1)
        self._size = hf.get_vocab_size(with_added_tokens=False)

    @classmethod
    def train(
        cls, texts: Iterable[str], vocab_size: int, min_frequency: int = 2, split_punctuation: bool = True
    ) -> BPETokenizer:
        """Learn BPE merges from ``texts``.

        Args:
            texts: the training corpus (for translation, source and target sentences together).
            vocab_size: the target vocabulary size, special tokens included. Every character seen
                in training gets an id even if that makes the vocabulary larger than this.
            min_frequency: a pair must occur at least this often to be merged.
            split_punctuation: keep punctuation out of merges (each punctuation character is its own
                piece); ``False`` gives the earlier pipeline, where ``"zaun."`` and ``"zaun"`` were
                different words to BPE.
        """
        if vocab_size < NUM_SPECIAL:
            raise AiaynError(
                f"vocab_size must be at least {NUM_SPECIAL} (the special tokens), got {vocab_size}"
            )
        tok = _hf_pipeline(models.BPE(unk_token=UNK), split_punctuation)
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=list(SPECIAL_TOKENS),
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(_without_added_tokens(tok))

    @property
    def vocab_size(self) -> int:
        return self._size

    def encode(self, text: str) -> list[int]:
        return self._hf.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._hf.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        ids = [int(i) for i in ids]
        for i in ids:
            self._check_id(i)
        if skip_special:
            ids = [i for i in ids if i >= NUM_SPECIAL]
        return self._hf.decode(ids, skip_special_tokens=False)

    def decode_batch(self, batch: Sequence[Sequence[int]], skip_special: bool = True) -> list[str]:
        return [self.decode(ids, skip_special=skip_special) for ids in batch]

    def token_to_id(self, token: str) -> int | None:
        return self._hf.token_to_id(token)

    def id_to_token(self, idx: int) -> str:
        self._check_id(idx)
        return self._hf.id_to_token(idx)

    def normalize(self, text: str) -> str:
        norm = self._hf.normalizer.normalize_str(text)
        keep = self._alphabet
        space_ok = _META in keep
        return "".join(c for c in norm if (space_ok if c == " " else c in keep))

    @property
    def hf(self) -> HFTokenizer:
        """The wrapped Hugging Face tokenizer (for interop; encode through this class)."""
        return self._hf

    def to_dict(self) -> dict[str, Any]:
        return {"hf_tokenizer": json.loads(self._hf.to_str())}

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<dict>") -> BPETokenizer:
        require_keys(data, ["hf_tokenizer"], source)
        try:
            hf = HFTokenizer.from_str(json.dumps(data["hf_tokenizer"]))
        except Exception as e:  # tokenizers raises a plain Exception on malformed data
            raise AiaynError(
                f"{source}: the embedded Hugging Face tokenizer is corrupt ({e}); train and save it again"
            ) from None
        return cls(hf)
