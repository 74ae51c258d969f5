"""The blocked per-row top-k and log-sum-exp equal torch's topk and logsumexp."""

from __future__ import annotations

import pytest
import torch

from aiayn.generate.topk import MIN_BLOCKED, row_top, row_top_reference


@pytest.mark.parametrize("v", [MIN_BLOCKED, 8000, 8000 + 37, 50257])
@pytest.mark.parametrize("k", [1, 8])
def test_row_top_equals_reference(v: int, k: int) -> None:
    g = torch.Generator().manual_seed(v + k)
    x = torch.randn(9, v, generator=g) * 4
    x[0, : v // 2] = float("-inf")  # masked ids, e.g. banned tokens
    x[1, -5:] += 30.0  # the best entries in the partial last block
    x[2, 100:164] += 30.0  # all of the best entries in one block
    x[3, :] = float("-inf")  # nothing allowed
    x[4, 7::64] += 30.0  # the best entries spread one per block
    values, ids, lse = row_top(x, k, block=64)
    ref_values, ref_ids, ref_lse = row_top_reference(x, k)
    torch.testing.assert_close(values, ref_values, rtol=0, atol=0)
    assert torch.equal(ids[~values.isinf()], ref_ids[~values.isinf()])  # random floats: no ties
    torch.testing.assert_close(x.gather(1, ids), values, rtol=0, atol=0)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-6, atol=1e-5)
    assert lse[3].item() == float("-inf")


def test_row_top_small_rows_use_torch() -> None:
    x = torch.randn(3, MIN_BLOCKED - 1)
    for got, want in zip(row_top(x, 4), row_top_reference(x, 4)):
        assert torch.equal(got, want)
