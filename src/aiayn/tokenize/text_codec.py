"""Text <-> token ids for language modeling: a tokenizer plus the line-break convention of the ``lm`` task.

BPE (and word) tokenizers collapse whitespace, which would erase line breaks; a language model trained by the
``lm`` task therefore sees each ``\\n`` written as a visible symbol (``␤``, :data:`NEWLINE_SYMBOL`) and gets it
back on decoding (:class:`TextCodec`). A checkpoint records the symbol it was trained with (``newline_symbol``
in its ``config.json``; :func:`codec_from_meta`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from aiayn.tokenize.base import Tokenizer

NEWLINE_SYMBOL = "\u2424"  # "␤", SYMBOL FOR NEWLINE


class TextCodec:
    """A tokenizer plus the task's text conventions: text <-> ids for language modeling.

    Args:
        tokenizer: the trained tokenizer.
        newline_symbol: when set, ``"\\n"`` is written as `` <symbol> `` before encoding and turned back
            into ``"\\n"`` after decoding (for tokenizers that collapse whitespace, such as BPE). Spaces
            next to a line break are not kept.
    """

    def __init__(self, tokenizer: Tokenizer, newline_symbol: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.newline_symbol = newline_symbol
        self._back = re.compile(f" ?{re.escape(newline_symbol)} ?") if newline_symbol else None

    def prepare(self, text: str) -> str:
        """The text as the tokenizer sees it (line breaks made visible when ``newline_symbol`` is set)."""
        return show_newlines(text, self.newline_symbol)

    def encode(self, text: str) -> list[int]:
        """Text -> token ids (no BOS/EOS)."""
        return self.tokenizer.encode(self.prepare(text))

    def decode(self, ids: Sequence[int]) -> str:
        """Token ids -> text (special tokens dropped, line breaks restored)."""
        text = self.tokenizer.decode(list(ids))
        return self._back.sub("\n", text) if self._back else text

    def start_ids(self) -> list[int]:
        """What an empty prompt starts from: a line break when the vocabulary has one, else EOS (the
        token that precedes a new document)."""
        ids = self.encode("\n")
        if ids and self.tokenizer.unk_id not in ids:
            return ids
        return [self.tokenizer.eos_id]


def show_newlines(text: str, symbol: str | None) -> str:
    """``text`` with each ``"\\n"`` written as `` symbol `` (unchanged when ``symbol`` is None)."""
    return text.replace("\n", f" {symbol} ") if symbol else text


def codec_from_meta(tokenizer: Tokenizer, meta: dict[str, Any]) -> TextCodec:
    """The :class:`TextCodec` of an ``lm`` checkpoint (its tokenizer and ``config.json`` entries)."""
    return TextCodec(tokenizer, meta.get("newline_symbol"))
