"""What the CPU accelerator's fast paths support, stated as data: config values and module types.

A fast path runs only where :func:`unsupported` finds nothing; everything else takes the reference modules. A new
config field is unsupported until it is listed here: at its default value (which :data:`NEUTRAL` fields and listed
values cover) the model is what the fast paths were written for, at any other value they decline.
"""

from __future__ import annotations

from torch import nn

from aiayn.accel.support_table import unsupported_fields
from aiayn.config import ModelConfig
from aiayn.models.stack import TransformerStack
from aiayn.nn.attention import MultiHeadAttention
from aiayn.nn.cache import DecoderCache, SelfAttnCache
from aiayn.nn.feedforward import FeedForward
from aiayn.nn.layers import Residual, TransformerLayer
from aiayn.nn.norms import RMSNorm

#: the values of each architectural choice that every fast path (train and decode) implements
SUPPORTED: dict[str, tuple] = {
    "arch": ("encoder", "decoder", "encoder-decoder"),
    "activation": ("relu", "gelu", "silu", "swiglu", "geglu"),
    "ffn": ("dense",),  # a mixture of experts runs the reference modules
    "gelu_approximate": ("none", "tanh"),
    "norm": ("layernorm", "rmsnorm"),
    "norm_position": ("post", "pre"),
    "position": ("none", "sinusoidal", "learned", "rope", "alibi", "t5"),
    "sinusoidal_layout": ("interleaved", "halves"),
    "rope_scaling": ("none", "linear", "ntk", "yarn", "llama3"),
    "init": ("paper", "gpt2"),
    "pooling": ("cls", "mean"),
    "input": ("tokens",),  # images (patches) run the reference stack; their layers still take the kernels
    "deepnorm": (False, True),
    "bias": (False, True),
    "qkv_bias": (None, False, True),
    "scale_embeddings": (False, True),
    "embedding_norm": (False, True),
    "tie_embeddings": (False, True),
    "tied_output_scale": (False, True),
    "output_bias": (False, True),
    "share_src_tgt_embeddings": (False, True),
}

#: fields that are sizes, rates or ids: any value is supported (the fast paths read them from the modules)
NEUTRAL = frozenset({
    "vocab_size", "tgt_vocab_size", "d_model", "n_heads", "n_kv_heads", "n_layers", "n_encoder_layers", "d_ff",
    "max_len", "dropout", "attn_dropout", "ffn_dropout", "norm_eps", "rope_theta", "rope_scaling_factor",
    "rope_original_max_len", "rope_low_freq_factor", "rope_high_freq_factor", "t5_num_buckets", "t5_max_distance",
    "sliding_window", "pad_id", "n_classes", "n_token_labels", "n_token_types", "position_offset", "name",
    # read only when input="patches", which is declined
    "image_size", "patch_size", "channels",
    # read only when ffn="moe", which is declined
    "n_experts", "moe_top_k", "moe_capacity_factor", "moe_aux_loss_weight", "moe_z_loss_weight",
})

#: the module types a fast decoding step replaces, exactly (a subclass may change what the step would skip)
STEP_MODULES: tuple[type[nn.Module], ...] = (TransformerLayer, MultiHeadAttention, FeedForward, Residual,
                                             nn.LayerNorm, RMSNorm, nn.Identity, nn.Dropout, nn.Linear)


def unsupported(config: ModelConfig) -> list[str]:
    """The config's choices that the fast paths do not implement, as "field=value" strings (empty: all supported)."""
    return unsupported_fields(config, SUPPORTED, NEUTRAL)


def attention_supports(module: MultiHeadAttention) -> bool:
    """Whether the CPU attention kernel may compute ``module``'s attention: softmax attention without score
    soft-capping, through the reference or the fused backend (the tiled and FlexAttention backends run as they are)."""
    return module.kind == "softmax" and module.softcap is None and module.backend in ("auto", "reference", "sdpa")


def cache_supports(cache: DecoderCache) -> bool:
    """Whether a decoding step may read and write ``cache``: the core's full, time-major KV cache (not a rolling or a
    linear-attention cache)."""
    return type(cache) is DecoderCache and all(type(c) is SelfAttnCache for c in cache.self_attn)


def step_supports(stack: TransformerStack) -> bool:
    """Whether a decoding step may run ``stack``'s layers as a flat program: its config is supported and every module
    in it is of a type the step implements (or the accelerator's own substitute for one)."""
    if unsupported(stack.config):
        return False
    return all(_known_tree(layer) for layer in stack.layers)


def _known(cls: type) -> bool:
    """Whether ``cls`` is a step module or one of the accelerator's own (written for the step)."""
    return cls in STEP_MODULES or cls.__module__.startswith("aiayn.accel.")


def _known_tree(module: nn.Module) -> bool:
    """Whether ``module`` and the modules in it are :func:`_known`; the children of an accelerator's own module that
    is no core class's substitute (an :class:`~aiayn.accel.cpu.quantize.Int8Linear`'s packed parameters) are its
    internals and not looked at."""
    cls = type(module)
    if not _known(cls):
        return False
    if cls not in STEP_MODULES and not any(base in STEP_MODULES for base in cls.__mro__[1:]):
        return True
    return all(_known_tree(child) for child in module.children())
