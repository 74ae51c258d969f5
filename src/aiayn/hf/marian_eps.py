"""A post-LN model's LayerNorm epsilon, where Marian's is fixed at 1e-5 (the paper's presets use 1e-6).

``LayerNorm_e(c * y) = LayerNorm_{e / c^2}(y)``: with the residual stream scaled by ``c = sqrt(1e-5 / eps)``, Marian's
norms compute aiayn's. So the embeddings and the position tables are multiplied by ``c``, every layer that reads the
stream has its weights divided by ``c``, every layer and norm that writes it has its weights and biases multiplied by
``c``, and the output layer reads the stream divided by ``c``. The model computes the same logits up to rounding.
"""

from __future__ import annotations

import math

from aiayn.hf.family import StateDict

#: the epsilon of every LayerNorm in transformers' MarianMTModel
MARIAN_EPS = 1e-5
#: transformers' Marian tensors that read the residual stream (the end of their names)
_READS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "fc1.weight",
          "encoder_attn.q_proj.weight", "encoder_attn.k_proj.weight", "encoder_attn.v_proj.weight", "lm_head.weight")
#: those that write it: the sublayers' outputs, the norms, the embeddings and the position tables
_WRITES = ("out_proj.weight", "out_proj.bias", "fc2.weight", "fc2.bias", "layer_norm.weight", "layer_norm.bias",
           "shared.weight", "embed_tokens.weight", "embed_positions.weight")


def stream_scale(norm_eps: float) -> float:
    """The factor ``c`` by which the residual stream is scaled so that Marian's norms compute ``norm_eps``'s."""
    return math.sqrt(MARIAN_EPS / norm_eps)


def eps_rescaled(state: StateDict, norm_eps: float) -> StateDict:
    """transformers' Marian state (untied output layer, position tables included) of the model whose norms use
    ``norm_eps``, rescaled so that Marian's norms (epsilon 1e-5) compute the same; unchanged when ``norm_eps`` is
    Marian's."""
    c = stream_scale(norm_eps)
    if c == 1.0:
        return state
    out = {}
    for key, value in state.items():
        if key.endswith(_READS):
            out[key] = value / c
        elif key.endswith(_WRITES):
            out[key] = value * c
        else:  # the biases of projections into heads or the feed-forward width, final_logits_bias
            out[key] = value
    return out
