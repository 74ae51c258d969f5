"""Mixture-of-experts feed-forward layer: a router sends each token to its top-k of several feed-forward networks.

Switch Transformer (Fedus et al. 2021) routes each token to one expert and weights its output by the router
probability; Mixtral (Jiang et al. 2024) routes to two and renormalises their probabilities to sum to 1:

    p = softmax(x W_r)                      router, a linear layer without bias (computed in float32)
    (w, e) = top-k of p                     w renormalised to sum to 1 when k > 1
    y = sum_j w_j FFN_{e_j}(x)

Dispatch is dropless by default: the (token, expert) assignments are sorted by expert and each expert runs once on
its own rows. With a capacity factor c, in training, each expert takes at most ceil(c * k * N / E) of the N tokens
of a forward pass; first choices come before second choices, and earlier tokens before later ones (Switch's order).
An assignment beyond capacity gives nothing: a token dropped by every expert passes through the residual unchanged.
Inference is always dropless, so that a token's output never depends on the other tokens of its batch (cached
decoding equals a full pass, a batch equals its rows alone).

Each forward pass leaves on the module, for training and logging:

- ``aux_loss``: the load-balancing loss ``E * sum_i f_i P_i`` (Switch eq. 4), f_i the fraction of tokens that have
  expert i among their top k (before capacity), P_i the mean router probability of expert i;
- ``z_loss``: the router z-loss ``mean(logsumexp(logits)^2)`` (ST-MoE, Zoph et al. 2022);
- ``load``: (E,) the share of the assignments each expert received (sums to 1; uniform is 1/E), detached;
- ``router_logits``: (N, E) the router's logits, detached.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from aiayn.nn.feedforward import FeedForward


class MoEFeedForward(nn.Module):
    """A router and ``n_experts`` :class:`~aiayn.nn.feedforward.FeedForward` experts; a drop-in for one FFN.

    Args:
        d_model: input/output width D.
        d_ff: each expert's hidden width.
        n_experts: number of experts E.
        top_k: experts per token k (1: Switch, 2: Mixtral).
        capacity_factor: None for dropless dispatch, else the per-expert capacity factor c (in training).
        activation, dropout, bias, gelu_approximate: as :class:`~aiayn.nn.feedforward.FeedForward`.
    """

    def __init__(self, d_model: int, d_ff: int, n_experts: int, top_k: int = 2,
                 capacity_factor: float | None = None, activation: str = "relu", dropout: float = 0.0,
                 bias: bool = True, gelu_approximate: str = "none") -> None:
        super().__init__()
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k={top_k} must be between 1 and n_experts={n_experts}")
        self.n_experts, self.top_k, self.capacity_factor = n_experts, top_k, capacity_factor
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.experts = nn.ModuleList(FeedForward(d_model, d_ff, activation, dropout, bias, gelu_approximate)
                                     for _ in range(n_experts))
        self.aux_loss: Tensor | None = None
        self.z_loss: Tensor | None = None
        self.load: Tensor | None = None
        self.router_logits: Tensor | None = None

    def capacity(self, n_tokens: int) -> int | None:
        """Most assignments one expert takes from ``n_tokens`` tokens (None: dropless)."""
        if self.capacity_factor is None:
            return None
        return math.ceil(self.capacity_factor * self.top_k * n_tokens / self.n_experts)

    def route(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """x (N, D) -> router logits (N, E), float32 probabilities (N, E), top-k weights (N, k), experts (N, k)."""
        logits = self.router(x)  # (N, E)
        probs = torch.softmax(logits.float(), dim=-1)  # (N, E)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)  # (N, k), (N, k)
        if self.top_k > 1:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return logits, probs, weights, experts

    def forward(self, x: Tensor) -> Tensor:
        """x (..., D) -> (..., D); sets ``aux_loss``, ``z_loss``, ``load`` and ``router_logits``."""
        shape = x.shape
        flat = x.reshape(-1, shape[-1])  # (N, D)
        n, e, k = flat.shape[0], self.n_experts, self.top_k
        logits, probs, weights, experts = self.route(flat)

        # assignments in priority order: every token's first choice, then every token's second, ...
        expert_ids = experts.t().reshape(-1)  # (k*N,)
        token_ids = torch.arange(n, device=x.device).repeat(k)  # (k*N,)
        gates = weights.t().reshape(-1)  # (k*N,)
        order = torch.argsort(expert_ids, stable=True)  # grouped by expert, priority kept within each
        counts = torch.bincount(expert_ids, minlength=e)  # (E,)
        capacity = self.capacity(n) if self.training else None
        if capacity is not None:
            starts = torch.cumsum(counts, 0) - counts  # (E,) first sorted slot of each expert
            rank = torch.arange(k * n, device=x.device) - starts[expert_ids[order]]  # slot within the expert
            order = order[rank < capacity]
            kept = counts.clamp(max=capacity)
        else:
            kept = counts
        token_ids, gates = token_ids[order], gates[order]

        out = torch.zeros_like(flat)  # (N, D)
        if torch.compiler.is_compiling() and capacity is None:  # a compiled step: no data-dependent sizes, so
            gate = torch.zeros_like(probs).scatter_(1, experts, weights)  # (N, E) every expert on every token, gated
            for expert in range(e):
                out += (self.experts[expert](flat) * gate[:, expert:expert + 1]).to(out.dtype)
        else:
            rows = []
            sizes = kept.tolist()  # one host sync per layer
            for expert, (tokens, size) in enumerate(zip(token_ids.split(sizes), sizes, strict=True)):
                if size:
                    rows.append(self.experts[expert](flat[tokens]))  # (n_e, D)
            if rows:
                y = torch.cat(rows) * gates[:, None]  # (kept assignments, D), in float32 as the gates
                out.index_add_(0, token_ids, y.to(out.dtype))

        fraction = counts.float() / max(n, 1)  # f_i: share of tokens with expert i among their top k
        self.aux_loss = e * torch.sum(fraction * probs.mean(dim=0))
        self.z_loss = torch.logsumexp(logits.float(), dim=-1).square().mean()
        self.load = (counts.float() / max(k * n, 1)).detach()
        self.router_logits = logits.detach()
        return out.reshape(shape)


def moe_layers(model: nn.Module) -> list[MoEFeedForward]:
    """The mixture-of-experts layers of ``model``, in module order."""
    return [m for m in model.modules() if isinstance(m, MoEFeedForward)]


def moe_loss(model: nn.Module, aux_weight: float, z_weight: float) -> Tensor | None:
    """``aux_weight * sum(aux_loss) + z_weight * sum(z_loss)`` over the model's MoE layers, from their last forward
    pass (None for a model without them)."""
    layers = [m for m in moe_layers(model) if m.aux_loss is not None]
    if not layers:
        return None
    return sum(aux_weight * m.aux_loss + z_weight * m.z_loss for m in layers)  # type: ignore[return-value]


def moe_load_stats(model: nn.Module) -> dict[str, float]:
    """The highest and lowest share of assignments any expert of any MoE layer received in the last forward pass
    (``moe_load_max``, ``moe_load_min``; uniform routing gives 1 / n_experts for both); empty without MoE layers."""
    loads = [m.load for m in moe_layers(model) if m.load is not None]
    if not loads:
        return {}
    every = torch.cat(loads)
    return {"moe_load_max": float(every.max()), "moe_load_min": float(every.min())}
