"""Freezing parameters for fine-tuning: ``[train] freeze = ["encoder.*", "*.embed.*"]``, and low-rank adapters on
a frozen model: ``[train] adapter = "lora"`` (:mod:`aiayn.nn.lora`).

Each pattern is matched with :func:`fnmatch.fnmatchcase` against the model's parameter names (as
``model.named_parameters()`` gives them: ``embed.weight``, ``encoder.layers.0.attn.qkv_proj.weight``, ...). A
matched parameter gets ``requires_grad=False``, so the optimizer leaves it out and its value never changes; a
pattern that matches nothing is an error listing some of the names.
"""

from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatchcase
from typing import Any

from torch import nn

from aiayn.checkpoint.adapter import base_reference
from aiayn.errors import AiaynError
from aiayn.nn.lora import adapter_entry, add_lora
from aiayn.train.recipe import resolve_path
from aiayn.train.train_config import TrainConfig


def freeze_parameters(model: nn.Module, patterns: Sequence[str]) -> list[str]:
    """Set ``requires_grad=False`` on every parameter whose name matches one of ``patterns``.

    Args:
        model: the model (tied parameters are listed once, under their first name, and also matched by the
            names of their other owners).
        patterns: fnmatch patterns, e.g. ``"encoder.*"`` or ``"*.embed.*"``.

    Returns:
        The names of the frozen parameters.

    Raises:
        AiaynError: a pattern matches no parameter (the message lists some names), or every parameter is frozen.
    """
    names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    unmatched = [p for p in patterns if not any(fnmatchcase(n, p) for n in names)]
    if unmatched:
        sample = ", ".join(names if len(names) <= 8 else [*names[:6], "...", *names[-2:]])
        raise AiaynError(f"[train] freeze: {', '.join(repr(p) for p in unmatched)} match(es) no parameter; the "
                         f"model's parameters are named like {sample} (fnmatch patterns, e.g. \"encoder.*\")")
    frozen = []
    for name, param in model.named_parameters(remove_duplicate=False):
        if any(fnmatchcase(name, p) for p in patterns) and param.requires_grad:
            param.requires_grad_(False)
            frozen.append(name)
    if not any(p.requires_grad for p in model.parameters()):
        raise AiaynError(f"[train] freeze = {list(patterns)} freezes every parameter; nothing would train: "
                         "narrow the patterns")
    return frozen


def add_lora_for_training(model: nn.Module, cfg: TrainConfig) -> list[str]:
    """The run's LoRA adapters (``[train] adapter = "lora"``, ``lora_rank``, ``lora_alpha``, ``lora_dropout``,
    ``lora_targets``, ``lora_trainable``) put on ``model``, everything else frozen; the adapted layers' names.

    Raises:
        AiaynError: the targets match no layer (the message lists the model's layers).
    """
    try:
        return add_lora(model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_targets or ["attention"],
                        cfg.lora_trainable or ())
    except ValueError as e:
        key = "lora_rank" if "LoRA rank" in str(e) else "lora_targets"
        raise AiaynError(f"[train] {key}: {e}") from None


def adapter_checkpoint_entry(model: nn.Module, recipe: dict[str, Any] | None) -> dict[str, Any]:
    """``config.json``'s ``adapter`` entry of a LoRA run (:mod:`aiayn.checkpoint.adapter`): the adapted layers, and
    the ``[model] init_from`` checkpoint as the base, by path and manifest hash, when the recipe names one (the
    run's checkpoints then hold the trained tensors alone)."""
    entry = adapter_entry(model)
    name = (recipe or {}).get("model", {}).get("init_from")
    if name:
        entry["base"] = base_reference(resolve_path(recipe, name))
    return entry
