"""Parameter counts and FLOPs per token (for model FLOPs utilization)."""

from __future__ import annotations

from torch import nn

from aiayn.config import ModelConfig


def count_parameters(model: nn.Module, trainable_only: bool = False, exclude_embeddings: bool = False) -> int:
    """Number of distinct parameters (tied weights counted once)."""
    seen: set[int] = set()
    total = 0
    skip: set[int] = set()
    if exclude_embeddings:
        skip = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    for p in model.parameters():
        if id(p) in seen or id(p) in skip or (trainable_only and not p.requires_grad):
            continue
        seen.add(id(p))
        total += p.numel()
    return total


def _layer_matmul_params(c: ModelConfig, cross: bool) -> int:
    d, dh = c.d_model, c.head_dim
    attn = d * (c.n_heads * dh) * 2 + d * (c.kv_heads * dh) * 2  # q, out, k, v
    ffn = d * c.d_ff * (3 if c.activation in ("swiglu", "geglu") else 2)
    if c.ffn == "moe":  # the router, and the top k experts each token runs through
        ffn = d * c.n_experts + c.moe_top_k * ffn
    return attn * (2 if cross else 1) + ffn


def forward_flops_per_token(c: ModelConfig, src_len: int = 0, tgt_len: int = 0) -> float:
    """Forward-pass FLOPs per token (2 per multiply-add), Kaplan et al. style: 2 * matmul params + attention.

    For decoder-only models pass ``tgt_len`` (context); for encoders ``src_len``; for encoder-decoder
    both, and the count is per target token with the source cost amortized over ``tgt_len``.
    Training costs about three times the forward pass.
    """
    d = c.n_heads * c.head_dim  # the attention width: scores and weighted values cost this per key
    head = 2 * c.d_model * c.target_vocab_size
    if c.arch == "decoder":
        return 2 * c.n_layers * _layer_matmul_params(c, False) + 2 * c.n_layers * tgt_len * d + head
    if c.arch == "encoder":
        return 2 * c.encoder_layers * _layer_matmul_params(c, False) + 4 * c.encoder_layers * src_len * d
    enc = 2 * c.encoder_layers * _layer_matmul_params(c, False) + 4 * c.encoder_layers * src_len * d
    dec = (2 * c.n_layers * _layer_matmul_params(c, True) + 2 * c.n_layers * tgt_len * d
           + 4 * c.n_layers * src_len * d + head)
    return dec + enc * (src_len / max(tgt_len, 1))
