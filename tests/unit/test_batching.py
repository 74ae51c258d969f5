"""Token-budget batching, fixed-size batching, seq2seq collation and padding accounting."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from aiayn.data.batching import (
    IGNORE_INDEX,
    collate_seq2seq,
    fixed_size_batches,
    padding_fraction,
    token_budget_batches,
)
from aiayn.errors import AiaynError

LENGTHS = st.one_of(
    st.lists(st.integers(0, 60), max_size=200),
    st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)), max_size=200),
)


def _key(ln: int | tuple[int, int]) -> int:
    return max(max(ln) if isinstance(ln, tuple) else ln, 1)


@settings(max_examples=150, deadline=None)
@given(
    lengths=LENGTHS,
    max_tokens=st.integers(1, 300),
    seed=st.integers(0, 10),
    epoch=st.integers(0, 5),
    shuffle=st.booleans(),
    bucket_width=st.integers(1, 8),
)
def test_token_budget_invariants(
    lengths: list, max_tokens: int, seed: int, epoch: int, shuffle: bool, bucket_width: int
) -> None:
    kw = dict(seed=seed, epoch=epoch, shuffle=shuffle, bucket_width=bucket_width)
    batches = token_budget_batches(lengths, max_tokens, **kw)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(lengths)))  # every index exactly once
    assert all(batches)
    for b in batches:
        padded = len(b) * max(_key(lengths[i]) for i in b)
        assert padded <= max_tokens or len(b) == 1  # only a lone oversized example may exceed it
    assert token_budget_batches(lengths, max_tokens, **kw) == batches  # deterministic


def test_epochs_and_seeds_differ_but_reproduce() -> None:
    rng = random.Random(0)
    lengths = [(rng.randint(3, 40), rng.randint(3, 40)) for _ in range(2000)]
    e0 = token_budget_batches(lengths, 500, seed=1, epoch=0)
    assert token_budget_batches(lengths, 500, seed=1, epoch=0) == e0
    assert token_budget_batches(lengths, 500, seed=1, epoch=1) != e0
    assert token_budget_batches(lengths, 500, seed=2, epoch=0) != e0
    # the batch order is shuffled, not shortest-first
    firsts = [max(lengths[b[0]]) for b in e0]
    assert firsts != sorted(firsts)


def test_no_shuffle_is_sorted_and_seed_free() -> None:
    lengths = [5, 1, 3, 3, 9, 2]
    batches = token_budget_batches(lengths, 6, seed=0, epoch=0, shuffle=False)
    assert batches == [[1, 5], [2, 3], [0], [4]]  # 4 is longer than the budget: alone, last
    assert token_budget_batches(lengths, 6, seed=7, epoch=3, shuffle=False) == batches


def test_oversized_error_and_max_batch_size() -> None:
    with pytest.raises(AiaynError, match="example 1 is 9 tokens long, more than max_tokens=6"):
        token_budget_batches([2, 9], 6, seed=0, epoch=0, oversized="error")
    batches = token_budget_batches([1] * 10, 100, seed=0, epoch=0, max_batch_size=4)
    assert sorted(len(b) for b in batches) == [2, 4, 4]
    with pytest.raises(AiaynError, match="max_tokens"):
        token_budget_batches([1], 0, seed=0, epoch=0)


def test_fixed_size_batches() -> None:
    batches = fixed_size_batches(10, 4, seed=3, epoch=0)
    assert [len(b) for b in batches] == [4, 4, 2]
    assert sorted(i for b in batches for i in b) == list(range(10))
    assert fixed_size_batches(10, 4, seed=3, epoch=0) == batches
    assert fixed_size_batches(10, 4, seed=3, epoch=1) != batches
    assert fixed_size_batches(5, 2, seed=0, epoch=0, shuffle=False) == [[0, 1], [2, 3], [4]]


def test_bucketing_pads_less_than_fixed_batches() -> None:
    rng = random.Random(0)
    independent = [(rng.randint(2, 50), rng.randint(2, 50)) for _ in range(3000)]
    src_lens = [rng.randint(3, 40) for _ in range(3000)]
    translation_like = [(s, max(1, round(1.1 * s + rng.gauss(0, 2)))) for s in src_lens]
    single = [rng.randint(1, 100) for _ in range(3000)]
    for lengths, factor in ((independent, 0.5), (translation_like, 0.2), (single, 0.1)):
        budget = token_budget_batches(lengths, 1000, seed=0, epoch=0)
        fixed = fixed_size_batches(len(lengths), len(lengths) // len(budget), seed=0, epoch=0)
        p_budget, p_fixed = padding_fraction(budget, lengths), padding_fraction(fixed, lengths)
        assert p_budget < factor * p_fixed, (p_budget, p_fixed)
        wide = token_budget_batches(lengths, 1000, seed=0, epoch=0, bucket_width=8)
        assert padding_fraction(wide, lengths) < p_fixed
    wide = token_budget_batches(single, 1000, seed=0, epoch=0, bucket_width=8)
    assert padding_fraction(token_budget_batches(single, 1000, seed=0, epoch=0), single) < padding_fraction(
        wide, single
    )


def test_padding_fraction_by_hand() -> None:
    assert padding_fraction([[0, 1]], [2, 4]) == pytest.approx(1 - 6 / 8)
    # pairs: source 2+4 of 2*4 cells, target 3+3 of 2*3 cells -> 12 real of 14
    assert padding_fraction([[0], [0, 1]], [(2, 3), (4, 3)]) == pytest.approx(1 - (5 + 12) / (5 + 14))
    assert padding_fraction([], [1]) == 0.0


def test_collate_seq2seq_by_hand() -> None:
    batch = collate_seq2seq([[5, 6, 7], [8]], [[9, 10], [11, 12, 13]], pad_id=0, bos_id=1, eos_id=2)
    assert set(batch) == {"src", "tgt_in", "labels", "n_tokens"}
    assert batch["src"].dtype == batch["tgt_in"].dtype == batch["labels"].dtype == torch.long
    assert batch["src"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["tgt_in"].tolist() == [[1, 9, 10, 0], [1, 11, 12, 13]]
    assert batch["labels"].tolist() == [[9, 10, 2, IGNORE_INDEX], [11, 12, 13, 2]]
    assert batch["n_tokens"] == 7
    assert IGNORE_INDEX == -100


def test_collate_edge_cases() -> None:
    batch = collate_seq2seq([[]], [[]], pad_id=0, bos_id=1, eos_id=2)
    assert batch["src"].tolist() == [[0]]
    assert batch["tgt_in"].tolist() == [[1]] and batch["labels"].tolist() == [[2]] and batch["n_tokens"] == 1
    with pytest.raises(AiaynError, match="empty batch"):
        collate_seq2seq([], [], 0, 1, 2)
    with pytest.raises(AiaynError, match="2 sources but 1 targets"):
        collate_seq2seq([[1], [2]], [[3]], 0, 1, 2)
