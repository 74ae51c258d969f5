"""A stack of Transformer layers with its embeddings, positions and masks: the body of every model.

The encoder is a non-causal stack; the decoder is a causal stack, with cross-attention when it serves an
encoder-decoder model. All mask and position logic lives here, once.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.nn import masks as M
from aiayn.nn.cache import DecoderCache
from aiayn.nn.layers import TransformerLayer
from aiayn.nn.linear_attention import LinearDecoderCache
from aiayn.nn.norms import build_norm
from aiayn.nn.positions import ALiBi, LearnedPositions, RotaryEmbedding, SinusoidalPositions, T5RelativeBias


class TransformerStack(nn.Module):
    """Embeddings + positions + N layers (+ final norm for pre-LN).

    The input of the layers is ``Dropout(Norm(embed(ids) * embed_scale + token_type_embed(types) + positions))``, the
    token types and the norm where the config has them (``n_token_types``, ``embedding_norm``). Input embeddings made
    elsewhere (an image's patches, :mod:`aiayn.nn.patches`) take the place of ``embed(ids) * embed_scale``.

    Args:
        config: the model config.
        n_layers: number of layers.
        embedding: token embedding (V, D), possibly shared with another stack or the output layer; None for a
            stack that is always given its input embeddings (``embeds``).
        causal: causal self-attention (decoders).
        cross: layers attend to an encoder memory.
        alpha: DeepNorm residual scale.
    """

    def __init__(self, config: ModelConfig, n_layers: int, embedding: nn.Embedding | None, *, causal: bool,
                 cross: bool = False, alpha: float = 1.0) -> None:
        super().__init__()
        c = config
        self.config, self.causal, self.cross = c, causal, cross
        self.embed = embedding
        self.embed_scale = math.sqrt(c.d_model) if c.scale_embeddings else 1.0
        self.abs_pos: nn.Module | None = {
            "sinusoidal": lambda: SinusoidalPositions(c.d_model, c.max_len, c.sinusoidal_layout, c.position_offset),
            "learned": lambda: LearnedPositions(c.d_model, c.max_len, c.position_offset),
        }.get(c.position, lambda: None)()
        self.token_type_embed = nn.Embedding(c.n_token_types, c.d_model) if c.n_token_types else None
        self.embed_norm = build_norm(c.norm, c.d_model, c.norm_eps, c.bias) if c.embedding_norm else None
        self.rotary = (RotaryEmbedding(c.head_dim, c.rope_theta, c.rope_scaling, c.rope_scaling_factor,
                                       c.rope_original_max_len or c.max_len, c.rope_low_freq_factor,
                                       c.rope_high_freq_factor) if c.position == "rope" else None)
        self.pos_bias: nn.Module | None = None
        if c.position == "alibi":
            self.pos_bias = ALiBi(c.n_heads)
        elif c.position == "t5":
            self.pos_bias = T5RelativeBias(c.n_heads, c.t5_num_buckets, c.t5_max_distance, bidirectional=not causal)
        self.dropout = nn.Dropout(c.dropout)
        self.layers = nn.ModuleList(TransformerLayer(c, cross=cross, alpha=alpha) for _ in range(n_layers))
        self.final_norm = (build_norm(c.norm, c.d_model, c.norm_eps, c.bias)
                           if c.norm_position == "pre" else nn.Identity())

    def forward(
        self,
        ids: Tensor | None,
        *,
        is_token: Tensor | None = None,
        positions: Tensor | None = None,
        attn_mask: Tensor | None = None,
        memory: Tensor | None = None,
        memory_is_token: Tensor | None = None,
        cache: DecoderCache | None = None,
        return_weights: bool = False,
        token_type_ids: Tensor | None = None,
        embeds: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, list[Tensor]] | None]:
        """Run the stack.

        Args:
            ids: (B, T) token ids.
            is_token: (B, T) bool, False at padding (keys at padding are never attended). Encoders infer it from
                ``pad_id`` when omitted; decoders assume no padding (right padding needs none under a causal mask).
            positions: (B|1, T) position ids; default ``cache.length + arange(T)``.
            attn_mask: a self-attention mask that replaces the causal one (e.g. prefix-LM or document mask,
                which encode causality themselves), bool broadcastable to (B, 1, T, S).
            memory: (B, S_src, D) encoder output (cross-attention stacks).
            memory_is_token: (B, S_src) bool, False at source padding.
            cache: a :class:`DecoderCache` for incremental decoding (causal stacks).
            return_weights: collect per-layer attention weights.
            token_type_ids: (B|1, T) long token types (stacks with ``n_token_types``); default all 0.
            embeds: (B, T, D) input embeddings used instead of ``embed(ids) * embed_scale`` (``ids`` is then None):
                an image's patches. Without ``is_token`` they have no padding.
        Returns:
            hidden (B, T, D) and, if requested, {"self": [L x (B, H, T, S)], "cross": [...]}.
        """
        x, mask, bias, rotary, is_causal, memory_mask = self.prepare(
            ids, is_token=is_token, positions=positions, attn_mask=attn_mask, memory_is_token=memory_is_token,
            cache=cache, token_type_ids=token_type_ids, embeds=embeds)
        weights: dict[str, list[Tensor]] | None = {"self": [], "cross": []} if return_weights else None
        for i, layer in enumerate(self.layers):
            x, w_self, w_cross = layer(
                x, mask=mask, bias=bias, rotary=rotary, is_causal=is_causal, memory=memory,
                memory_mask=memory_mask,
                self_cache=cache.self_attn[i] if cache is not None else None,
                cross_cache=cache.cross_attn[i] if cache is not None and cache.cross_attn else None,
                return_weights=return_weights)
            if weights is not None:
                weights["self"].append(w_self)
                if w_cross is not None:
                    weights["cross"].append(w_cross)
        return self.final_norm(x), weights

    def new_cache(self, capacity: int, static: bool = False) -> DecoderCache:
        """An empty cache for decoding with this (causal) stack, up to ``capacity`` positions: a constant-size state
        per layer for linear attention; else the KV cache, addressed by slot (``sliding_window`` slots) for a window
        smaller than ``capacity`` or when ``static`` (the fixed shapes of a compiled step; exactly ``capacity``
        positions), by position otherwise (it grows if exceeded)."""
        c = self.config
        if c.attention == "linear":
            if static:
                raise ValueError("linear attention keeps a running state, not a static KV cache")
            return LinearDecoderCache(len(self.layers), cross=self.cross)
        return DecoderCache(len(self.layers), capacity, cross=self.cross, window=c.sliding_window, static=static)

    def pattern_mask(self, t: int, s: int, device: torch.device) -> Tensor | None:
        """The config's sparse attention pattern (``attention_mask``) for T queries at the end of S keys, (T, S) bool;
        None for "dense". Causal in a causal stack."""
        c = self.config
        if c.attention_mask == "block_sparse":
            return M.block_sparse_mask(t, c.sparse_block, c.sparse_local_blocks, c.sparse_stride, causal=self.causal,
                                       device=device, s=s)
        if c.attention_mask == "local_global":
            return M.local_global_mask(t, c.local_window, torch.arange(min(c.global_tokens, s), device=device),
                                       causal=self.causal, device=device, s=s)
        return None

    def prepare(
        self,
        ids: Tensor | None,
        *,
        is_token: Tensor | None = None,
        positions: Tensor | None = None,
        attn_mask: Tensor | None = None,
        memory_is_token: Tensor | None = None,
        cache: DecoderCache | None = None,
        token_type_ids: Tensor | None = None,
        embeds: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor | None, tuple[Tensor, Tensor] | None, bool, Tensor | None]:
        """Everything the layers take, from the stack's input (arguments as :meth:`forward`); with a ``cache``,
        records the new positions in it. The one place where embeddings, positions and masks are made, for a whole
        pass, a prefill and a decoding step alike.

        Returns:
            x (B, T, D) the embedded input; the self-attention mask (bool, broadcastable to (B, H, T, S)) or
            None; the additive position bias (ALiBi, T5) or None; RoPE's (cos, sin) or None; whether
            self-attention is causal through the fast path (no mask); the cross-attention mask or None.
        """
        b, t = ids.shape if embeds is None else embeds.shape[:2]
        device = (ids if embeds is None else embeds).device
        c = self.config
        if token_type_ids is not None and self.token_type_embed is None:
            raise ValueError("token_type_ids given, but this model has no token types (config.n_token_types is not "
                             "set)")
        slotted = cache is not None and cache.slotted  # keys in slots: the cache makes the mask
        default_positions = positions is None  # start .. start + t - 1 (known on the host unless slotted)
        start = cache.length if cache is not None and default_positions and not slotted else 0
        if is_token is None and not self.causal and embeds is None:
            is_token = ids != c.pad_id
        padded = is_token is not None and not bool(is_token.all())  # no host sync when is_token is None
        # a step at default positions, unpadded like every one before: the cache stores no ids, and the positions
        # are made only for what reads them (RoPE, a position bias)
        advanced = cache is not None and default_positions and cache.advance(t, padded)
        if default_positions and not (advanced and self.pos_bias is None and self.rotary is None):  # (1, T)
            positions = (cache.next_positions(t, device) if slotted
                         else torch.arange(start, start + t, device=device)[None])
        key_is_token, key_pos = (None, None) if advanced else (is_token, positions)
        if cache is not None and not advanced:  # (None, None) while every row's keys are unpadded at default positions
            key_is_token, key_pos = cache.extend(is_token, positions.expand(b, t), padded, default=default_positions)
        if cache is not None:
            padded = cache.padded
        s = cache.length if cache is not None and not slotted else t

        # ---- self-attention mask: causal / window / pattern / padding / extra: one bool mask, or the causal fast path
        mask = attn_mask
        if slotted:  # validity, causality, window and padding of the step's keys
            if c.attention_mask != "dense":
                raise ValueError(f"attention_mask={c.attention_mask!r} is not supported with a cache addressed by "
                                 "slot (a sliding window shorter than the decoded length, or a static cache)")
            mask = M.combine(mask, cache.step_mask)
        elif padded:
            mask = M.combine(mask, M.padding_mask(key_is_token))
        if not slotted and self.causal and c.sliding_window is not None and s > c.sliding_window:
            mask = M.combine(mask, M.sliding_window_mask(t, c.sliding_window, s, device=device))
        if c.attention_mask != "dense" and not slotted:
            mask = M.combine(mask, self.pattern_mask(t, s, device))
        # an explicit attn_mask encodes causality, and a slotted cache's mask does
        is_causal = self.causal and t > 1 and attn_mask is None and not slotted
        bias = None
        if self.pos_bias is not None:  # a cache that stores no ids makes them here
            bias = self.pos_bias(positions, key_pos if key_pos is not None else cache.key_positions(b, device))
        if cache is not None and cache.cross_attn and cache.memory_mask_ready:
            memory_mask = cache.memory_mask  # computed once per source batch, not at every step
        else:
            padded_memory = memory_is_token is not None and (slotted or not bool(memory_is_token.all()))
            memory_mask = M.padding_mask(memory_is_token) if padded_memory else None  # slotted: no host sync
            if cache is not None and cache.cross_attn:
                cache.memory_mask, cache.memory_mask_ready = memory_mask, True

        x = self.embed(ids) * self.embed_scale if embeds is None else embeds  # (B, T, D)
        if self.token_type_embed is not None:
            if token_type_ids is not None:
                tte = self.token_type_embed(token_type_ids)  # (B|1, T, D)
            else:
                tte = self.token_type_embed.weight[0]  # (D,): every token of type 0
            x = x + (tte if tte.dtype == x.dtype else tte.to(x.dtype))
        if self.abs_pos is not None:
            # default positions (known on the host): a slice of the table; given ones: a gather
            pe = self.abs_pos.span(start, t) if default_positions and not slotted else self.abs_pos(positions)
            x = x + (pe if pe.dtype == x.dtype else pe.to(x.dtype))
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        # angles in fp32, cos/sin in the hidden states' dtype (fp32 under autocast, bf16 in a bf16 model)
        rotary = self.rotary(positions, x.dtype) if self.rotary is not None else None
        if self.training:
            x = self.dropout(x)
        return x, mask, bias, rotary, is_causal, memory_mask
