"""LoRA: low-rank adapters on a model's linear layers (Hu et al., 2021, "LoRA: Low-Rank Adaptation of Large
Language Models"), computed as Hugging Face PEFT computes them.

A layer ``y = x W^T + b`` becomes ``y = x W^T + b + scaling * dropout(x) A^T B^T`` with A (r, in) and B (out, r):
the base W and b are frozen, only A and B train. A starts as PEFT starts it (Kaiming-uniform with a = sqrt(5)) and B
at zero, so an adapted model computes exactly what its base does until it trains; ``scaling`` is ``alpha / r``.
:func:`add_lora` puts adapters on the linear layers whose names match, :func:`merge_lora` folds them into plain
layers (``W + scaling * B A``), which then decode at the base model's speed.

The modules keep PEFT's names (``lora_A``, ``lora_B``), so an adapter's state is ``<layer>.lora_A.weight`` and
``<layer>.lora_B.weight`` (:func:`lora_state`); :mod:`aiayn.hf.peft` maps those to PEFT's files.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

#: the target names of :func:`add_lora` by group: the attention's projections, the feed-forward layers
TARGET_GROUPS = {"attention": ("qkv_proj", "q_proj", "kv_proj", "out_proj"), "ffn": ("w_in", "w_out"),
                 "output": ("lm_head.proj",)}


class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus a trainable low-rank update (see the module docstring).

    Args:
        base: the layer adapted (its parameters are frozen).
        rank: r, the update's rank.
        scaling: the update's factor (``alpha / r``).
        dropout: dropout on the update's input (training only).
    """

    def __init__(self, base: nn.Linear, rank: int, scaling: float, dropout: float = 0.0) -> None:
        super().__init__()
        if rank < 1:
            raise ValueError(f"a LoRA rank must be at least 1; got {rank}")
        self.base, self.rank, self.scaling = base, rank, float(scaling)
        for p in base.parameters():
            p.requires_grad_(False)
        weight = base.weight
        self.lora_A = nn.Linear(base.in_features, rank, bias=False, device=weight.device, dtype=weight.dtype)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False, device=weight.device, dtype=weight.dtype)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def forward(self, x: Tensor) -> Tensor:
        """x (..., in) -> (..., out)."""
        return self.base(x) + self.lora_B(self.lora_A(self.dropout(x))) * self.scaling

    def merged(self) -> nn.Linear:
        """A plain layer computing the same: weight ``W + scaling * B A``, the base's bias."""
        base = self.base
        layer = nn.Linear(base.in_features, base.out_features, bias=base.bias is not None, device=base.weight.device,
                          dtype=base.weight.dtype)
        with torch.no_grad():
            layer.weight.copy_(folded(base.weight, self.lora_A.weight, self.lora_B.weight, self.scaling))
            if base.bias is not None:
                layer.bias.copy_(base.bias)
        return layer

    def extra_repr(self) -> str:
        return f"rank={self.rank}, scaling={self.scaling:g}"


def folded(weight: Tensor, a: Tensor, b: Tensor, scaling: float) -> Tensor:
    """``W + scaling * B A``: a weight (out, in) with its adapter, A (r, in) and B (out, r), folded in."""
    return weight + ((b.float() @ a.float()) * scaling).to(weight.dtype)


def replace_layer(model: nn.Module, name: str, module: nn.Module) -> None:
    """Put ``module`` where ``model``'s submodule ``name`` is."""
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, module)


def target_names(model: nn.Module, targets: Sequence[str]) -> list[str]:
    """The names of ``model``'s ``nn.Linear`` layers that ``targets`` pick: a group of :data:`TARGET_GROUPS`, a name
    ending (``"qkv_proj"`` matches every ``...qkv_proj``), or a regular expression over the full name
    (``re.fullmatch``)."""
    wanted = [t for target in targets for t in TARGET_GROUPS.get(target, (target,))]
    found = []
    for name, module in model.named_modules():
        if type(module) is not nn.Linear:
            continue
        if any(name == t or name.endswith("." + t) or _full_match(t, name) for t in wanted):
            found.append(name)
    return found


def _full_match(pattern: str, name: str) -> bool:
    try:
        return re.fullmatch(pattern, name) is not None
    except re.error:
        return False


def add_lora(model: nn.Module, rank: int = 8, alpha: float = 16.0, dropout: float = 0.0,
             targets: Sequence[str] = ("attention",), trainable: Iterable[str] = ()) -> list[str]:
    """Put LoRA adapters on ``model``'s linear layers named by ``targets`` (:func:`target_names`) and freeze
    everything else but the parameters whose names start with one of ``trainable`` (e.g. a task head).

    Args:
        model: any aiayn model (in place).
        rank, alpha, dropout: r, the scaling's numerator (scaling = alpha / r) and the dropout on the update's input.
        targets: which layers; default the attention's projections.
        trainable: name prefixes of parameters that train besides the adapters.
    Returns:
        The adapted layers' names.
    Raises:
        ValueError: no layer matches ``targets`` (the message lists the model's linear layers).
    """
    names = target_names(model, targets)
    if not names:
        linears = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if type(m) is nn.Linear})
        raise ValueError(f"no linear layer matches the LoRA targets {list(targets)}; this model's linear layers end "
                         f"in {', '.join(linears)} (or name a group: {', '.join(TARGET_GROUPS)})")
    too_small = [n for n in names
                 if rank > min(model.get_submodule(n).in_features, model.get_submodule(n).out_features)]
    if too_small:
        layer = model.get_submodule(too_small[0])
        raise ValueError(f"a LoRA rank of {rank} does not fit {too_small[0]} ({layer.out_features} x "
                         f"{layer.in_features}): a rank above min(out, in) = "
                         f"{min(layer.in_features, layer.out_features)} adds parameters, not expressiveness; lower the "
                         "rank")
    keep = tuple(trainable)
    for name, p in model.named_parameters():
        p.requires_grad_(bool(keep) and name.startswith(keep))
    for name in names:
        replace_layer(model, name, LoRALinear(model.get_submodule(name), rank, alpha / rank, dropout))
    return names


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    """Every adapted layer by name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def lora_state(model: nn.Module) -> dict[str, Tensor]:
    """The adapters' parameters: ``<layer>.lora_A.weight`` (r, in) and ``<layer>.lora_B.weight`` (out, r)."""
    out = {}
    for name, layer in lora_layers(model).items():
        out[f"{name}.lora_A.weight"] = layer.lora_A.weight.detach()
        out[f"{name}.lora_B.weight"] = layer.lora_B.weight.detach()
    return out


def trainable_state(model: nn.Module) -> dict[str, Tensor]:
    """The parameters that train (the adapters, and a head trained beside them) by name: what an adapter
    checkpoint holds."""
    return {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}


def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every adapter into its layer (``W + scaling * B A``), in place: a plain model, as fast as its base."""
    for name, layer in lora_layers(model).items():
        replace_layer(model, name, layer.merged())
    return model


def adapter_entry(model: nn.Module) -> dict[str, Any]:
    """``config.json``'s ``adapter`` entry of an adapted model: what :func:`restore_adapters` rebuilds its layers
    from (their weights come with the checkpoint's state). Layers of another rank or alpha than the first (an
    adapter read from PEFT's parts) are listed in ``rank_pattern`` as ``[rank, alpha]``."""
    layers = lora_layers(model)
    first = next(iter(layers.values()))
    rank, alpha = first.rank, first.scaling * first.rank
    entry: dict[str, Any] = {"kind": "lora", "rank": rank, "alpha": alpha, "layers": sorted(layers)}
    pattern = {n: [m.rank, m.scaling * m.rank] for n, m in layers.items()
               if (m.rank, m.scaling * m.rank) != (rank, alpha)}
    if pattern:
        entry["rank_pattern"] = pattern
    return entry


def restore_adapters(model: nn.Module, entry: dict[str, Any]) -> list[str]:
    """Put back on ``model`` (built from a checkpoint's config) the adapted layers its ``adapter`` entry names, so
    that the checkpoint's state loads into it."""
    pattern = entry.get("rank_pattern") or {}
    names = [n for n in entry["layers"] if n not in pattern]
    done = add_lora(model, int(entry["rank"]), float(entry["alpha"]), 0.0, names) if names else []
    for name, (rank, alpha) in pattern.items():
        done += add_lora(model, int(rank), float(alpha), 0.0, [name])
    return done
