"""The blocked per-row top-k equals torch's topk; the blocked argmax equals argmax."""

from __future__ import annotations

import pytest
import torch

from aiayn.accel.cpu.topk import MIN_BLOCKED, MIN_BLOCKED_ARGMAX, row_argmax, row_topk, row_topk_reference


@pytest.mark.parametrize("v", [MIN_BLOCKED, 8000, 8000 + 37, 50257])
@pytest.mark.parametrize("k", [1, 8])
def test_row_topk_equals_reference(v: int, k: int) -> None:
    g = torch.Generator().manual_seed(v + k)
    x = torch.randn(9, v, generator=g) * 4
    x[0, : v // 2] = float("-inf")  # masked ids, e.g. banned tokens
    x[1, -5:] += 30.0  # the best entries in the partial last block
    x[2, 100:164] += 30.0  # all of the best entries in one block
    x[3, :] = float("-inf")  # nothing allowed
    x[4, 7::64] += 30.0  # the best entries spread one per block
    values, ids = row_topk(x, k, block=64)
    ref_values, ref_ids = row_topk_reference(x, k)
    torch.testing.assert_close(values, ref_values, rtol=0, atol=0)
    assert torch.equal(ids[~values.isinf()], ref_ids[~values.isinf()])  # random floats: no ties
    torch.testing.assert_close(x.gather(1, ids), values, rtol=0, atol=0)
    assert values[3].isneginf().all()


def test_row_topk_small_rows_use_torch() -> None:
    x = torch.randn(3, MIN_BLOCKED - 1)
    for got, want in zip(row_topk(x, 4), row_topk_reference(x, 4)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("v", [4096, 8000, 8000 + 37, 50257])
def test_row_argmax_equals_argmax(v: int) -> None:
    g = torch.Generator().manual_seed(v)
    x = torch.randn(16, v, generator=g) * 4
    x[0, : v // 2] = float("-inf")  # banned ids
    x[1, -3:] = 50.0  # a tie inside the partial last block (when there is one): the first of them wins
    x[2, 300] = x[2, 301] = x[2, 1000] = 50.0  # ties within one block and across blocks
    x[3, :] = float("-inf")  # nothing allowed: argmax says 0
    x[4, :] = 0.0  # all equal
    x[5, -1] = 50.0  # the very last column
    x[6, 0] = 50.0  # the very first
    x[7, v // 128 * 128 - 1] = x[7, -1] = 50.0  # the end of the last whole block ties with the partial block
    assert x.numel() >= MIN_BLOCKED_ARGMAX  # the blocked path, not the fallback
    assert torch.equal(row_argmax(x), x.argmax(dim=-1))
    for row in x:  # one row at a time (batch-1 greedy decoding): blocked from 32768 columns up
        assert torch.equal(row_argmax(row[None]), row[None].argmax(dim=-1))


def test_row_argmax_strided_and_small_inputs() -> None:
    x = torch.randn(40, 2 * 50257)[:, ::2]  # not contiguous
    assert torch.equal(row_argmax(x), x.argmax(dim=-1))
    small = torch.randn(2, 100)  # below MIN_BLOCKED_ARGMAX: torch's argmax itself
    assert torch.equal(row_argmax(small), small.argmax(dim=-1))
