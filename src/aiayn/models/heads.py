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

    Besides the projection, the head owns what is computed from its logits: the training loss (:meth:`loss`) and the
    choice of next tokens in decoding (:meth:`greedy_chooser`, :meth:`row_top`). They are methods so that an
    accelerator can replace them with fused forms (it substitutes the head's class); these are the references.
    """

    def __init__(self, d_model: int, vocab_size: int, tied_to: nn.Embedding | None = None, *, bias: bool = False,
                 scale: float = 1.0) -> None:
        super().__init__()
        self.scale = scale
        self.proj = nn.Linear(d_model, vocab_size, bias=bias)
        if tied_to is not None:
            self.proj.weight = tied_to.weight

    def forward(self, h: Tensor) -> Tensor:
        """h (..., D) -> logits (..., V)."""
        return self.proj(h * self.scale if self.scale != 1.0 else h)

    def loss(self, h: Tensor, labels: Tensor, label_smoothing: float = 0.0) -> tuple[Tensor, Tensor, Tensor]:
        """The label-smoothed cross-entropy of this head's logits (:func:`aiayn.models.losses.label_smoothed_nll`).

        Args:
            h: (..., D) hidden states.
            labels: (...) long target ids; ``IGNORE_INDEX`` (-100) positions do not count.
            label_smoothing: epsilon in [0, 1).
        Returns:
            summed loss, summed NLL (both scalars) and the number of counted targets.
        """
        return label_smoothed_nll(self(h), labels, label_smoothing)

    def greedy_chooser(self, banned_ids: Sequence[int] = ()) -> Callable[[Tensor], Tensor]:
        """A chooser for greedy decoding over hidden states: h (N, D) -> each row's most likely id (N,) long (the
        first on ties), ``banned_ids`` never chosen."""
        banned = list(banned_ids)

        def choose(h: Tensor) -> Tensor:
            weight = getattr(self.proj, "weight", None)
            if isinstance(weight, Tensor) and weight.is_floating_point() and h.dtype != weight.dtype:
                h = h.to(weight.dtype)  # the search hands over fp32 states; a bf16 model's go back exactly
            return next_scores(self(h), banned).argmax(dim=-1)  # (N,)

        return choose

    def row_top(self, logits: Tensor, banned_ids: Sequence[int], n: int) -> RowTop:
        """Beam search's chooser: ``top(logits, eos_id)`` gives each row's ``min(n, V)`` best next tokens as
        log-probabilities normalized over the whole vocabulary (banned ids included in the normalizer, excluded from
        the choice), best first, and log p(``eos_id``) (N, 1) where ``eos_id`` is given.

        Args:
            logits: (N, V) an example of the logits it will get (vocabulary size, dtype, device).
            banned_ids: ids never chosen.
            n: how many per row.
        """
        return reference_row_top(logits, banned_ids, n)


def reference_row_top(logits: Tensor, banned_ids: Sequence[int], n: int) -> RowTop:
    """:meth:`LMHead.row_top` in plain torch: :func:`next_log_probs` and a ``topk`` per call."""
    n = min(n, logits.shape[-1])
    banned = torch.tensor(list(banned_ids), dtype=torch.long, device=logits.device) if banned_ids else None

    def top(logits: Tensor, eos_id: int | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
        log_probs = next_log_probs(logits)  # (N, V) float32
        if banned is not None:  # the index built once per search, not per step
            log_probs.index_fill_(1, banned, float("-inf"))
        top_lp, top_tok = log_probs.topk(n, dim=-1)  # (N, n) each, best first
        return top_lp, top_tok, None if eos_id is None else log_probs[:, eos_id:eos_id + 1]

    return top


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
