"""One Transformer layer for every family, and the residual wiring around each sublayer.

Post-LN (the paper):  x = LN(alpha * x + Dropout(Sublayer(x)))      alpha = 1 unless DeepNorm
Pre-LN:               x = x + Dropout(Sublayer(LN(x)))              (with a final LN after the stack)

An encoder layer is self-attention + FFN; a decoder layer adds cross-attention between them.
"""

from __future__ import annotations

from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.nn.attention import MultiHeadAttention
from aiayn.nn.cache import CrossAttnCache, SelfAttnCache
from aiayn.nn.feedforward import FeedForward
from aiayn.nn.moe import MoEFeedForward
from aiayn.nn.norms import build_norm


class Residual(nn.Module):
    """The dropout, residual connection and norm (post- or pre-) around one sublayer.

    Call :meth:`enter` on the layer input to get what the sublayer consumes, then :meth:`exit` with the input
    and the sublayer's output.
    """

    def __init__(self, config: ModelConfig, alpha: float = 1.0) -> None:
        super().__init__()
        self.pre = config.norm_position == "pre"
        self.alpha = alpha
        self.norm = build_norm(config.norm, config.d_model, config.norm_eps, config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def enter(self, x: Tensor) -> Tensor:
        """x (B, T, D) -> the sublayer input: LN(x) for pre-LN, x itself for post-LN."""
        return self.norm(x) if self.pre else x

    def exit(self, x: Tensor, y: Tensor) -> Tensor:
        """Layer input x and sublayer output y, both (B, T, D) -> the residual sum (normalized for post-LN)."""
        if self.training:  # nothing to drop at inference: no call at all on a decoding step's hot path
            y = self.dropout(y)
        if self.pre:
            return x + y
        return self.norm(x + y if self.alpha == 1.0 else self.alpha * x + y)


class TransformerLayer(nn.Module):
    """Self-attention, optional cross-attention, and a feed-forward network (or a mixture of experts,
    ``ffn="moe"``), each in a :class:`Residual`.

    Args:
        config: the model config.
        cross: add encoder-decoder attention (decoder layers of an encoder-decoder model).
        alpha: DeepNorm residual scale (1.0 otherwise).
    """

    def __init__(self, config: ModelConfig, cross: bool = False, alpha: float = 1.0) -> None:
        super().__init__()
        c = config
        scale = 1.0 if c.position == "t5" else None  # T5 folds 1/sqrt(Dh) into its initialization
        attn = dict(bias=c.bias, qkv_bias=c.qkv_uses_bias, dropout=c.attn_dropout, head_dim=c.head_dim, scale=scale,
                    kind=c.attention, qk_norm=c.qk_norm, norm_eps=c.norm_eps, softcap=c.attn_logit_softcap)
        self.self_attn = MultiHeadAttention(c.d_model, c.n_heads, c.kv_heads, **attn)
        self.self_res = Residual(c, alpha)
        self.cross_attn = MultiHeadAttention(c.d_model, c.n_heads, c.kv_heads, cross=True, **attn) if cross else None
        for mha in (self.self_attn, self.cross_attn):
            if mha is not None:
                mha.backend = c.attention_backend
        self.cross_res = Residual(c, alpha) if cross else None
        if c.ffn == "moe":
            self.ffn = MoEFeedForward(c.d_model, c.d_ff, c.n_experts, c.moe_top_k, c.moe_capacity_factor,
                                      c.activation, c.ffn_dropout, c.bias, c.gelu_approximate)
        else:
            self.ffn = FeedForward(c.d_model, c.d_ff, c.activation, c.ffn_dropout, c.bias, c.gelu_approximate)
        self.ffn_res = Residual(c, alpha)

    def forward(
        self,
        x: Tensor,
        *,
        mask: Tensor | None = None,
        bias: Tensor | None = None,
        rotary: tuple[Tensor, Tensor] | None = None,
        is_causal: bool = False,
        memory: Tensor | None = None,
        memory_mask: Tensor | None = None,
        self_cache: SelfAttnCache | None = None,
        cross_cache: CrossAttnCache | None = None,
        return_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """One layer.

        Args:
            x: (B, T, D) input.
            mask: self-attention mask, bool broadcastable to (B, H, T, S).
            bias: self-attention additive bias (B|1, H, T, S).
            rotary: RoPE (cos, sin) for the positions of ``x``.
            is_causal: causal self-attention (fast path when ``mask`` is None).
            memory: (B, S_src, D) encoder output, for cross-attention.
            memory_mask: cross-attention mask broadcastable to (B, H, T, S_src).
            self_cache / cross_cache: KV caches for incremental decoding.
        Returns:
            (B, T, D) output, self-attention weights, cross-attention weights (None unless requested).
        """
        y, w_self = self.self_attn(self.self_res.enter(x), mask=mask, bias=bias, rotary=rotary, cache=self_cache,
                                   is_causal=is_causal, return_weights=return_weights)
        x = self.self_res.exit(x, y)
        w_cross = None
        if self.cross_attn is not None:
            y, w_cross = self.cross_attn(self.cross_res.enter(x), memory, mask=memory_mask, cache=cross_cache,
                                         return_weights=return_weights)
            x = self.cross_res.exit(x, y)
        x = self.ffn_res.exit(x, self.ffn(self.ffn_res.enter(x)))
        return x, w_self, w_cross
