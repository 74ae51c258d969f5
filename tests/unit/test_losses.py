"""Label-smoothed loss: equals PyTorch's, ignores padding, and makes accumulation exact."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from aiayn.models.losses import count_targets, label_smoothed_nll


def _labels(shape: tuple[int, ...], vocab: int, gen: torch.Generator) -> torch.Tensor:
    labels = torch.randint(0, vocab, shape, generator=gen)
    labels[torch.rand(shape, generator=gen) < 0.3] = -100
    return labels


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("shape", [(13,), (3, 7)])
def test_matches_torch_cross_entropy(eps: float, shape: tuple[int, ...]) -> None:
    gen = torch.Generator().manual_seed(0)
    vocab = 17
    logits = torch.randn(*shape, vocab, generator=gen, dtype=torch.float64) * 3
    labels = _labels(shape, vocab, gen)
    loss, nll, n = label_smoothed_nll(logits, labels, eps)
    flat_logits, flat_labels = logits.reshape(-1, vocab), labels.reshape(-1)
    ref = F.cross_entropy(flat_logits.float(), flat_labels, label_smoothing=eps, reduction="sum")
    ref_nll = F.cross_entropy(flat_logits.float(), flat_labels, reduction="sum")
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(nll, ref_nll, rtol=1e-6, atol=1e-6)
    assert int(n) == int((labels != -100).sum()) == count_targets(labels)


def test_padding_never_counts_and_none_reduction() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 5, 9, generator=gen)
    labels = torch.tensor([[1, 2, 3, -100, -100], [4, 5, 6, 7, 8]])
    changed = logits.clone()
    changed[0, 3:] = 1e4 * torch.randn(2, 9, generator=gen)  # garbage at padded positions
    a = label_smoothed_nll(logits, labels, 0.1)
    b = label_smoothed_nll(changed, labels, 0.1)
    torch.testing.assert_close(a[0], b[0])
    per_tok, per_nll, n = label_smoothed_nll(logits, labels, 0.1, reduction="none")
    assert per_tok.shape == labels.shape and int(n) == 8
    assert torch.all(per_tok[0, 3:] == 0) and torch.all(per_nll[0, 3:] == 0)
    torch.testing.assert_close(per_tok.sum(), a[0])


def test_ignore_vocab_id_gives_pad_no_smoothing_mass() -> None:
    gen = torch.Generator().manual_seed(2)
    vocab, pad, eps = 6, 0, 0.2
    logits = torch.randn(4, vocab, generator=gen, dtype=torch.float64)
    labels = torch.tensor([1, 2, 5, -100])
    loss, _, _ = label_smoothed_nll(logits, labels, eps, ignore_vocab_id=pad)
    # Explicit target distribution: (1 - eps) one-hot + eps / (V - 1) on every class except pad.
    target = torch.full((3, vocab), eps / (vocab - 1), dtype=torch.float64)
    target[:, pad] = 0.0
    target[torch.arange(3), labels[:3]] += 1 - eps
    expected = -(target * F.log_softmax(logits[:3], dim=-1)).sum()
    torch.testing.assert_close(loss.double(), expected, rtol=1e-6, atol=1e-6)
    plain, _, _ = label_smoothed_nll(logits, labels, eps)
    assert not torch.isclose(plain, loss)


def test_accumulating_variable_length_batches_equals_their_union() -> None:
    """Sum-loss / total tokens over k micro-batches == one batch holding all their rows."""
    gen = torch.Generator().manual_seed(3)
    vocab, d = 7, 5
    model = nn.Linear(d, vocab).double()
    lengths = [[3, 6], [2], [5, 1, 4]]  # three micro-batches of different sizes and lengths
    batches = []
    for lens in lengths:
        t = max(lens)
        x = torch.randn(len(lens), t, d, generator=gen, dtype=torch.float64)
        y = torch.randint(0, vocab, (len(lens), t), generator=gen)
        for i, n in enumerate(lens):
            y[i, n:] = -100
        batches.append((x, y))

    total = sum(count_targets(y) for _, y in batches)
    model.zero_grad()
    for x, y in batches:
        loss, _, _ = label_smoothed_nll(model(x), y, 0.1)
        (loss / total).backward()
    accumulated = [p.grad.clone() for p in model.parameters()]

    t_max = max(max(lens) for lens in lengths)
    xs, ys = [], []
    for x, y in batches:
        pad = t_max - x.shape[1]
        xs.append(F.pad(x, (0, 0, 0, pad)))
        ys.append(F.pad(y, (0, pad), value=-100))
    x_all, y_all = torch.cat(xs), torch.cat(ys)
    model.zero_grad()
    loss, _, n = label_smoothed_nll(model(x_all), y_all, 0.1)
    assert int(n) == total
    (loss / n).backward()
    for a, b in zip(accumulated, (p.grad for p in model.parameters())):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    # The per-batch mean (the usual mistake) differs, so the test can tell them apart.
    model.zero_grad()
    for x, y in batches:
        loss, _, n = label_smoothed_nll(model(x), y, 0.1)
        (loss / n / len(batches)).backward()
    assert not torch.allclose(accumulated[0], next(model.parameters()).grad, atol=1e-6)


def test_bf16_logits_computed_in_float32() -> None:
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(8, 11, generator=gen).bfloat16()
    labels = torch.randint(0, 11, (8,), generator=gen)
    loss, _, _ = label_smoothed_nll(logits, labels, 0.1)
    assert loss.dtype == torch.float32
    ref = F.cross_entropy(logits.float(), labels, label_smoothing=0.1, reduction="sum")
    torch.testing.assert_close(loss, ref)


def test_shape_mismatch_raises() -> None:
    with pytest.raises(ValueError, match="leading dimensions"):
        label_smoothed_nll(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long), 0.1)
