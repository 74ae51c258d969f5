"""The fused projection + loss equals the reference (logits, then label_smoothed_nll): values and gradients."""

from __future__ import annotations

import pytest
import torch

from aiayn.accel.cpu import fused_loss, native
from aiayn.accel.cpu.fused_loss import linear_label_smoothed_nll
from aiayn.accel.cpu.settings import SETTINGS
from aiayn.models.losses import IGNORE_INDEX, label_smoothed_nll


def _inputs(n: int = 37, d: int = 16, v: int = 29, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g, dtype=torch.float64)
    w = torch.randn(v, d, generator=g, dtype=torch.float64) * 0.5
    y = torch.randint(0, v, (n,), generator=g)
    y[::5] = IGNORE_INDEX
    return h, w, y


def _run(fn, h, w, y):
    h, w = h.clone().requires_grad_(), w.clone().requires_grad_()
    loss, nll, n = fn(h, w, y)
    (loss * 0.37).backward()  # a non-unit incoming gradient, like a per-token normalization
    return loss.detach(), nll.detach(), n, h.grad, w.grad


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
@pytest.mark.parametrize("ignore_vocab_id", [None, 0])
@pytest.mark.parametrize("chunk_rows", [None, 1, 8])
@pytest.mark.parametrize("native_kernels", ["1", "0"])
def test_fused_equals_reference(epsilon, ignore_vocab_id, chunk_rows, native_kernels, monkeypatch):
    """With the native softmax (where built) and with torch's log_softmax into a second buffer."""
    monkeypatch.setattr(SETTINGS, "native", native_kernels == "1")
    h, w, y = _inputs()
    ref = _run(lambda a, b, c: label_smoothed_nll(a @ b.T, c, epsilon, ignore_vocab_id=ignore_vocab_id), h, w, y)
    got = _run(lambda a, b, c: linear_label_smoothed_nll(a, b, c, epsilon, ignore_vocab_id, chunk_rows), h, w, y)
    for r, g in zip(ref, got):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)  # both compute in float32


def test_batched_shapes_and_frozen_weight():
    h, w, y = _inputs(n=24)
    h3, y3 = h.reshape(4, 6, -1).requires_grad_(), y.reshape(4, 6)
    loss, _, n = linear_label_smoothed_nll(h3, w, y3, 0.1)  # weight does not require grad
    loss.backward()
    ref_h = h.clone().requires_grad_()
    label_smoothed_nll(ref_h @ w.T, y, 0.1)[0].backward()
    assert int(n) == int((y != IGNORE_INDEX).sum())
    torch.testing.assert_close(h3.grad.reshape(24, -1), ref_h.grad, rtol=1e-5, atol=1e-6)


def test_no_grad_falls_back_to_reference():
    h, w, y = _inputs()
    with torch.no_grad():
        got = linear_label_smoothed_nll(h, w, y, 0.1)
    ref = label_smoothed_nll(h @ w.T, y, 0.1)
    for r, g in zip(ref, got):
        torch.testing.assert_close(g, r)


def test_bfloat16_hidden_is_close_to_float32():
    h, w, y = _inputs()
    h32, w32 = h.float().requires_grad_(), w.float().requires_grad_()
    hb = h.bfloat16().requires_grad_()
    ref = label_smoothed_nll(h32 @ w32.T, y, 0.1)[0]
    ref.backward()
    got = linear_label_smoothed_nll(hb, w32, y, 0.1)[0]
    got.backward()
    assert w32.grad.dtype == torch.float32 and hb.grad.dtype == torch.bfloat16
    assert abs(float(got.detach()) - float(ref.detach())) / float(ref.detach()) < 2e-2


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_autocast_runs_the_projection_in_bfloat16_like_a_linear_layer(epsilon):
    """Under autocast the fused loss matches the reference whose logits come from bf16 matmuls (what autocast makes
    of ``h @ W.T``), not the float32 one; float32 hidden states keep float32 gradients."""
    h, w, y = _inputs(n=64, d=32, v=300)
    h, w = h.float(), w.float()

    def bf16_logits(a, b, c):
        return label_smoothed_nll((a.bfloat16() @ b.bfloat16().T).float(), c, epsilon)

    ref_bf16 = _run(bf16_logits, h, w, y)
    ref_fp32 = _run(lambda a, b, c: label_smoothed_nll(a @ b.T, c, epsilon), h, w, y)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = _run(lambda a, b, c: linear_label_smoothed_nll(a, b, c, epsilon, chunk_rows=16), h, w, y)
    assert got[3].dtype == torch.float32 and got[4].dtype == torch.float32
    torch.testing.assert_close(got[0], ref_bf16[0], rtol=1e-5, atol=1e-4)  # the same bf16 logits
    assert abs(float(got[0] - ref_fp32[0])) > 10 * abs(float(got[0] - ref_bf16[0]))  # and not float32's
    for g, r, r32 in zip(got[3:], ref_bf16[3:], ref_fp32[3:]):  # gradients: bf16 matmuls of the same softmax,
        # rounded at other points (elementwise, cancellation makes single entries differ by more than bf16's 2^-8)
        assert float((g - r).norm() / r.norm()) < 1e-2
        assert float((g - r32).norm() / r32.norm()) < 2e-2


@pytest.mark.parametrize("bad", ["labels", "weight", "epsilon"])
def test_bad_arguments(bad):
    h, w, y = _inputs()
    with pytest.raises(ValueError, match="linear_label_smoothed_nll"):
        if bad == "labels":
            linear_label_smoothed_nll(h, w, y[:-1], 0.1)
        elif bad == "weight":
            linear_label_smoothed_nll(h, w[:, :-1], y, 0.1)
        else:
            linear_label_smoothed_nll(h, w, y, 1.0)


def test_cpu_workspace_is_reused_across_calls_and_sizes():
    """The chunk buffers outlive a call on CPU: a later, smaller call works in a view of the same memory and still
    equals the reference (nothing of the earlier call leaks into it); release_workspace frees it."""
    fused_loss.release_workspace()
    big = _inputs(n=40, v=53, seed=1)
    _run(lambda a, b, c: linear_label_smoothed_nll(a.float(), b.float(), c, 0.1), *big)
    first = fused_loss._cpu_workspace.buffers[torch.float32]
    chunks = 1 if native.library() is not None else 2  # the logits, and their log-softmax without the native kernel
    assert first.numel() == chunks * int((big[2] != IGNORE_INDEX).sum()) * 53  # for the counted rows only
    small = _inputs(n=9, v=29, seed=2)
    ref = _run(lambda a, b, c: label_smoothed_nll(a.float() @ b.float().T, c, 0.1), *small)
    got = _run(lambda a, b, c: linear_label_smoothed_nll(a.float(), b.float(), c, 0.1), *small)
    for r, g in zip(ref, got):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)
    assert fused_loss._cpu_workspace.buffers[torch.float32] is first
    fused_loss.release_workspace()
    assert fused_loss._cpu_workspace.buffers is None


def test_second_backward_is_a_clear_error():
    """backward hands its precomputed gradients over (scaled in place, so autograd need not copy them): a second
    backward through the same loss has nothing left and says so rather than returning wrong gradients."""
    h, w, y = (t.requires_grad_() if t.is_floating_point() else t for t in _inputs())
    loss = linear_label_smoothed_nll(h, w, y, 0.1)[0]
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward ran twice"):
        loss.backward()


def test_gradient_accumulation_over_two_losses_equals_the_reference():
    """Two micro-batches into the same .grad (the in-place hand-over must not alias one call's gradient into the
    next)."""
    h, w, y = _inputs(n=30)
    grads = []
    for fn in (lambda a, b, c: label_smoothed_nll(a @ b.T, c, 0.1)[0],
               lambda a, b, c: linear_label_smoothed_nll(a, b, c, 0.1)[0]):
        wr = w.clone().requires_grad_()
        for part in (slice(0, 15), slice(15, 30)):
            (fn(h[part], wr, y[part]) * 0.5).backward()
        grads.append(wr.grad)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-6)
