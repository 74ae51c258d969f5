"""The fast CPU dropout against torch's: drop rate, scaling, gradient, seeding, identity cases; both CPU paths
(aiayn's native kernel, and the PyTorch one it falls back to), and the native kernel against its reference."""

import pytest
import torch
import torch.nn.functional as F

from aiayn import native
from aiayn.nn.dropout import Dropout, drop_mask, dropout, keep_scale

HAS_NATIVE = native.library() is not None


@pytest.fixture(params=["torch", "native"])
def cpu_path(request, monkeypatch):
    """Run a test on each CPU path of :func:`dropout`: ``AIAYN_NATIVE=0`` pins the PyTorch one."""
    if request.param == "native" and not HAS_NATIVE:
        pytest.skip(f"native kernels not built: {native.build_error}")
    if request.param == "torch":
        monkeypatch.setenv(native.ENV_VAR, "0")
    return request.param


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


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_rate_matches_p_on_each_path(cpu_path, p):
    torch.manual_seed(0)
    n = 1 << 20
    rate = (dropout(torch.ones(n), p) == 0).float().mean().item()
    assert abs(rate - p) < 4 * (p * (1 - p) / n) ** 0.5 + 1 / 65536


def test_odd_shapes_and_scaling_match_torch_statistics(cpu_path):
    torch.manual_seed(2)
    x = torch.ones(3, 5, 7)  # numel not a multiple of 4
    y = dropout(x, 0.25)
    kept = y[y != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 1 / 0.75))
    big = torch.randn(512, 512)
    mean_ours = dropout(big, 0.3).mean().item()
    mean_torch = F.dropout(big, 0.3, True).mean().item()
    assert abs(mean_ours - big.mean().item()) < 0.01 and abs(mean_torch - big.mean().item()) < 0.01


def test_gradient_is_the_mask_times_the_scale(cpu_path):
    torch.manual_seed(3)
    x = torch.randn(64, 33, requires_grad=True)
    y = dropout(x, 0.4)
    g = torch.randn_like(y)
    y.backward(g)
    expected = (y != 0).float() / 0.6 * g
    torch.testing.assert_close(x.grad, expected)
    assert 0.3 < (y == 0).float().mean().item() < 0.5


def test_gradient_of_a_non_contiguous_input(cpu_path):
    torch.manual_seed(6)
    x = torch.randn(40, 24, requires_grad=True)
    y = dropout(x.t(), 0.5)  # (24, 40), a transposed view
    g = torch.randn(24, 40).t().contiguous().t()  # and a non-contiguous gradient
    y.backward(g)
    torch.testing.assert_close(x.grad, ((y != 0).float() * 2 * g).t())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_multiplier_matches_the_mask_and_the_masked_fill_reference(dtype, monkeypatch):
    monkeypatch.setenv(native.ENV_VAR, "0")  # the PyTorch path
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


def test_same_seed_same_mask_and_eval_is_identity(cpu_path):
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


@pytest.mark.skipif(not HAS_NATIVE, reason="native kernels not built")
@pytest.mark.parametrize("n,p,seed", [(1, 0.5, 0), (7, 0.3, 1), (4096, 0.1, 2**64 - 1), (50_001, 0.9, 123456789)])
def test_native_dropout_equals_its_reference(n, p, seed):
    x = torch.randn(n)
    torch.testing.assert_close(native.dropout(x, p, seed), native.dropout_reference(x, p, seed))
    y = x.clone()
    native.dropout(y, p, seed, out=y)  # in place
    torch.testing.assert_close(y, native.dropout_reference(x, p, seed))


@pytest.mark.skipif(not HAS_NATIVE, reason="native kernels not built")
def test_native_draws_have_no_structure_across_a_word_or_between_seeds():
    ones = torch.ones(1 << 18, 4)  # column j = j-th 16-bit piece of each word
    m = (native.dropout(ones, 0.3, 42) == 0).float()
    assert torch.all((m.mean(0) - 0.3).abs() < 0.005), m.mean(0)
    assert abs((m[:, 0] * m[:, 3]).mean().item() - 0.09) < 0.003
    m2 = (native.dropout(ones, 0.3, 43) == 0).float()  # the next seed: independent, not shifted
    assert abs((m * m2).mean().item() - 0.09) < 0.003
    assert abs((m[1:] * m2[:-1]).mean().item() - 0.09) < 0.003


@pytest.mark.skipif(not HAS_NATIVE, reason="native kernels not built")
def test_native_mask_does_not_depend_on_the_thread_count():
    x = torch.randn(1 << 16)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = native.dropout(x, 0.2, 7)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, native.dropout(x, 0.2, 7))


def test_non_contiguous_input_is_refused_by_the_native_kernel():
    with pytest.raises(ValueError, match="contiguous"):
        native.dropout(torch.ones(4, 6).t(), 0.1, 0)
