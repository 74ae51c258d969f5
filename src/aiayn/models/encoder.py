"""Encoder-only models (BERT-like): a bidirectional stack with masked-LM, classification and tagging heads."""

from __future__ import annotations

from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.models.heads import ClassificationHead, MLMHead, TokenClassificationHead
from aiayn.models.output import ModelOutput
from aiayn.models.stack import TransformerStack

TASKS = ("mlm", "classify", "tokens", "hidden")


class EncoderModel(nn.Module):
    """A bidirectional Transformer encoder with task heads.

    ``mlm_head`` always exists (tied to the embedding when ``tie_embeddings``); ``cls_head`` exists when
    ``config.n_classes`` is set, ``token_head`` when ``config.n_token_labels`` is set.
    """

    def __init__(self, config: ModelConfig, alpha: float = 1.0) -> None:
        super().__init__()
        c = config
        self.config = c
        self.embed = nn.Embedding(c.vocab_size, c.d_model, padding_idx=c.pad_id)
        self.encoder = TransformerStack(c, c.encoder_layers, self.embed, causal=False, alpha=alpha)
        self.mlm_head = MLMHead(c.d_model, c.vocab_size, c.norm, c.norm_eps,
                                self.embed if c.tie_embeddings else None, c.gelu_approximate)
        self.cls_head = ClassificationHead(c.d_model, c.n_classes, c.pooling, c.dropout) if c.n_classes else None
        self.token_head = TokenClassificationHead(c.d_model, c.n_token_labels, c.dropout) if c.n_token_labels else None

    def forward(self, ids: Tensor, is_token: Tensor | None = None, task: str = "mlm",
                return_weights: bool = False, token_type_ids: Tensor | None = None) -> ModelOutput:
        """Encode and apply a head.

        Args:
            ids: (B, S) token ids (padding = ``pad_id``).
            is_token: (B, S) bool, default ``ids != pad_id``.
            task: "mlm" -> (B, S, V) logits; "classify" -> (B, n_classes); "tokens" -> (B, S, n_labels);
                "hidden" -> logits = hidden states (B, S, D).
            return_weights: include per-layer attention weights under ``attentions["encoder"]``.
            token_type_ids: (B, S) long token types, e.g. BERT's segments A = 0 and B = 1 (``config.n_token_types``);
                default all 0.
        """
        if is_token is None:
            is_token = ids != self.config.pad_id
        h, w = self.encoder(ids, is_token=is_token, return_weights=return_weights, token_type_ids=token_type_ids)
        if task == "mlm":
            logits = self.mlm_head(h)
        elif task == "classify":
            if self.cls_head is None:
                raise ValueError("this model has no classification head (config.n_classes is not set)")
            logits = self.cls_head(h, is_token)
        elif task == "tokens":
            if self.token_head is None:
                raise ValueError("this model has no token head (config.n_token_labels is not set)")
            logits = self.token_head(h)
        elif task == "hidden":
            logits = h
        else:
            raise ValueError(f"task={task!r}: choose one of {TASKS}")
        return ModelOutput(logits, h, {"encoder": w["self"]} if w else None)
