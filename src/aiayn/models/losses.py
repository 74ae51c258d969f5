"""Label-smoothed cross-entropy, summed over real target tokens.

The paper (section 5.4) trains with label smoothing ``epsilon_ls = 0.1``. The loss here is summed,
never averaged: the trainer divides the sum by the number of non-pad target tokens of the whole
optimizer step (all accumulated micro-batches together), so k accumulated micro-batches of different
lengths give exactly the gradient of one batch made of their union.

Smoothing convention (default, ``ignore_vocab_id=None``): the target distribution is
``(1 - eps) * onehot(y) + eps / V`` over all ``V`` classes, the true class included. This is PyTorch's
``F.cross_entropy(label_smoothing=eps)`` and matches it to float rounding. Other toolkits differ:
fairseq spreads ``eps`` over the ``V - 1`` non-target classes (the pad id included); OpenNMT-py spreads
it over the ``V - 2`` classes that are neither the target nor pad. With ``ignore_vocab_id=k`` we keep
PyTorch's convention but give class ``k`` (normally the PAD id, which a model should never predict) no
smoothing mass: ``eps / (V - 1)`` on each of the other classes, the true class included.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def label_smoothed_nll(
    logits: torch.Tensor,
    labels: torch.Tensor,
    epsilon: float,
    reduction: str = "sum",
    ignore_vocab_id: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Label-smoothed cross-entropy and plain NLL over non-ignored positions.

    Computed in float32 whatever the logits' dtype.

    Args:
        logits: (N, V) or (B, T, V) unnormalized scores.
        labels: (N,) or (B, T) class ids; ``-100`` marks positions that never count (padding).
        epsilon: label smoothing in [0, 1); 0 gives plain cross-entropy.
        reduction: ``"sum"`` (0-d tensors) or ``"none"`` (per-position tensors shaped like ``labels``,
            zero at ignored positions).
        ignore_vocab_id: a vocabulary id (the PAD id) that receives no smoothing mass, or None to
            spread ``epsilon`` over the whole vocabulary like PyTorch does.

    Returns:
        ``(loss, nll, n_tokens)``: the smoothed loss and the unsmoothed negative log-likelihood (for
        perplexity), summed or per position, and the number of non-ignored positions (0-d int64).
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(
            f"label_smoothed_nll: logits {tuple(logits.shape)} and labels {tuple(labels.shape)} "
            "must share leading dimensions"
        )
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"label_smoothed_nll: epsilon must be in [0, 1), got {epsilon}")
    if reduction not in ("sum", "none"):
        raise ValueError(f"label_smoothed_nll: reduction must be 'sum' or 'none', got {reduction!r}")
    vocab = logits.shape[-1]
    logp = F.log_softmax(logits.float(), dim=-1)  # (..., V)
    keep = labels != IGNORE_INDEX  # (...)
    safe = labels.masked_fill(~keep, 0)  # (...) valid ids for gather
    nll = -logp.gather(-1, safe.unsqueeze(-1)).squeeze(-1)  # (...)
    if ignore_vocab_id is None:
        smooth = -logp.sum(dim=-1) / vocab  # (...) mean over the vocabulary
    else:
        smooth = -(logp.sum(dim=-1) - logp[..., ignore_vocab_id]) / (vocab - 1)  # (...)
    loss = (1.0 - epsilon) * nll + epsilon * smooth if epsilon > 0 else nll
    zero = torch.zeros((), dtype=loss.dtype, device=loss.device)
    loss = torch.where(keep, loss, zero)
    nll = torch.where(keep, nll, zero)
    n_tokens = keep.sum()
    if reduction == "sum":
        return loss.sum(), nll.sum(), n_tokens
    return loss, nll, n_tokens


def count_targets(labels: torch.Tensor) -> int:
    """The number of positions that count (``labels != -100``): the divisor of a summed loss.

    Args:
        labels: (B, T) or (N,) class ids with ``-100`` at ignored positions.
    """
    return int((labels != IGNORE_INDEX).sum().item())
