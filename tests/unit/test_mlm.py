"""Tests for aiayn.data.mlm: BERT's 15% / 80-10-10 masking."""

from __future__ import annotations

import pytest
import torch

from aiayn.data.mlm import IGNORE_INDEX, mask_tokens
from aiayn.errors import AiaynError

PAD, BOS, EOS, UNK, MASK = 0, 1, 2, 3, 4
SPECIAL = {PAD, BOS, EOS, UNK, MASK}
V = 100


def _batch(seed: int = 0, B: int = 64, T: int = 512) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (B, T), generator=g)
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    ids[torch.arange(T)[None, :] >= lengths[:, None]] = PAD  # right padding
    ids[:, 0] = BOS
    return ids


def test_proportions_on_a_large_batch() -> None:
    ids = _batch()
    masked, labels = mask_tokens(
        ids, mask_id=MASK, vocab_size=V, special_ids=SPECIAL, generator=torch.Generator().manual_seed(1)
    )
    eligible = ~torch.isin(ids, torch.tensor(sorted(SPECIAL)))
    chosen = labels != IGNORE_INDEX
    n_eligible, n_chosen = int(eligible.sum()), int(chosen.sum())
    assert n_eligible > 20_000
    assert abs(n_chosen / n_eligible - 0.15) < 0.01

    as_mask = chosen & (masked == MASK)
    unchanged = chosen & (masked == ids)
    as_random = chosen & (masked != MASK) & (masked != ids)
    assert abs(int(as_mask.sum()) / n_chosen - 0.8) < 0.02
    # A random draw can equal the original token (1 in 95 here), which then counts as unchanged.
    assert abs(int(as_random.sum()) / n_chosen - 0.1 * 94 / 95) < 0.015
    assert abs(int(unchanged.sum()) / n_chosen - (0.1 + 0.1 / 95)) < 0.015
    # Random replacements are ordinary tokens, never special ids.
    assert not torch.isin(masked[as_random], torch.tensor(sorted(SPECIAL))).any()


def test_specials_never_chosen_and_labels() -> None:
    ids = _batch(seed=2)
    masked, labels = mask_tokens(
        ids, mask_id=MASK, vocab_size=V, special_ids={PAD, BOS}, generator=torch.Generator().manual_seed(3)
    )
    chosen = labels != IGNORE_INDEX
    assert not chosen[ids == PAD].any() and not chosen[ids == BOS].any()
    assert torch.equal(masked[ids == PAD], ids[ids == PAD])  # pads untouched
    assert torch.equal(labels[chosen], ids[chosen])  # labels are the original ids
    assert (labels[~chosen] == IGNORE_INDEX).all()
    assert torch.equal(masked[~chosen], ids[~chosen])  # nothing changes off the chosen positions
    assert masked.dtype == ids.dtype and masked.shape == ids.shape


def test_deterministic_with_seeded_generator() -> None:
    ids = _batch(B=8, T=64)

    def run(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        return mask_tokens(ids, mask_id=MASK, vocab_size=V, special_ids=SPECIAL, generator=g)

    a, b, c = run(5), run(5), run(6)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[1], c[1])


def test_extreme_probabilities_and_errors() -> None:
    ids = _batch(B=4, T=32)
    g = torch.Generator().manual_seed(0)
    masked, labels = mask_tokens(
        ids, mask_id=MASK, vocab_size=V, special_ids=SPECIAL, generator=g, mlm_prob=1.0
    )
    eligible = ~torch.isin(ids, torch.tensor(sorted(SPECIAL)))
    assert torch.equal(labels != IGNORE_INDEX, eligible)
    masked, labels = mask_tokens(
        ids, mask_id=MASK, vocab_size=V, special_ids=SPECIAL, generator=g, mlm_prob=0.0
    )
    assert torch.equal(masked, ids) and (labels == IGNORE_INDEX).all()
    with pytest.raises(AiaynError):
        mask_tokens(ids, mask_id=MASK, vocab_size=V, special_ids=SPECIAL, generator=g, mlm_prob=1.5)
    with pytest.raises(AiaynError, match="only special ids"):
        mask_tokens(ids, mask_id=MASK, vocab_size=5, special_ids=SPECIAL, generator=g)


def test_epoch_batches_with_a_token_budget() -> None:
    """Length-bucketed batches: every example once, padded size within the budget, at most batch_size
    examples, the same plan for the same (seed, epoch) and another plan next epoch."""
    from aiayn.tasks.mlm import epoch_batches

    lengths = [1 + (i * 7919) % 40 for i in range(300)]
    plan = epoch_batches(300, 32, seed=3, epoch=0, lengths=lengths, batch_tokens=256)
    flat = sorted(int(i) for b in plan for i in b)
    assert flat == list(range(300))
    for b in plan:
        assert len(b) <= 32 and len(b) * max(lengths[int(i)] for i in b) <= 256
    again = epoch_batches(300, 32, seed=3, epoch=0, lengths=lengths, batch_tokens=256)
    assert [b.tolist() for b in again] == [b.tolist() for b in plan]
    other = epoch_batches(300, 32, seed=3, epoch=1, lengths=lengths, batch_tokens=256)
    assert [b.tolist() for b in other] != [b.tolist() for b in plan]
    fixed = epoch_batches(300, 32, seed=3, epoch=0)
    padded = sum(len(b) * max(lengths[int(i)] for i in b) for b in fixed)
    assert sum(len(b) * max(lengths[int(i)] for i in b) for b in plan) < 0.7 * padded
    with pytest.raises(ValueError, match="one length per example"):
        epoch_batches(300, 32, seed=3, epoch=0, batch_tokens=256)
