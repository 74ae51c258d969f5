"""Position-wise feed-forward networks: FFN(x) = max(0, x W1 + b1) W2 + b2 (paper eq. 2) and variants.

Gated variants (Shazeer 2020): SwiGLU(x) = (SiLU(x W_gate) * x W_up) W_down, GeGLU with GELU. The gate
and up projections are one fused matmul (``w_in`` of width 2 * d_ff, gate first).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

_ACTS = {"relu": F.relu, "gelu": F.gelu, "swiglu": F.silu, "geglu": F.gelu}


class FeedForward(nn.Module):
    """Two-layer position-wise FFN with ReLU/GELU, or a gated SwiGLU/GeGLU.

    Args:
        d_model: input/output width D.
        d_ff: hidden width.
        activation: "relu" | "gelu" | "swiglu" | "geglu".
        dropout: dropout on the hidden activation (as in tensor2tensor's relu_dropout; 0 disables).
        bias: biases on the linear layers.
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", dropout: float = 0.0,
                 bias: bool = True) -> None:
        super().__init__()
        if activation not in _ACTS:
            raise ValueError(f"unknown activation {activation!r}")
        self.gated = activation in ("swiglu", "geglu")
        self.activation, self.act = activation, _ACTS[activation]
        self.w_in = nn.Linear(d_model, 2 * d_ff if self.gated else d_ff, bias=bias)
        self.w_out = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, D) -> (B, T, D)."""
        h = self.w_in(x)  # (B, T, d_ff), or (B, T, 2*d_ff) gated
        if self.gated:
            gate, up = h.chunk(2, dim=-1)
            h = self.act(gate) * up
        else:
            h = self.act(h)
        return self.w_out(self.dropout(h))
