"""BPE-dropout (Provilkov et al., 2020): subword regularization by skipping merges at random.

While training, every merge candidate of a word is dropped with probability ``p`` at every merge step,
so the same text reaches the model split into different subwords from epoch to epoch (``"▁sitting"``
is usually one token, sometimes ``"▁sit" "ting"`` or ``"▁s" "it" "ting"``). Validation, decoding and
evaluation use the ordinary deterministic segmentation. With ``p = 0`` the segmentation here is
exactly the Hugging Face BPE model's (tests hold them equal).

Two levels, side by side:

* :func:`segment_word` is the algorithm written plainly: repeatedly merge the lowest-ranked adjacent
  pair (leftmost on ties) among the pairs that survive this step's coin flips; stop when none does.
* :class:`BPEDropoutEncoder` makes it cheap enough to re-segment a corpus every epoch. For each distinct
  word it draws ``samples`` segmentations once (from a generator seeded by the run seed and the word),
  and each epoch picks one of them per occurrence with a generator seeded by ``(seed, epoch)``. Every
  epoch's token ids are therefore a pure function of ``(seed, epoch)``, so a resumed run sees exactly
  the data of an uninterrupted one. (Hugging Face's own ``BPE(dropout=...)`` draws from an unseeded
  generator, which would break that.)
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence

import numpy as np

from aiayn.errors import AiaynError
from aiayn.tokenize.bpe import BPETokenizer

DEFAULT_SAMPLES = 32


def merge_ranks(tokenizer: BPETokenizer) -> dict[tuple[str, str], int]:
    """The BPE model's merge table: ``(left, right) -> rank`` (lower ranks merge first)."""
    model = json.loads(tokenizer.hf.to_str())["model"]
    ranks: dict[tuple[str, str], int] = {}
    for rank, merge in enumerate(model["merges"]):
        left, right = merge.split(" ") if isinstance(merge, str) else merge
        ranks.setdefault((left, right), rank)
    return ranks


def segment_word(word: str, ranks: dict[tuple[str, str], int], p: float, rng: random.Random) -> list[str]:
    """Split one pre-tokenized word (e.g. ``"▁sitting"``) into subword strings with BPE-dropout.

    Args:
        word: a word as the pre-tokenizer yields it (word-start marker included).
        ranks: the merge table from :func:`merge_ranks`.
        p: probability of dropping each merge candidate at each step; 0 gives plain BPE.
        rng: the random generator for the coin flips (unused when ``p == 0``).

    Returns:
        The subword strings, which concatenate back to ``word``.
    """
    parts = list(word)
    while len(parts) > 1:
        best, best_rank = -1, 0
        for i in range(len(parts) - 1):
            rank = ranks.get((parts[i], parts[i + 1]))
            # Only a candidate that would win needs its coin flipped: the minimum over the surviving
            # candidates has the same distribution as flipping every coin.
            if rank is not None and (best < 0 or rank < best_rank) and not (p > 0 and rng.random() < p):
                best, best_rank = i, rank
        if best < 0:
            break
        parts[best : best + 2] = [parts[best] + parts[best + 1]]
    return parts


class BPEDropoutEncoder:
    """Re-segments a fixed training corpus with BPE-dropout, deterministically per ``(seed, epoch)``.

    Args:
        tokenizer: the trained BPE tokenizer (its deterministic encoding is what ``p = 0`` gives).
        p: merge-dropout probability in ``[0, 1)``; Provilkov et al. use 0.1.
        seed: run seed; with the epoch it fixes every segmentation.
        samples: segmentations drawn per distinct word, from which each occurrence picks one.
    """

    def __init__(self, tokenizer: BPETokenizer, p: float, *, seed: int, samples: int = DEFAULT_SAMPLES) -> None:
        if not 0.0 <= p < 1.0:
            raise AiaynError(f"BPE dropout must be in [0, 1), got {p}; 0.1 is the usual value")
        if samples < 1:
            raise AiaynError(f"BPE-dropout samples must be >= 1, got {samples}")
        self.tokenizer, self.p, self.seed, self.samples = tokenizer, p, seed, samples
        self._ranks = merge_ranks(tokenizer)
        self._vocab = tokenizer.hf.get_vocab(with_added_tokens=False)
        self._unk = tokenizer.unk_id
        self._pools: dict[str, list[list[int]]] = {}

    def words(self, text: str) -> list[str]:
        """``text`` normalized and pre-tokenized as the tokenizer does: ``"A cat"`` -> ``["▁A", "▁cat"]``."""
        hf = self.tokenizer.hf
        return [w for w, _ in hf.pre_tokenizer.pre_tokenize_str(hf.normalizer.normalize_str(text))]

    def _ids(self, parts: list[str]) -> list[int]:
        return [self._vocab.get(s, self._unk) for s in parts]

    def pool(self, word: str) -> list[list[int]]:
        """The ``samples`` token-id segmentations drawn for ``word`` (drawn on first use, then kept)."""
        got = self._pools.get(word)
        if got is None:
            if self.p == 0:
                got = [self._ids(segment_word(word, self._ranks, 0.0, random.Random(0)))]
            else:
                rng = random.Random(f"aiayn-bpe-dropout:{self.seed}:{word}")
                got = [self._ids(segment_word(word, self._ranks, self.p, rng)) for _ in range(self.samples)]
            self._pools[word] = got
        return got

    def prepare(self, texts: Sequence[str]) -> PreparedCorpus:
        """Pre-tokenize ``texts`` once and draw the segmentation pools of all their words."""
        word_ids: dict[str, int] = {}
        sentence_words = []
        for text in texts:
            sentence_words.append([word_ids.setdefault(w, len(word_ids)) for w in self.words(text)])
        pools = [self.pool(w) for w in word_ids]
        return PreparedCorpus(self, sentence_words, pools)


class PreparedCorpus:
    """A corpus ready for per-epoch BPE-dropout: each sentence as word indices into per-word pools."""

    def __init__(self, encoder: BPEDropoutEncoder, sentence_words: list[list[int]],
                 pools: list[list[list[int]]]) -> None:
        self.encoder, self.sentence_words, self.pools = encoder, sentence_words, pools

    def encode_epoch(self, epoch: int, salt: int = 0) -> list[list[int]]:
        """Every sentence's token ids for ``epoch``, a pure function of ``(seed, epoch, salt)``.

        Args:
            epoch: the training epoch.
            salt: distinguishes corpora that share an encoder and seed (e.g. 0 source, 1 target).

        Returns:
            One list of token ids per sentence (no BOS/EOS), in corpus order.
        """
        n_words = sum(len(s) for s in self.sentence_words)
        rng = np.random.default_rng([self.encoder.seed, epoch, salt])
        picks = rng.integers(0, 1 << 30, size=n_words).tolist()
        pools = self.pools
        out, k = [], 0
        for words in self.sentence_words:
            ids: list[int] = []
            for w in words:
                pool = pools[w]
                ids.extend(pool[picks[k] % len(pool)])
                k += 1
            out.append(ids)
        return out
