"""Word-level tokenizer: NFKC, split on whitespace, punctuation split off as its own tokens."""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from aiayn.errors import AiaynError
from aiayn.tokenize.base import NUM_SPECIAL, SPECIAL_TOKENS, TableTokenizer, require_keys

#: a word is a run of letters/digits/underscore; every other non-space character is a token by itself
WORD_PATTERN = r"\w+|[^\w\s]"
_TOKEN_RE = re.compile(WORD_PATTERN)


def split_words(text: str) -> list[str]:
    """Split NFKC-normalized ``text`` into words and single punctuation characters.

    ``"Hello, world!" -> ["Hello", ",", "world", "!"]``; ``"don't" -> ["don", "'", "t"]``.
    """
    return _TOKEN_RE.findall(unicodedata.normalize("NFKC", text))


class WordTokenizer(TableTokenizer):
    """One id per word of a fixed vocabulary; other words encode to ``<unk>``.

    Decoding joins tokens with single spaces, so ``normalize("Hi, you!") == "Hi , you !"``; words
    outside the vocabulary are dropped by ``normalize`` and by ``decode(skip_special=True)``.

    Args:
        words: the vocabulary (without special tokens), in id order starting after the specials.
    """

    kind = "word"
    separator = " "

    def __init__(self, words: Sequence[str]) -> None:
        words = list(words)
        if len(set(words)) != len(words) or any(w in SPECIAL_TOKENS or not w for w in words):
            raise AiaynError(
                "WordTokenizer needs distinct, non-empty, non-special words; the vocabulary is corrupt"
            )
        self._itos: list[str] = list(SPECIAL_TOKENS) + words
        self._stoi: dict[str, int] = {w: i + NUM_SPECIAL for i, w in enumerate(words)}

    @classmethod
    def train(
        cls, texts: Iterable[str], max_size: int | None = None, min_frequency: int = 1
    ) -> WordTokenizer:
        """Keep the words seen at least ``min_frequency`` times, most frequent first.

        Args:
            texts: the training corpus, one string per sentence/document.
            max_size: keep at most this many words (special tokens not counted); None keeps all.
            min_frequency: drop words seen fewer times than this.

        Ties in frequency are broken alphabetically, so training is deterministic.
        """
        if max_size is not None and max_size < 0:
            raise AiaynError(f"max_size must be >= 0, got {max_size}")
        counts: Counter[str] = Counter()
        for t in texts:
            counts.update(split_words(t))
        items = sorted((w, n) for w, n in counts.items() if n >= min_frequency and w not in SPECIAL_TOKENS)
        items.sort(key=lambda wn: -wn[1])  # stable: alphabetical within equal counts
        words = [w for w, _ in items]
        return cls(words if max_size is None else words[:max_size])

    def pieces(self, text: str) -> list[str]:
        return split_words(text)

    def to_dict(self) -> dict[str, Any]:
        return {"words": self._itos[NUM_SPECIAL:]}

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<dict>") -> WordTokenizer:
        require_keys(data, ["words"], source)
        return cls(data["words"])
