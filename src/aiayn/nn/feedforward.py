"""Position-wise feed-forward networks: FFN(x) = max(0, x W1 + b1) W2 + b2 (paper eq. 2) and variants.

Gated variants (Shazeer 2020): SwiGLU(x) = (SiLU(x W_gate) * x W_up) W_down, GeGLU with GELU. The gate
and up projections are one fused matmul (``w_in`` of width 2 * d_ff, gate first).

GELU is exact, x Phi(x), unless ``gelu_approximate="tanh"``: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), GPT-2's
``gelu_new`` and T5 v1.1's gated GELU.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn


def gelu_tanh(x: Tensor) -> Tensor:
    """GELU with the tanh approximation, ``F.gelu(x, approximate="tanh")``."""
    return F.gelu(x, approximate="tanh")


_ACTS = {"relu": F.relu, "gelu": F.gelu, "silu": F.silu, "swiglu": F.silu, "geglu": F.gelu}
GELUS = {"none": F.gelu, "tanh": gelu_tanh}  # by ``gelu_approximate``


def activation_fn(activation: str, gelu_approximate: str = "none") -> Callable[[Tensor], Tensor]:
    """The pointwise function of ``activation`` (for a gated one, the gate's): GELU as ``gelu_approximate`` says."""
    if activation not in _ACTS:
        raise ValueError(f"unknown activation {activation!r}")
    if gelu_approximate not in GELUS:
        raise ValueError(f"unknown gelu_approximate {gelu_approximate!r}")
    return GELUS[gelu_approximate] if activation in ("gelu", "geglu") else _ACTS[activation]


class FeedForward(nn.Module):
    """Two-layer position-wise FFN with ReLU/GELU/SiLU, or a gated SwiGLU/GeGLU.

    Args:
        d_model: input/output width D.
        d_ff: hidden width.
        activation: "relu" | "gelu" | "silu" | "swiglu" | "geglu".
        dropout: dropout on the hidden activation (as in tensor2tensor's relu_dropout; 0 disables).
        bias: biases on the linear layers.
        gelu_approximate: "none" (exact GELU) or "tanh", for "gelu" and "geglu".
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", dropout: float = 0.0,
                 bias: bool = True, gelu_approximate: str = "none") -> None:
        super().__init__()
        self.gated = activation in ("swiglu", "geglu")
        self.activation, self.act = activation, activation_fn(activation, gelu_approximate)
        #: the activation by name where a product can apply it itself (ReLU, exact GELU; not a gated network)
        self.fusable = activation if activation == "relu" or (activation == "gelu" and gelu_approximate == "none") \
            else None
        self.w_in = nn.Linear(d_model, 2 * d_ff if self.gated else d_ff, bias=bias)
        self.w_out = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, D) -> (B, T, D).

        Where ``w_in`` lists this activation in its ``fused_activations`` (a kernel seam: an accelerator's packed
        linear layer), the product applies it in the same call.
        """
        if self.fusable is not None and self.fusable in getattr(self.w_in, "fused_activations", ()):
            h = self.w_in(x, activation=self.fusable)
            return self.w_out(self.dropout(h) if self.training else h)
        h = self.w_in(x)  # (B, T, d_ff), or (B, T, 2*d_ff) gated
        if self.gated:
            gate, up = h.chunk(2, dim=-1)
            h = self.act(gate) * up
        else:
            h = self.act(h)
        return self.w_out(self.dropout(h) if self.training else h)
