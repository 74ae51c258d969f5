"""Beam search's backpointer history spells out every beam's tokens exactly as gathered token buffers do, through
sentences leaving the batch."""

from __future__ import annotations

import torch

from aiayn.generate.beam import BeamHistory


def test_backpointers_spell_the_same_tokens_as_gathered_buffers() -> None:
    g = torch.Generator().manual_seed(0)
    B, K, steps = 6, 3, 9
    history = BeamHistory()
    buffers = torch.zeros(B, 1, 0, dtype=torch.long)  # (rows, k, t): each alive beam's tokens, gathered per step
    k = 1
    for t in range(steps):
        rows = buffers.shape[0]
        parents = torch.randint(0, k, (rows, K), generator=g)
        tokens = torch.randint(3, 50, (rows, K), generator=g)
        history.record(tokens, parents)
        buffers = torch.cat([buffers.gather(1, parents[:, :, None].expand(rows, K, t)), tokens[:, :, None]], 2)
        k = K
        for row in range(rows):  # every beam of every active sentence, at every length up to now
            for beam in range(K):
                assert history.tokens(row, beam, t + 1) == buffers[row, beam].tolist()
                assert history.tokens(row, beam, 0) == []
        if t in (2, 5) and rows > 1:  # sentences leave the batch: keep some rows, in order
            keep = sorted(torch.randperm(rows, generator=g)[:rows - 2].tolist()) or [0]
            history.renumber(keep)
            buffers = buffers[keep]


def test_a_prefix_follows_the_parents_of_the_step_it_ended_at() -> None:
    """A hypothesis that ended at step t extends a beam of step t - 1: its tokens are that beam's."""
    history = BeamHistory()
    history.record(torch.tensor([[7, 8]]), torch.tensor([[0, 0]]))
    history.record(torch.tensor([[9, 10]]), torch.tensor([[1, 0]]))  # beam 0 extends 8, beam 1 extends 7
    history.record(torch.tensor([[11, 12]]), torch.tensor([[1, 1]]))
    assert history.tokens(0, 0, 2) == [8, 9]
    assert history.tokens(0, 1, 2) == [7, 10]
    assert history.tokens(0, 0, 3) == [7, 10, 11]
