"""A model's LayerNorm epsilon, where transformers' MarianMTModel and PegasusForConditionalGeneration fix it at 1e-5
(the paper's presets use 1e-6).

``LayerNorm_e(c * y) = LayerNorm_{e / c^2}(y)``: with the residual stream scaled by ``c = sqrt(1e-5 / eps)``, their
norms compute aiayn's. So the embeddings and the position tables are multiplied by ``c``, and so is every
sublayer's output (weights and biases). Post-LN (Marian): the norms write the stream too (times ``c``), and every
layer that reads it, the output layer included, has its weights divided by ``c``. Pre-LN (Pegasus): only the norms
read the stream, and their outputs are unscaled, so nothing else changes. The model computes the same logits up to
rounding.
"""

from __future__ import annotations

import math

from aiayn.hf.family import StateDict

#: the epsilon of every LayerNorm in transformers' Marian and Pegasus models
FIXED_EPS = 1e-5
#: tensors that write the residual stream in both layouts (the end of their names)
_WRITES = ("self_attn.out_proj.weight", "self_attn.out_proj.bias", "encoder_attn.out_proj.weight",
           "encoder_attn.out_proj.bias", "fc2.weight", "fc2.bias", "shared.weight", "embed_tokens.weight",
           "embed_positions.weight")
#: post-LN: the norms write it as well
_POST_WRITES = ("layer_norm.weight", "layer_norm.bias")
#: post-LN: the layers that read it
_POST_READS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "fc1.weight",
               "encoder_attn.q_proj.weight", "encoder_attn.k_proj.weight", "encoder_attn.v_proj.weight",
               "lm_head.weight")


def stream_scale(norm_eps: float) -> float:
    """The factor ``c`` by which the residual stream is scaled so that norms of epsilon 1e-5 compute ``norm_eps``'s."""
    return math.sqrt(FIXED_EPS / norm_eps)


def eps_rescaled(state: StateDict, norm_eps: float, pre_norm: bool) -> StateDict:
    """transformers' Marian or Pegasus state (an untied ``lm_head.weight``, the position tables and both
    ``embed_tokens.weight`` included) of a model whose norms use ``norm_eps``, rescaled so that norms of epsilon
    1e-5 compute the same; unchanged when ``norm_eps`` is 1e-5.

    Args:
        state: the tensors by transformers' names.
        norm_eps: the aiayn model's ``norm_eps``.
        pre_norm: the layout: pre-LN (Pegasus) or post-LN (Marian).
    """
    c = stream_scale(norm_eps)
    if c == 1.0:
        return state
    writes = _WRITES if pre_norm else _WRITES + _POST_WRITES
    reads = () if pre_norm else _POST_READS
    out = {}
    for key, value in state.items():
        if key.endswith(writes):
            out[key] = value * c
        elif key.endswith(reads):
            out[key] = value / c
        else:  # biases of projections into heads or the feed-forward width, final_logits_bias; pre-LN's norms
            out[key] = value
    return out
