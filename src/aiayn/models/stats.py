"""Parameter counts and FLOPs per token (for model FLOPs utilization)."""

from __future__ import annotations

import os

import torch
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


def estimated_parameters(c: ModelConfig) -> int:
    """About how many parameters :func:`aiayn.models.build.build_model` makes of ``c``, counted from the config alone
    (no tensor is allocated, however large the config): the layers' matrices (every expert of a mixture), the
    embeddings, learned positions and an untied output layer; norms and biases are left out."""
    d = c.d_model
    layer_ffn = d * c.d_ff * (3 if c.activation in ("swiglu", "geglu") else 2)
    if c.ffn == "moe":
        layer_ffn = d * c.n_experts + c.n_experts * layer_ffn
    attn = d * (c.n_heads * c.head_dim) * 2 + d * (c.kv_heads * c.head_dim) * 2
    total = c.vocab_size * d + (c.max_len * d if c.position == "learned" else 0)
    if c.arch in ("decoder", "encoder-decoder"):
        total += c.n_layers * (attn * (2 if c.arch == "encoder-decoder" else 1) + layer_ffn)
        total += 0 if c.tie_embeddings else c.target_vocab_size * d
        if c.arch == "encoder-decoder" and not c.share_src_tgt_embeddings:
            total += c.target_vocab_size * d
    if c.arch in ("encoder", "encoder-decoder"):
        total += c.encoder_layers * (attn + layer_ffn)
    return total


def memory_bytes(need: int = 0) -> int:
    """The memory of this machine a model may use: its RAM, plus the first GPU's memory when ``need`` bytes are more
    than the RAM and there is a GPU (asked only then, so that a check that passes never starts CUDA)."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 2**62
    if need <= ram:
        return ram
    return ram + (torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else 0)


def size_problem(c: ModelConfig, bytes_per_parameter: int, purpose: str) -> str | None:
    """``d_model=...: ...`` when a model of ``c`` cannot fit in this machine's memory (:func:`memory_bytes`) at
    ``bytes_per_parameter`` (4 to decode in float32; 16 to train with Adam: weights, gradients, two moments), else
    None. Only sizes beyond the machine are refused: the check is against a typo (``d_ff = 30720000``), not a budget.
    """
    n = estimated_parameters(c)
    need = n * bytes_per_parameter
    have = memory_bytes(need)
    if need <= have:
        return None
    keys = ["d_model", "d_ff", "n_layers", *(["n_encoder_layers"] if c.arch == "encoder-decoder" else []), "max_len",
            *(["n_experts"] if c.ffn == "moe" else [])]
    sizes = ", ".join(f"{k}={c.encoder_layers if k == 'n_encoder_layers' else getattr(c, k)}" for k in keys)
    return (f"{sizes}: about {n:.3g} parameters, {need / 2**30:,.0f} GiB to {purpose}, more than this machine's "
            f"{have / 2**30:,.0f} GiB; make the model smaller")
