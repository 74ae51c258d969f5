"""Output heads: language modeling, masked-LM, sequence classification and token classification."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.nn import cpu_gemm, tied_embedding
from aiayn.nn.dropout import Dropout
from aiayn.nn.norms import build_norm


class LMHead(nn.Module):
    """Hidden states -> vocabulary logits; the weight may be tied to an embedding (paper section 3.4)."""

    def __init__(self, d_model: int, vocab_size: int, tied_to: nn.Embedding | None = None) -> None:
        super().__init__()
        self.proj = nn.Linear(d_model, vocab_size, bias=False)
        if tied_to is not None:
            self.proj.weight = tied_to.weight

    def plan(self, embeddings: Sequence[nn.Embedding]) -> tuple[Tensor | None, list[bool]]:
        """For a forward pass that projects with this head, before its lookups: the weight to project with (a tied
        embedding's late identity in CPU training, else None: the layer as it is) and, per embedding, whether its
        lookups give row-sparse gradients (:func:`aiayn.nn.tied_embedding.plan`)."""
        weight = self.proj.weight
        if not isinstance(weight, Tensor):  # a quantized layer's
            return None, [False] * len(embeddings)
        return tied_embedding.plan(weight, embeddings)

    def weight_for(self, late: Tensor | None) -> Tensor:
        """What a model returns as ``output_weight``: ``late`` (from :meth:`plan`) where there is one, else
        ``proj.weight``."""
        return self.proj.weight if late is None else late

    def forward(self, h: Tensor, weight: Tensor | None = None) -> Tensor:
        """h (B, T, D) -> logits (B, T, V); ``weight`` (V, D), what :meth:`plan` returned (or a model's
        ``output_weight``), stands in for ``proj.weight`` through the linear layer's training product
        (:func:`aiayn.nn.cpu_gemm.linear`) where it is not that tensor itself."""
        if weight is None or weight is self.proj.weight:
            return self.proj(h)  # a PackedLinear's kernels at CPU inference
        return cpu_gemm.linear(h, weight, self.proj.bias)


class MLMHead(nn.Module):
    """BERT's masked-LM head: dense + GELU + norm, then the (tied) vocabulary projection with a bias."""

    def __init__(self, d_model: int, vocab_size: int, norm: str = "layernorm", eps: float = 1e-5,
                 tied_to: nn.Embedding | None = None) -> None:
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)
        self.norm = build_norm(norm, d_model, eps)
        self.decoder = LMHead(d_model, vocab_size, tied_to)
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, h: Tensor, weight: Tensor | None = None) -> Tensor:
        """h (B, T, D) -> logits (B, T, V); ``weight`` as :meth:`LMHead.forward`'s."""
        return self.decoder(self.norm(F.gelu(self.dense(h))), weight) + self.bias


class ClassificationHead(nn.Module):
    """Pool a sequence (first token or mean of real tokens), then dense + tanh + dropout + linear."""

    def __init__(self, d_model: int, n_classes: int, pooling: str = "cls", dropout: float = 0.1) -> None:
        super().__init__()
        self.pooling = pooling
        self.dense = nn.Linear(d_model, d_model)
        self.dropout = Dropout(dropout)
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
        self.dropout = Dropout(dropout)
        self.out = nn.Linear(d_model, n_labels)

    def forward(self, h: Tensor) -> Tensor:
        """h (B, T, D) -> logits (B, T, n_labels)."""
        return self.out(self.dropout(h))
