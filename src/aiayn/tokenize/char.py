"""Character-level tokenizer: one id per Unicode code point (the char-rnn / nanoGPT vocabulary)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from aiayn.errors import AiaynError
from aiayn.tokenize.base import NUM_SPECIAL, SPECIAL_TOKENS, UNK_ID, Tokenizer, require_keys


class CharTokenizer(Tokenizer):
    """Maps each character to an id; the vocabulary is the special tokens, then the sorted characters.

    No normalization is applied: ``"\\n"``, tabs and runs of spaces are kept exactly. A character
    outside the vocabulary encodes to ``<unk>`` and is dropped by ``decode(skip_special=True)``, so
    :meth:`normalize` removes exactly those characters.

    Args:
        chars: the characters of the vocabulary, in id order (ids start after the special tokens).
    """

    kind = "char"

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

    @property
    def vocab_size(self) -> int:
        return len(self._itos)

    def encode(self, text: str) -> list[int]:
        get = self._stoi.get
        return [get(c, UNK_ID) for c in text]

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        itos, out = self._itos, []
        for i in ids:
            i = int(i)
            if 0 <= i < NUM_SPECIAL and skip_special:
                continue
            self._check_id(i)
            out.append(itos[i])
        return "".join(out)

    def token_to_id(self, token: str) -> int | None:
        if token in SPECIAL_TOKENS:
            return SPECIAL_TOKENS.index(token)
        return self._stoi.get(token)

    def id_to_token(self, idx: int) -> str:
        self._check_id(idx)
        return self._itos[idx]

    def normalize(self, text: str) -> str:
        stoi = self._stoi
        return "".join(c for c in text if c in stoi)

    def to_dict(self) -> dict[str, Any]:
        return {"chars": self._itos[NUM_SPECIAL:]}

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<dict>") -> CharTokenizer:
        require_keys(data, ["chars"], source)
        return cls(data["chars"])
