"""LoRA adapters in Hugging Face PEFT's format: ``adapter_config.json`` + ``adapter_model.safetensors``.

PEFT names an adapter's tensors by the transformers module it adapts (``base_model.model.<module>.lora_A.weight``,
(r, in), and ``lora_B.weight``, (out, r)). aiayn fuses some of the layers transformers keeps apart (LLaMA's
``q_proj``, ``k_proj``, ``v_proj`` are one ``qkv_proj``; ``gate_proj`` and ``up_proj`` one ``w_in``), so an adapter
on a fused layer is written as one adapter per part: the same A for each, B split by rows (the same update, exactly).
Read back, the parts' adapters become one adapter of rank r x parts (their A's stacked, their B's block-diagonal),
the same update again. GPT-2's ``Conv1D`` layers store their weight transposed, but PEFT's factors are the same as a
linear layer's (``fan_in_fan_out`` only changes how it merges), so they are copied as they are.

Families: GPT-2, and the LLaMA layout (LLaMA, Mistral, Qwen2).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.errors import AiaynError
from aiayn.nn.lora import LoRALinear, lora_layers, replace_layer

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."

#: a layer of aiayn's (the part of its name after ``decoder.layers.{i}.``) -> transformers' modules it holds, in row
#: order, and each one's share of the rows (a function of the config); one entry per family
Parts = list[tuple[str, Callable[[ModelConfig], int]]]


def _whole(config: ModelConfig) -> int:
    return -1  # the layer's every row


def _gpt2_layers() -> dict[str, Parts]:
    return {"self_attn.qkv_proj": [("attn.c_attn", _whole)], "self_attn.out_proj": [("attn.c_proj", _whole)],
            "ffn.w_in": [("mlp.c_fc", _whole)], "ffn.w_out": [("mlp.c_proj", _whole)]}


def _llama_layers() -> dict[str, Parts]:
    def q(c: ModelConfig) -> int:
        return c.n_heads * c.head_dim

    def kv(c: ModelConfig) -> int:
        return c.kv_heads * c.head_dim

    def ff(c: ModelConfig) -> int:
        return c.d_ff
    return {"self_attn.qkv_proj": [("self_attn.q_proj", q), ("self_attn.k_proj", kv), ("self_attn.v_proj", kv)],
            "self_attn.out_proj": [("self_attn.o_proj", _whole)],
            "ffn.w_in": [("mlp.gate_proj", ff), ("mlp.up_proj", ff)], "ffn.w_out": [("mlp.down_proj", _whole)]}


#: family -> (the transformers prefix of layer i, aiayn's layers and their transformers modules, PEFT's task type,
#: whether its layers are Conv1D)
FAMILIES: dict[str, tuple[str, dict[str, Parts], str, bool]] = {
    "gpt2": ("transformer.h.{i}.", _gpt2_layers(), "CAUSAL_LM", True),
    "llama": ("model.layers.{i}.", _llama_layers(), "CAUSAL_LM", False),
    "mistral": ("model.layers.{i}.", _llama_layers(), "CAUSAL_LM", False),
    "qwen2": ("model.layers.{i}.", _llama_layers(), "CAUSAL_LM", False),
}
_OUTPUT = ("lm_head.proj", "lm_head")


def _family(family: str) -> tuple[str, dict[str, Parts], str, bool]:
    if family not in FAMILIES:
        raise AiaynError(f"LoRA adapters in PEFT's format are written for {', '.join(FAMILIES)}; this model's family "
                         f"is {family!r}")
    return FAMILIES[family]


def _hf_modules(name: str, config: ModelConfig, family: str) -> list[tuple[str, int]]:
    """aiayn layer ``name`` -> [(transformers module, rows), ...]."""
    if name == _OUTPUT[0]:
        return [(_OUTPUT[1], -1)]
    prefix, layers, _, _ = _family(family)
    head, _, rest = name.partition("decoder.layers.")
    index, _, leaf = rest.partition(".")
    if head or not index.isdigit() or leaf not in layers:
        raise AiaynError(f"{name}: no transformers module of the {family} family holds this layer; adapt "
                         f"{', '.join(layers)} or the output layer")
    return [(prefix.format(i=index) + part, rows(config)) for part, rows in layers[leaf]]


def to_peft(model: nn.Module, config: ModelConfig, family: str) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """An adapted model's adapters as PEFT's tensors and the config fields that describe them."""
    layers = lora_layers(model)
    if not layers:
        raise AiaynError("the model has no LoRA adapters (aiayn.nn.lora.add_lora puts them on)")
    _, _, task, conv1d = _family(family)
    tensors: dict[str, Tensor] = {}
    ranks, alphas, targets = {}, {}, set()
    for name, layer in layers.items():
        parts = _hf_modules(name, config, family)
        sizes = [layer.out_features if rows < 0 else rows for _, rows in parts]
        for (module, _), b in zip(parts, layer.lora_B.weight.detach().split(sizes)):
            tensors[f"{PREFIX}{module}.lora_A.weight"] = layer.lora_A.weight.detach().clone()  # one copy each
            tensors[f"{PREFIX}{module}.lora_B.weight"] = b.contiguous()
            ranks[module], alphas[module] = layer.rank, layer.scaling * layer.rank
            targets.add(module.rsplit(".", 1)[-1])
    rank = max(set(ranks.values()), key=list(ranks.values()).count)
    alpha = max(set(alphas.values()), key=list(alphas.values()).count)
    fields = {"peft_type": "LORA", "task_type": task, "r": rank, "lora_alpha": alpha, "lora_dropout": 0.0,
              "target_modules": sorted(targets), "bias": "none", "fan_in_fan_out": conv1d, "inference_mode": True,
              "rank_pattern": {m: r for m, r in ranks.items() if r != rank},
              "alpha_pattern": {m: a for m, a in alphas.items() if a != alpha}}
    return tensors, fields


def save_peft(model: nn.Module, config: ModelConfig, family: str, folder: str | Path,
              base_model: str | None = None) -> Path:
    """Write ``folder/adapter_config.json`` and ``folder/adapter_model.safetensors``, which
    ``peft.PeftModel.from_pretrained(hf_model, folder)`` loads onto the base model exported by ``--to-hf``."""
    tensors, fields = to_peft(model, config, family)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / ADAPTER_WEIGHTS))
    (folder / ADAPTER_CONFIG).write_text(json.dumps({**fields, "base_model_name_or_path": base_model}, indent=2)
                                         + "\n", encoding="utf-8")
    return folder


def load_peft(model: nn.Module, config: ModelConfig, family: str, folder: str | Path) -> list[str]:
    """Put the LoRA adapters of a PEFT folder on ``model`` (an aiayn model of the base), in place; the adapted
    layers' names. Fused layers get one adapter of the parts' ranks summed (see the module docstring).

    Raises:
        AiaynError: not a LoRA folder, a module this family's layers do not hold, shapes that do not fit the model.
    """
    folder = Path(folder)
    try:
        fields = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise AiaynError(f"{folder / ADAPTER_CONFIG}: not a PEFT adapter config ({e})") from None
    if fields.get("peft_type") != "LORA":
        raise AiaynError(f"{folder / ADAPTER_CONFIG}: peft_type {fields.get('peft_type')!r}; only LORA adapters "
                         "are read")
    if fields.get("use_rslora") or fields.get("use_dora"):
        raise AiaynError(f"{folder / ADAPTER_CONFIG}: rsLoRA and DoRA adapters are not read; plain LoRA only")
    tensors = {k.removeprefix(PREFIX).replace(".default", ""): v for k, v in load_file(str(folder / ADAPTER_WEIGHTS)
                                                                                        ).items()}
    rank, alpha = fields["r"], fields["lora_alpha"]
    ranks, alphas = fields.get("rank_pattern") or {}, fields.get("alpha_pattern") or {}
    linears = {n for n, m in model.named_modules() if type(m) is nn.Linear}
    done, used = [], set()
    names = [n for n in linears if n.startswith("decoder.layers.") or n == _OUTPUT[0]]
    for name in sorted(names):
        try:
            parts = _hf_modules(name, config, family)
        except AiaynError:
            continue
        keys = [(f"{module}.lora_A.weight", f"{module}.lora_B.weight") for module, _ in parts]
        if not any(a in tensors for a, _ in keys):
            continue
        missing = [a for a, _ in keys if a not in tensors]
        if missing:
            raise AiaynError(f"{folder / ADAPTER_WEIGHTS}: {missing[0]} is missing; aiayn's {name} holds "
                             f"{', '.join(m for m, _ in parts)} together and adapts them all or none")
        a_parts = [tensors[a] for a, _ in keys]
        scalings = []
        for module, _ in parts:
            short = module.rsplit(".", 1)[-1]
            r = ranks.get(module, ranks.get(short, rank))
            scalings.append(alphas.get(module, alphas.get(short, alpha)) / r)
        b_parts = [tensors[b] * (s / scalings[0]) for (_, b), s in zip(keys, scalings)]
        used.update(k for pair in keys for k in pair)
        a, b = torch.cat(a_parts), torch.block_diag(*b_parts)
        base = model.get_submodule(name)
        if a.shape[1] != base.in_features or b.shape[0] != base.out_features:
            raise AiaynError(f"{folder / ADAPTER_WEIGHTS}: the adapter of {', '.join(m for m, _ in parts)} is "
                             f"{tuple(b.shape[:1]) + tuple(a.shape[1:])}, but the model's layer is "
                             f"({base.out_features}, {base.in_features}): an adapter for another base model")
        layer = LoRALinear(base, a.shape[0], scalings[0])
        with torch.no_grad():
            layer.lora_A.weight.copy_(a)
            layer.lora_B.weight.copy_(b)
        replace_layer(model, name, layer)
        done.append(name)
    left = sorted(set(tensors) - used)
    if left:
        raise AiaynError(f"{folder / ADAPTER_WEIGHTS}: {left[0]} adapts a module the {family} family does not map to "
                         "aiayn's layers")
    return done
