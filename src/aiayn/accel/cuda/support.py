"""What the static decoding step supports, stated as data: config values and module types.

The step (:mod:`aiayn.accel.cuda.decode_step`) runs only where :func:`step_supports` says so; everything else takes
the reference modules. A config field not listed here is supported only at its default value, so a new option is
declined until someone implements it in the step and lists it.
"""

from __future__ import annotations

from torch import nn
from torch.nn.modules import module as torch_module

from aiayn.accel.support_table import unsupported_fields
from aiayn.config import ModelConfig
from aiayn.models.stack import TransformerStack
from aiayn.nn.attention import MultiHeadAttention
from aiayn.nn.feedforward import FeedForward
from aiayn.nn.layers import Residual, TransformerLayer
from aiayn.nn.norms import RMSNorm
from aiayn.nn.positions import LearnedPositions, RotaryEmbedding, SinusoidalPositions

#: the values of each architectural choice that the static step implements
SUPPORTED: dict[str, tuple] = {
    "arch": ("decoder", "encoder-decoder"),
    "activation": ("relu", "gelu", "silu", "swiglu", "geglu"),
    "ffn": ("dense",),  # a mixture of experts routes tokens by data-dependent shapes
    "gelu_approximate": ("none", "tanh"),
    "norm": ("layernorm", "rmsnorm"),
    "norm_position": ("post", "pre"),
    "position": ("none", "sinusoidal", "learned", "rope"),  # ALiBi and T5 biases need every key's position id
    "sinusoidal_layout": ("interleaved", "halves"),
    "rope_scaling": ("none", "linear", "ntk", "yarn", "llama3"),
    "attention_backend": ("auto", "reference", "sdpa"),
    "init": ("paper", "gpt2"),
    "pooling": ("cls", "mean"),
    "deepnorm": (False, True),
    "bias": (False, True),
    "qkv_bias": (None, False, True),
    "qk_norm": (False, True),
    "scale_embeddings": (False, True),
    "embedding_norm": (False, True),
    "tie_embeddings": (False, True),
    "tied_output_scale": (False, True),
    "output_bias": (False, True),
    "share_src_tgt_embeddings": (False, True),
}

#: fields that are sizes, rates or ids: any value is supported (the step reads them from the modules)
NEUTRAL = frozenset({
    "vocab_size", "tgt_vocab_size", "d_model", "n_heads", "n_kv_heads", "head_dim", "n_layers", "n_encoder_layers",
    "d_ff", "max_len", "dropout", "attn_dropout", "ffn_dropout", "norm_eps", "rope_theta", "rope_scaling_factor",
    "rope_original_max_len", "rope_low_freq_factor", "rope_high_freq_factor", "pad_id", "n_classes",
    "n_token_labels", "n_token_types", "position_offset", "name",
    # read only where their feature is on, which is declined
    "t5_num_buckets", "t5_max_distance", "n_experts", "moe_top_k", "moe_capacity_factor", "moe_aux_loss_weight",
    "moe_z_loss_weight", "sparse_block", "sparse_local_blocks", "sparse_stride", "local_window", "global_tokens",
})

#: the module types whose forward the step replaces, exactly (a subclass may change what the step would skip)
STEP_MODULES: tuple[type[nn.Module], ...] = (TransformerLayer, MultiHeadAttention, FeedForward, Residual,
                                             nn.LayerNorm, RMSNorm, nn.Identity, nn.Dropout, nn.Linear)


def unsupported(config: ModelConfig) -> list[str]:
    """The config's choices that the static step does not implement, as "field=value" strings (empty: all
    supported). Declined, among others: ALiBi and T5 biases, a sliding window, sparse attention patterns, linear
    attention, score soft-capping, mixtures of experts, the tiled and FlexAttention backends."""
    return unsupported_fields(config, SUPPORTED, NEUTRAL)


#: the position modules whose tables the step reads (None: no such module)
POSITION_MODULES: tuple[type | None, ...] = (type(None), SinusoidalPositions, LearnedPositions, RotaryEmbedding)


def step_supports(stack: TransformerStack) -> bool:
    """Whether the static step may run ``stack``'s layers: a causal stack, a supported config, position modules and
    every module in its layers of a type the step implements."""
    if not stack.causal or unsupported(stack.config):
        return False
    if type(stack.abs_pos) not in POSITION_MODULES or type(stack.rotary) not in POSITION_MODULES:
        return False
    return all(type(m) in STEP_MODULES for layer in stack.layers for m in layer.modules())


def modules_must_run(modules: list[nn.Module]) -> bool:
    """Whether a stack whose modules are ``modules`` (``list(stack.modules())``) must run them at this call: one is in
    training mode or has a forward (pre-)hook, a global forward hook is registered (the step would skip them), or an
    attention module is not :func:`attention_supports`."""
    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        return True
    for m in modules:
        if m.training or m._forward_hooks or m._forward_pre_hooks:
            return True
        if isinstance(m, MultiHeadAttention) and not attention_supports(m):
            return True
    return False


def attention_supports(module: MultiHeadAttention) -> bool:
    """Whether the step may compute ``module``'s attention: softmax, no score capping, reference or torch SDPA, and no
    recorder of attention weights attached (:mod:`aiayn.inspect` takes the modules)."""
    return (module.kind == "softmax" and module.softcap is None and module.backend in ("auto", "reference", "sdpa")
            and module.recorder is None)
