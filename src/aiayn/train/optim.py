"""Optimizers: Adam with the paper's settings, and AdamW with decay only on weight matrices.

The paper (section 5.3) uses Adam with ``beta1 = 0.9``, ``beta2 = 0.98`` and ``eps = 1e-9``. Modern
recipes use AdamW; following common practice (GPT-2/nanoGPT, HF), weight decay is applied only to
weight matrices of linear-like layers, never to norms, biases or embeddings.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from aiayn.errors import AiaynError

OPTIMIZERS = ("adam", "adamw")


def _no_decay_param_ids(model: nn.Module) -> set[int]:
    """Ids of parameters that must not be decayed: embeddings, norms, biases, and anything 1-D."""
    ids: set[int] = set()
    for module in model.modules():
        exempt_module = isinstance(module, nn.Embedding) or "Norm" in type(module).__name__
        for pname, p in module.named_parameters(recurse=False):
            if exempt_module or p.ndim < 2 or pname.endswith("bias"):
                ids.add(id(p))
    return ids


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Split a model's trainable parameters into a decayed and a non-decayed group.

    A parameter is *not* decayed if it belongs to an ``nn.Embedding``, to a module whose class name
    contains ``"Norm"``, has fewer than two dimensions, or its name ends in ``"bias"``. A parameter
    shared between modules (tied embedding and output projection) appears once, and is exempt if any
    of its owners exempts it (a tied embedding is not decayed).

    Args:
        model: the model.
        weight_decay: decay for the decayed group.

    Returns:
        ``[{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]``,
        omitting an empty group.
    """
    exempt = _no_decay_param_ids(model)
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    # named_parameters() deduplicates shared parameters by default.
    for _, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if id(p) in exempt else decay).append(p)
    groups = []
    if decay:
        groups.append({"params": decay, "weight_decay": weight_decay})
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def build_optimizer(
    model: nn.Module,
    name: str,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.98),
    eps: float = 1e-9,
    weight_decay: float = 0.0,
    fused: bool | None = None,
) -> torch.optim.Optimizer:
    """Build an optimizer over a model's trainable parameters.

    Args:
        model: the model; frozen parameters (``requires_grad=False``) are left out.
        name: ``"adam"`` (the paper: no decay, all parameters in one group) or ``"adamw"`` (decoupled
            weight decay on weight matrices only; see :func:`param_groups`).
        lr: base learning rate. With a multiplicative schedule (``LambdaLR``) this is the factor the
            schedule multiplies; for the paper's schedule use ``lr=1.0``.
        betas: Adam betas; the paper uses (0.9, 0.98).
        eps: Adam epsilon; the paper uses 1e-9.
        weight_decay: AdamW decay (ignored, and must be 0, for ``"adam"``).
        fused: use PyTorch's fused (single-kernel) Adam update. ``None`` (default) picks it whenever every
            parameter is a floating-point tensor on a device that supports it (CPU, CUDA, MPS, XPU), since one
            kernel over all parameters is much faster than the per-tensor loop.

    Returns:
        A ``torch.optim.Adam`` or ``torch.optim.AdamW``.

    Raises:
        AiaynError: unknown name, or a nonzero weight decay with plain Adam.
    """
    key = name.lower()
    if key not in OPTIMIZERS:
        raise AiaynError(f"unknown optimizer {name!r}; valid optimizers: {', '.join(OPTIMIZERS)}")
    if key == "adam":
        if weight_decay != 0.0:
            raise AiaynError(
                f"optimizer 'adam' with weight_decay={weight_decay}: Adam's L2 decay also hits norms and "
                "embeddings; use optimizer 'adamw' for weight decay, or set weight_decay to 0"
            )
        params: Iterable = [p for p in model.parameters() if p.requires_grad]
        return torch.optim.Adam(params, lr=lr, betas=betas, eps=eps, fused=_use_fused(model, fused))
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=betas, eps=eps,
                             fused=_use_fused(model, fused))


_FUSED_DEVICES = ("cpu", "cuda", "mps", "xpu")


def _use_fused(model: nn.Module, fused: bool | None) -> bool | None:
    """Resolve ``fused=None`` to True when every trainable parameter supports the fused Adam kernel."""
    if fused is not None:
        return fused
    params = [p for p in model.parameters() if p.requires_grad]
    ok = bool(params) and all(p.is_floating_point() and p.device.type in _FUSED_DEVICES for p in params)
    return True if ok else None
