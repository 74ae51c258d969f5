"""What every model's forward returns."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass
class ModelOutput:
    """Model outputs.

    Attributes:
        logits: (B, T, V) for language models, (B, n_classes) for sequence classification,
            (B, T, n_labels) for token classification; None when the caller asked for hidden states only
            (``compute_logits=False``).
        hidden: (B, T, D) final hidden states.
        attentions: per-layer, per-head weights when requested: {"encoder": [L x (B, H, S, S)],
            "self": [L x (B, H, T, T')], "cross": [L x (B, H, T, S)]}.
        output_weight: (V, D) the output layer's weight as this forward pass's graph holds it, when the caller
            asked for it (``output_weight=True``) to project ``hidden`` itself, as the trainer's fused loss does.
            Projecting with it rather than with ``lm_head.proj.weight`` lets a tied embedding's lookups give
            row-sparse gradients that are added into the projection's in place (:mod:`aiayn.nn.tied_embedding`).
    """

    logits: Tensor | None
    hidden: Tensor | None = None
    attentions: dict[str, list[Tensor]] | None = None
    output_weight: Tensor | None = None
