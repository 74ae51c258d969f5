"""Encoder-only models (BERT-like): a bidirectional stack with masked-LM, classification and tagging heads; with
``input="patches"``, a Vision Transformer that reads images."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.models.heads import ClassificationHead, MLMHead, TokenClassificationHead
from aiayn.models.output import ModelOutput
from aiayn.models.stack import TransformerStack
from aiayn.nn.patches import PatchEmbedding

TASKS = ("mlm", "classify", "tokens", "hidden")


class EncoderModel(nn.Module):
    """A bidirectional Transformer encoder with task heads.

    ``mlm_head`` exists for token input (tied to the embedding when ``tie_embeddings``); ``cls_head`` exists when
    ``config.n_classes`` is set, ``token_head`` when ``config.n_token_labels`` is set. With ``input="patches"`` the
    model reads images through ``patch_embed`` (:class:`~aiayn.nn.patches.PatchEmbedding`) and has no token
    embedding and no masked-LM head.
    """

    def __init__(self, config: ModelConfig, alpha: float = 1.0) -> None:
        super().__init__()
        c = config
        self.config = c
        images = c.input == "patches"
        self.patch_embed = (PatchEmbedding(c.channels, c.image_size, c.patch_size, c.d_model,
                                           cls_token=c.pooling == "cls", bias=c.bias) if images else None)
        self.embed = None if images else nn.Embedding(c.vocab_size, c.d_model, padding_idx=c.pad_id)
        self.encoder = TransformerStack(c, c.encoder_layers, self.embed, causal=False, alpha=alpha)
        self.mlm_head = None if images else MLMHead(c.d_model, c.vocab_size, c.norm, c.norm_eps,
                                                    self.embed if c.tie_embeddings else None, c.gelu_approximate)
        self.cls_head = ClassificationHead(c.d_model, c.n_classes, c.pooling, c.dropout) if c.n_classes else None
        self.token_head = TokenClassificationHead(c.d_model, c.n_token_labels, c.dropout) if c.n_token_labels else None

    def forward(self, ids: Tensor, is_token: Tensor | None = None, task: str = "mlm",
                return_weights: bool = False, token_type_ids: Tensor | None = None) -> ModelOutput:
        """Encode and apply a head.

        Args:
            ids: (B, S) token ids (padding = ``pad_id``); with ``input="patches"``, (B, C, H, W) float images, read
                as S = N patches (+ the CLS token), none of them padding.
            is_token: (B, S) bool, default ``ids != pad_id``.
            task: "mlm" -> (B, S, V) logits; "classify" -> (B, n_classes); "tokens" -> (B, S, n_labels);
                "hidden" -> logits = hidden states (B, S, D).
            return_weights: include per-layer attention weights under ``attentions["encoder"]``.
            token_type_ids: (B, S) long token types, e.g. BERT's segments A = 0 and B = 1 (``config.n_token_types``);
                default all 0.
        """
        if self.patch_embed is not None:
            h, w = self.encoder(None, embeds=self.patch_embed(ids), return_weights=return_weights)  # (B, S, D)
            is_token = h.new_ones(h.shape[:2], dtype=torch.bool)  # (B, S)
        else:
            if is_token is None:
                is_token = ids != self.config.pad_id
            h, w = self.encoder(ids, is_token=is_token, return_weights=return_weights, token_type_ids=token_type_ids)
        if task == "mlm":
            if self.mlm_head is None:
                raise ValueError("this model reads images and has no masked-LM head; use task='classify'")
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
