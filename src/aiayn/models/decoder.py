"""Decoder-only models (GPT/LLaMA-like): a causal stack and a language-modeling head."""

from __future__ import annotations

from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.models.heads import LMHead
from aiayn.models.output import ModelOutput
from aiayn.models.stack import TransformerStack
from aiayn.nn import masks as M
from aiayn.nn.cache import DecoderCache


class DecoderModel(nn.Module):
    """A causal language model. Supports a prefix-LM mask, packed documents and a KV cache."""

    def __init__(self, config: ModelConfig, alpha: float = 1.0) -> None:
        super().__init__()
        c = config
        self.config = c
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.decoder = TransformerStack(c, c.n_layers, self.embed, causal=True, alpha=alpha)
        self.lm_head = LMHead(c.d_model, c.vocab_size, self.embed if c.tie_embeddings else None, bias=c.output_bias,
                              scale=c.d_model**-0.5 if c.tied_output_scale else 1.0)

    def extra_repr(self) -> str:
        compiler = getattr(self, "step_compiler", None)  # set by aiayn.accel.compile_decoding
        return "" if compiler is None else f"decoding_step={compiler!r}"

    def new_cache(self, capacity: int, static: bool = False) -> DecoderCache:
        """An empty KV cache for up to ``capacity`` positions (it grows if exceeded; ``static``: fixed shapes for a
        compiled step, exactly ``capacity``; see :meth:`aiayn.models.stack.TransformerStack.new_cache`)."""
        return self.decoder.new_cache(capacity, static)

    def forward(
        self,
        ids: Tensor,
        *,
        is_token: Tensor | None = None,
        positions: Tensor | None = None,
        doc_ids: Tensor | None = None,
        prefix_len: Tensor | None = None,
        cache: DecoderCache | None = None,
        return_weights: bool = False,
        compute_logits: bool = True,
        token_type_ids: Tensor | None = None,
    ) -> ModelOutput:
        """Next-token logits.

        Args:
            ids: (B, T) token ids.
            is_token: (B, T) bool, False at (left) padding.
            positions: (B|1, T) position ids (reset per document when packing; shifted for left padding).
            doc_ids: (B, T) document id per token for packed sequences: attention stays inside a document.
            prefix_len: (B,) long: the first prefix_len tokens attend bidirectionally (prefix-LM).
            cache: KV cache for incremental decoding (see :meth:`new_cache`).
            return_weights: include per-layer attention weights under ``attentions["self"]``.
            compute_logits: False skips the output projection (``logits`` is None; the trainer projects
                ``hidden`` in ``lm_head.loss``).
            token_type_ids: (B, T) long token types (``config.n_token_types``); default all 0.
        Returns:
            logits (B, T, V) and hidden (B, T, D).
        """
        if (doc_ids is not None or prefix_len is not None) and cache is not None and cache.length:
            raise ValueError("doc_ids and prefix_len apply to the first (prompt) chunk only, not to later steps")
        attn_mask = None
        if doc_ids is not None:
            attn_mask = M.document_mask(doc_ids)
        if prefix_len is not None:
            attn_mask = M.combine(attn_mask, M.prefix_lm_mask(ids.shape[1], prefix_len))
        h, w = self.decoder(ids, is_token=is_token, positions=positions, attn_mask=attn_mask, cache=cache,
                            return_weights=return_weights, token_type_ids=token_type_ids)
        return ModelOutput(self.lm_head(h) if compute_logits else None, h, {"self": w["self"]} if w else None)
