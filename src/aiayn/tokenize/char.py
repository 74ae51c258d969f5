"""Character-level tokenizer: one id per Unicode code point (the char-rnn / nanoGPT vocabulary)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from aiayn.errors import AiaynError
from aiayn.tokenize.base import NUM_SPECIAL, SPECIAL_TOKENS, TableTokenizer, require_keys


class CharTokenizer(TableTokenizer):
    """Maps each character to an id; the vocabulary is the special tokens, then the sorted characters.

    No normalization is applied: ``"\\n"``, tabs and runs of spaces are kept exactly. A character
    outside the vocabulary encodes to ``<unk>`` and is dropped by ``decode(skip_special=True)``, so
    :meth:`normalize` removes exactly those characters.

    Args:
        chars: the characters of the vocabulary, in id order (ids start after the special tokens).
    """

    kind = "char"
    separator = ""

    def __init__(self, chars: Sequence[str]) -> None:
        chars = list(chars)
        if any(len(c) != 1 for c in chars) or len(set(chars)) != len(chars):
            raise AiaynError("CharTokenizer needs distinct single characters; the vocabulary is corrupt")
        self._itos: list[str] = list(SPECIAL_TOKENS) + chars
        self._stoi: dict[str, int] = {c: i + NUM_SPECIAL for i, c in enumerate(chars)}

    @classmethod
    def train(cls, texts: Iterable[str]) -> CharTokenizer:
        """Build the vocabulary from every character that occurs in ``texts``, sorted by code point."""
        seen: set[str] = set()
        for t in texts:
            seen.update(t)
        return cls(sorted(seen))

    def pieces(self, text: str) -> list[str]:
        return list(text)

    def to_dict(self) -> dict[str, Any]:
        return {"chars": self._itos[NUM_SPECIAL:]}

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<dict>") -> CharTokenizer:
        require_keys(data, ["chars"], source)
        return cls(data["chars"])
