"""Position-wise feed-forward networks: FFN(x) = max(0, x W1 + b1) W2 + b2 (paper eq. 2) and variants.

Gated variants (Shazeer 2020): SwiGLU(x) = (SiLU(x W_gate) * x W_up) W_down, GeGLU with GELU. The gate
and up projections are one fused matmul (``w_in`` of width 2 * d_ff, gate first).
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.nn.dropout import Dropout
from aiayn.nn.packed import FUSED_ACTIVATIONS, PackedLinear

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
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, D) -> (B, T, D)."""
        return self.through(x, self.w_in, self.w_out)

    def through(self, x: Tensor, w_in: Callable[..., Tensor], w_out: Callable[[Tensor], Tensor]) -> Tensor:
        """The network with its two products given as callables: the module's own layers (:meth:`forward`), or
        the planned products of a decoding step (:mod:`aiayn.generate.fast_step`). ``w_in`` must take the
        ``activation=`` keyword where ``self.w_in`` is a :class:`PackedLinear` (the activation is then fused into
        the product at CPU inference).

        Args:
            x: (..., D).
        Returns:
            (..., D).
        """
        if isinstance(self.w_in, PackedLinear) and self.activation in FUSED_ACTIVATIONS:
            h = w_in(x, activation=self.activation)  # (..., d_ff); fused into the product at CPU inference
        else:
            h = w_in(x)  # (..., d_ff) or (..., 2*d_ff)
            if self.gated:
                gate, up = h.chunk(2, dim=-1)
                h = self.act(gate) * up
            else:
                h = self.act(h)
        if self.training and self.dropout.p > 0:
            h = self.dropout(h)
        return w_out(h)
