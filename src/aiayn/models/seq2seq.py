"""The paper's encoder-decoder model, with separate ``encode()`` and ``decode()`` (as the Annotated
Transformer) so that decoding encodes each source once."""

from __future__ import annotations

from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.models.heads import LMHead
from aiayn.models.output import ModelOutput
from aiayn.models.stack import TransformerStack
from aiayn.nn.cache import DecoderCache


class EncoderDecoderModel(nn.Module):
    """Encoder (bidirectional) + decoder (causal, with cross-attention) + output projection.

    With ``share_src_tgt_embeddings`` both stacks use one embedding; with ``tie_embeddings`` the output
    projection uses it too (paper section 3.4: "we share the same weight matrix between the two embedding
    layers and the pre-softmax linear transformation").
    """

    def __init__(self, config: ModelConfig, enc_alpha: float = 1.0, dec_alpha: float = 1.0) -> None:
        super().__init__()
        c = config
        self.config = c
        self.src_embed = nn.Embedding(c.vocab_size, c.d_model, padding_idx=c.pad_id)
        self.tgt_embed = (self.src_embed if c.share_src_tgt_embeddings
                          else nn.Embedding(c.target_vocab_size, c.d_model, padding_idx=c.pad_id))
        self.encoder = TransformerStack(c, c.encoder_layers, self.src_embed, causal=False, alpha=enc_alpha)
        self.decoder = TransformerStack(c, c.n_layers, self.tgt_embed, causal=True, cross=True, alpha=dec_alpha)
        self.lm_head = LMHead(c.d_model, c.target_vocab_size, self.tgt_embed if c.tie_embeddings else None,
                              bias=c.output_bias, scale=c.d_model**-0.5 if c.tied_output_scale else 1.0)

    def encode(self, src: Tensor, src_is_token: Tensor | None = None,
               return_weights: bool = False) -> tuple[Tensor, Tensor, list[Tensor] | None]:
        """Encode a source batch.

        Args:
            src: (B, S) source ids, right-padded with ``pad_id``.
            src_is_token: (B, S) bool, default ``src != pad_id``.
        Returns:
            memory (B, S, D), src_is_token (B, S), and encoder self-attention weights if requested.
        """
        if src_is_token is None:
            src_is_token = src != self.config.pad_id
        memory, w = self.encoder(src, is_token=src_is_token, return_weights=return_weights)
        return memory, src_is_token, (w["self"] if w else None)

    def extra_repr(self) -> str:
        compiler = getattr(self, "step_compiler", None)  # set by aiayn.accel.compile_decoding
        return "" if compiler is None else f"decoding_step={compiler!r}"

    def new_cache(self, capacity: int, static: bool = False) -> DecoderCache:
        """An empty decoder cache (self-attention keys/values and projected memory) for ``capacity`` steps
        (``static``: fixed shapes for a compiled step; see :meth:`aiayn.models.stack.TransformerStack.new_cache`)."""
        return self.decoder.new_cache(capacity, static)

    def decode(self, tgt: Tensor, memory: Tensor | None, src_is_token: Tensor, *,
               cache: DecoderCache | None = None, return_weights: bool = False,
               compute_logits: bool = True) -> ModelOutput:
        """Decoder logits for target prefixes.

        Args:
            tgt: (B, T) decoder input ids (BOS + target so far); with a cache, only the new tokens.
            memory: (B, S, D) encoder output (may be None once the cache holds the projected memory).
            src_is_token: (B, S) bool source padding flags.
            cache: a :meth:`new_cache` for incremental decoding.
            compute_logits: False skips the output projection (``logits`` is None, ``hidden`` (B, T, D) only).
        Returns:
            logits (B, T, V_tgt) and hidden (B, T, D).
        """
        h, w = self.decoder(tgt, memory=memory, memory_is_token=src_is_token, cache=cache,
                            return_weights=return_weights)
        return ModelOutput(self.lm_head(h) if compute_logits else None, h, w)

    def forward(self, src: Tensor, tgt: Tensor, src_is_token: Tensor | None = None,
                return_weights: bool = False, compute_logits: bool = True) -> ModelOutput:
        """Teacher-forced logits: src (B, S), tgt (B, T) decoder input -> logits (B, T, V_tgt), hidden (B, T, D).

        ``compute_logits=False`` skips the output projection (the trainer projects ``hidden`` in ``lm_head.loss``).
        """
        memory, src_is_token, w_enc = self.encode(src, src_is_token, return_weights)
        out = self.decode(tgt, memory, src_is_token, return_weights=return_weights, compute_logits=compute_logits)
        if out.attentions is not None:
            out.attentions["encoder"] = w_enc
        return out
