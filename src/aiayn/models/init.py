"""Weight initialization: the paper's (Xavier, as tensor2tensor and torch.nn.Transformer), GPT-2's, DeepNorm's.

- "paper": Xavier-uniform matrices, zero biases, embeddings N(0, D^-1/2) (fairseq's choice for embeddings
  scaled by sqrt(D)), padding row zero.
- "gpt2": N(0, 0.02) everywhere, residual output projections N(0, 0.02 / sqrt(2 N)) (GPT-2 paper, section 2.3).
- DeepNorm (Wang et al. 2022): Xavier with gain beta on the FFN, value and output projections; alpha scales
  the residual (see :func:`deepnorm_constants`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from aiayn.config import ModelConfig
from aiayn.nn.attention import MultiHeadAttention
from aiayn.nn.feedforward import FeedForward


def deepnorm_constants(config: ModelConfig) -> dict[str, tuple[float, float]]:
    """(alpha, beta) per stack: {"encoder": ..., "decoder": ...}."""
    n, m = config.encoder_layers, config.n_layers
    if config.arch == "encoder-decoder":
        return {"encoder": (0.81 * (n**4 * m) ** (1 / 16), 0.87 * (n**4 * m) ** (-1 / 16)),
                "decoder": ((3 * m) ** 0.25, (12 * m) ** -0.25)}
    layers = n if config.arch == "encoder" else m
    ab = ((2 * layers) ** 0.25, (8 * layers) ** -0.25)
    return {"encoder": ab, "decoder": ab}


def _residual_out_modules(model: nn.Module) -> list[nn.Linear]:
    outs: list[nn.Linear] = []
    for mod in model.modules():
        if isinstance(mod, MultiHeadAttention):
            outs.append(mod.out_proj)
        elif isinstance(mod, FeedForward):
            outs.append(mod.w_out)
    return outs


@torch.no_grad()
def init_weights(model: nn.Module, config: ModelConfig) -> None:
    """Initialize ``model`` in place according to ``config.init`` (and DeepNorm when enabled)."""
    n_layers = config.n_layers + (config.encoder_layers if config.arch == "encoder-decoder" else 0)
    for mod in model.modules():
        if isinstance(mod, nn.Linear):
            if config.init == "paper":
                nn.init.xavier_uniform_(mod.weight)
            else:
                nn.init.normal_(mod.weight, 0.0, 0.02)
            if mod.bias is not None:
                nn.init.zeros_(mod.bias)
        elif isinstance(mod, nn.Embedding):
            std = config.d_model**-0.5 if config.init == "paper" else 0.02
            nn.init.normal_(mod.weight, 0.0, std)
            if mod.padding_idx is not None:
                mod.weight[mod.padding_idx].zero_()
    if config.init == "gpt2":
        for lin in _residual_out_modules(model):
            nn.init.normal_(lin.weight, 0.0, 0.02 / math.sqrt(2 * n_layers))
    if config.deepnorm:
        consts = deepnorm_constants(config)
        for stack_name in ("encoder", "decoder"):
            stack = getattr(model, stack_name, None)
            if stack is None:
                continue
            beta = consts[stack_name][1]
            for mod in stack.modules():
                if isinstance(mod, FeedForward):
                    nn.init.xavier_normal_(mod.w_in.weight, gain=beta)
                    nn.init.xavier_normal_(mod.w_out.weight, gain=beta)
                elif isinstance(mod, MultiHeadAttention):
                    nn.init.xavier_normal_(mod.out_proj.weight, gain=beta)
                    v_rows = mod.n_kv_heads * mod.head_dim
                    proj = mod.kv_proj if mod.cross else mod.qkv_proj
                    v = proj.weight[-v_rows:]
                    nn.init.xavier_normal_(v, gain=beta)
