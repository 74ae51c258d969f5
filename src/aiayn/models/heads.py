"""Output heads: language modeling, masked-LM, sequence classification and token classification."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from aiayn.models.losses import label_smoothed_nll
from aiayn.nn.feedforward import activation_fn
from aiayn.nn.norms import build_norm

#: log-probabilities (N, c) and ids (N, c) of each row's c best next tokens, best first, and log p(eos) (N, 1) or None
RowTop = Callable[[Tensor, "int | None"], tuple[Tensor, Tensor, "Tensor | None"]]


def next_log_probs(logits: Tensor, banned_ids: Sequence[int] = ()) -> Tensor:
    """Log-softmax in float32, with ``banned_ids`` (e.g. PAD, BOS) set to -inf afterwards (no renormalizing).

    Args:
        logits: (N, V).
    Returns:
        (N, V) float32 log-probabilities.
    """
    logp = torch.log_softmax(logits.float(), dim=-1)
    if banned_ids:
        logp[:, list(banned_ids)] = float("-inf")
    return logp


def next_scores(logits: Tensor, banned_ids: Sequence[int] = ()) -> Tensor:
    """The logits in float32 with ``banned_ids`` set to -inf (a new tensor when any are banned): what a search
    that ignores a per-row shift (greedy, sampling) needs from :func:`next_log_probs`, without its log-softmax.

    Args:
        logits: (N, V).
    Returns:
        (N, V) float32 scores.
    """
    scores = logits.float()
    if banned_ids:
        banned = torch.tensor(list(banned_ids), dtype=torch.long, device=scores.device)
        scores = scores.index_fill(1, banned, float("-inf"))
    return scores


class LMHead(nn.Module):
    """Hidden states -> vocabulary logits ``proj(h * scale)``; the weight may be tied to an embedding (paper section
    3.4), and the projection may have a bias (BART's ``final_logits_bias``). ``scale`` is 1 except for T5 v1.0, which
    multiplies by d_model^-0.5 before its tied output layer.

    Its kernel seams, None unless an accelerator sets them (``print(model)`` names those set):

    - ``loss_kernel(h_scaled, weight, labels, label_smoothing)``: the training loss from hidden states, the output
      projection fused in (:meth:`loss`);
    - ``greedy_kernel(banned_ids)``: a chooser ``h (N, D) -> ids (N,)`` for greedy decoding
      (:func:`aiayn.generate.choosers.greedy_chooser`);
    - ``row_top_kernel(logits, banned_ids, n)``: beam search's chooser (:func:`aiayn.generate.choosers.row_top`).

    Each may decline a call by returning None; the reference then runs.
    """

    def __init__(self, d_model: int, vocab_size: int, tied_to: nn.Embedding | None = None, *, bias: bool = False,
                 scale: float = 1.0) -> None:
        super().__init__()
        self.scale = scale
        self.proj = nn.Linear(d_model, vocab_size, bias=bias)
        if tied_to is not None:
            self.proj.weight = tied_to.weight
        self.loss_kernel: Callable[..., tuple[Tensor, Tensor, Tensor]] | None = None
        self.greedy_kernel: Callable[[Sequence[int]], Callable[[Tensor], Tensor]] | None = None
        self.row_top_kernel: Callable[[Tensor, Sequence[int], int], RowTop] | None = None

    def forward(self, h: Tensor) -> Tensor:
        """h (..., D) -> logits (..., V)."""
        return self.proj(h * self.scale if self.scale != 1.0 else h)

    def in_weight_dtype(self, h: Tensor) -> Tensor:
        """h (..., D) in the output layer's floating weight dtype: a search hands over fp32 states, and a bf16
        model's go back exactly."""
        weight = getattr(self.proj, "weight", None)
        if isinstance(weight, Tensor) and weight.is_floating_point() and h.dtype != weight.dtype:
            return h.to(weight.dtype)
        return h

    def loss(self, h: Tensor, labels: Tensor, label_smoothing: float = 0.0) -> tuple[Tensor, Tensor, Tensor]:
        """The label-smoothed cross-entropy of this head's logits (:func:`aiayn.models.losses.label_smoothed_nll`), or
        the ``loss_kernel`` where one is set (it declines with None, e.g. for a biased output layer).

        Args:
            h: (..., D) hidden states.
            labels: (...) long target ids; ``IGNORE_INDEX`` (-100) positions do not count.
            label_smoothing: epsilon in [0, 1).
        Returns:
            summed loss, summed NLL (both scalars) and the number of counted targets.
        """
        if self.loss_kernel is not None:
            out = self.loss_kernel(h * self.scale if self.scale != 1.0 else h, self.proj, labels, label_smoothing)
            if out is not None:
                return out
        return label_smoothed_nll(self(h), labels, label_smoothing)

    def extra_repr(self) -> str:
        set_ = [f"{name}={getattr(k, '__name__', type(k).__name__)}" for name, k in
                (("loss_kernel", self.loss_kernel), ("greedy_kernel", self.greedy_kernel),
                 ("row_top_kernel", self.row_top_kernel)) if k is not None]
        return ", ".join([*([f"scale={self.scale:g}"] if self.scale != 1.0 else []), *set_])


class MLMHead(nn.Module):
    """BERT's masked-LM head: dense + GELU + norm, then the (tied) vocabulary projection with a bias.

    ``gelu_approximate`` "tanh" takes GELU's tanh approximation (as the model's feed-forward networks do).
    """

    def __init__(self, d_model: int, vocab_size: int, norm: str = "layernorm", eps: float = 1e-5,
                 tied_to: nn.Embedding | None = None, gelu_approximate: str = "none") -> None:
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)
        self.act = activation_fn("gelu", gelu_approximate)
        self.norm = build_norm(norm, d_model, eps)
        self.decoder = LMHead(d_model, vocab_size, tied_to)
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, h: Tensor) -> Tensor:
        """h (B, T, D) -> logits (B, T, V)."""
        return self.decoder(self.norm(self.act(self.dense(h)))) + self.bias


class ClassificationHead(nn.Module):
    """Pool a sequence (first token or mean of real tokens), then dense + tanh + dropout + linear: with "cls"
    pooling, BERT's pooler (dense + tanh on the first token) and its sequence classifier."""

    def __init__(self, d_model: int, n_classes: int, pooling: str = "cls", dropout: float = 0.1) -> None:
        super().__init__()
        self.pooling = pooling
        self.dense = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(d_model, n_classes)

    def forward(self, h: Tensor, is_token: Tensor) -> Tensor:
        """h (B, T, D), is_token (B, T) bool -> logits (B, n_classes)."""
        if self.pooling == "mean":
            w = is_token.to(h.dtype)[..., None]  # (B, T, 1)
            pooled = (h * w).sum(1) / w.sum(1).clamp(min=1.0)
        else:
            pooled = h[:, 0]
        return self.out(self.dropout(self.dense(pooled).tanh()))


class TokenClassificationHead(nn.Module):
    """Per-token labels (tagging): dropout + linear."""

    def __init__(self, d_model: int, n_labels: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(d_model, n_labels)

    def forward(self, h: Tensor) -> Tensor:
        """h (B, T, D) -> logits (B, T, n_labels)."""
        return self.out(self.dropout(h))
