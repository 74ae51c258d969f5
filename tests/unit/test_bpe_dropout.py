"""BPE-dropout: plain BPE at p = 0 (equal to Hugging Face's), the documented drop rate, and every epoch's
segmentation a pure function of (seed, epoch) so resumed runs see the same data."""

from __future__ import annotations

import random

import pytest

from aiayn.data.synthetic import generate_corpus
from aiayn.errors import AiaynError
from aiayn.tokenize.bpe import BPETokenizer
from aiayn.tokenize.bpe_dropout import BPEDropoutEncoder, merge_ranks, segment_word


@pytest.fixture(scope="module")
def texts() -> list[str]:
    c = generate_corpus(400, 10, 10, seed=5)
    return [s for s, _ in c["train"]] + [t for _, t in c["train"]]


@pytest.fixture(scope="module")
def tok(texts: list[str]) -> BPETokenizer:
    return BPETokenizer.train(texts, vocab_size=300)


def test_p0_equals_hugging_face_bpe(tok: BPETokenizer, texts: list[str]) -> None:
    unseen = ["Der  Hund, ÿ sieht\tden Ball!", "ünïcödé qqq zzz", "▁odd marker", ""]
    sample = texts[:300] + unseen
    prepared = BPEDropoutEncoder(tok, 0.0, seed=1).prepare(sample)
    assert prepared.encode_epoch(0) == tok.encode_batch(sample)
    assert prepared.encode_epoch(7) == tok.encode_batch(sample)


def test_segments_concatenate_back_and_vary(tok: BPETokenizer, texts: list[str]) -> None:
    ranks = merge_ranks(tok)
    enc = BPEDropoutEncoder(tok, 0.1, seed=1)
    rng = random.Random(0)
    words = sorted({w for t in texts[:200] for w in enc.words(t)})
    varied = 0
    for w in words:
        plain = segment_word(w, ranks, 0.0, rng)
        seen = {tuple(segment_word(w, ranks, 0.1, rng)) for _ in range(30)}
        assert all("".join(s) == w for s in seen)
        assert all(len(s) >= len(plain) for s in seen)  # dropping merges never makes fewer pieces here
        varied += len(seen) > 1
    assert varied > len(words) // 2


def test_a_single_merge_is_dropped_at_rate_p(tok: BPETokenizer) -> None:
    ranks = merge_ranks(tok)
    (left, right), _ = min(ranks.items(), key=lambda kv: kv[1])  # the first merge: its word has one step
    word = left + right
    assert segment_word(word, ranks, 0.0, random.Random(0)) == [word]
    pool = BPEDropoutEncoder(tok, 0.25, seed=3, samples=4000).pool(word)
    unmerged = sum(len(s) == 2 for s in pool) / len(pool)
    assert unmerged == pytest.approx(0.25, abs=0.03)


def test_each_epoch_is_a_function_of_seed_and_epoch(tok: BPETokenizer, texts: list[str]) -> None:
    enc = BPEDropoutEncoder(tok, 0.1, seed=1)
    a = enc.prepare(texts)
    other_order = BPEDropoutEncoder(tok, 0.1, seed=1)
    other_order.prepare(list(reversed(texts)))
    assert all(enc.pool(w) == other_order.pool(w) for w in enc.words(" ".join(texts[:50])))  # per-word seeds
    fresh = BPEDropoutEncoder(tok, 0.1, seed=1).prepare(texts)
    assert a.encode_epoch(3) == fresh.encode_epoch(3)
    assert a.encode_epoch(3) != a.encode_epoch(4)
    assert a.encode_epoch(3, salt=0) != a.encode_epoch(3, salt=1)
    other_seed = BPEDropoutEncoder(tok, 0.1, seed=2).prepare(texts)
    assert a.encode_epoch(3) != other_seed.encode_epoch(3)
    longer = sum(map(len, a.encode_epoch(3))) / sum(map(len, tok.encode_batch(texts)))
    assert 1.0 < longer < 1.6


@pytest.mark.parametrize("p", [-0.1, 1.0])
def test_bad_probability_is_a_clear_error(tok: BPETokenizer, p: float) -> None:
    with pytest.raises(AiaynError, match=r"BPE dropout must be in \[0, 1\)"):
        BPEDropoutEncoder(tok, p, seed=1)
