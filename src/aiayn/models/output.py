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
    """

    logits: Tensor | None
    hidden: Tensor | None = None
    attentions: dict[str, list[Tensor]] | None = None
