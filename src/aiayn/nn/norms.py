"""LayerNorm (Ba et al. 2016, the paper's) and RMSNorm (Zhang & Sennrich 2019, LLaMA's)."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight, computed in fp32 and cast back (as LLaMA does)."""

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: Tensor) -> Tensor:
        """x (..., D) -> (..., D)."""
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def build_norm(kind: str, d: int, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    """A norm module over the last dimension: kind "layernorm" or "rmsnorm"."""
    if kind == "rmsnorm":
        return RMSNorm(d, eps)
    if kind == "layernorm":
        return nn.LayerNorm(d, eps=eps, bias=bias)
    raise ValueError(f"unknown norm {kind!r}")
