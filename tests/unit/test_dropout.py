"""The fast CPU dropout against torch's: drop rate, scaling, gradient, seeding, identity cases."""

import pytest
import torch
import torch.nn.functional as F

from aiayn.nn.dropout import Dropout, drop_mask, dropout, keep_scale


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.9])
def test_drop_rate_matches_p(p):
    torch.manual_seed(0)
    n = 1 << 20
    rate = drop_mask((n,), p).float().mean().item()
    assert abs(rate - p) < 4 * (p * (1 - p) / n) ** 0.5 + 1 / 65536  # within 4 standard errors


def test_mask_has_no_structure_across_the_four_uniforms_of_a_word():
    # each 64-bit word feeds four neighbouring positions: they must drop independently and at the same rate
    torch.manual_seed(1)
    m = drop_mask((1 << 18, 4), 0.3).float()  # column j = j-th 16-bit piece of each word
    rates = m.mean(0)
    assert torch.all((rates - 0.3).abs() < 0.005), rates
    both = (m[:, 0] * m[:, 3]).mean().item()  # P(drop a and drop b) = 0.09 when independent
    assert abs(both - 0.09) < 0.003


def test_odd_shapes_and_scaling_match_torch_statistics():
    torch.manual_seed(2)
    x = torch.ones(3, 5, 7)  # numel not a multiple of 4
    y = dropout(x, 0.25)
    kept = y[y != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 1 / 0.75))
    big = torch.randn(512, 512)
    mean_ours = dropout(big, 0.3).mean().item()
    mean_torch = F.dropout(big, 0.3, True).mean().item()
    assert abs(mean_ours - big.mean().item()) < 0.01 and abs(mean_torch - big.mean().item()) < 0.01


def test_gradient_is_the_mask_times_the_scale():
    torch.manual_seed(3)
    x = torch.randn(64, 33, requires_grad=True)
    y = dropout(x, 0.4)
    y.sum().backward()
    expected = (y != 0).float() / 0.6
    torch.testing.assert_close(x.grad, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_multiplier_matches_the_mask_and_the_masked_fill_reference(dtype):
    # the multiplier (the fast path) and the bool mask are the same draws: dropout(x) == x.masked_fill(mask) / (1-p)
    x = torch.randn(37, 129).to(dtype)
    torch.manual_seed(5)
    mask = drop_mask(x.shape, 0.3)
    torch.manual_seed(5)
    scale = keep_scale(x.shape, 0.3, dtype)
    assert scale.dtype == dtype and torch.equal(scale == 0, mask)
    torch.manual_seed(5)
    y = dropout(x, 0.3)
    assert torch.equal(y, x.masked_fill(mask, 0.0) * scale.max())


def test_same_seed_same_mask_and_eval_is_identity():
    x = torch.randn(100, 10)
    torch.manual_seed(4)
    a = dropout(x, 0.3)
    torch.manual_seed(4)
    b = dropout(x, 0.3)
    assert torch.equal(a, b)
    layer = Dropout(0.3).eval()
    assert layer(x) is x
    assert dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))


def test_bad_probability_is_a_clear_error():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        dropout(torch.ones(3), 1.5)
