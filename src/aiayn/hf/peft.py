"""LoRA adapters in Hugging Face PEFT's format: ``adapter_config.json`` + ``adapter_model.safetensors``.

PEFT names an adapter's tensors by the transformers module it adapts (``base_model.model.<module>.lora_A.weight``,
(r, in), and ``lora_B.weight``, (out, r)). Which transformers module holds which rows and columns of an aiayn
layer is not written down a second time here: it is read off the family's own key map (``state_to_hf``) by
tracing, where every element of each adapted weight is its own index (:func:`module_parts`). So every family the
converters write has adapters too, with what its map does to a weight: q, k and v split out of aiayn's fused
``qkv_proj``, GPT-2's ``Conv1D`` transposes, Marian's reordered width. An adapter on a layer that transformers keeps
in parts becomes one adapter per part, A's columns and B's rows picked as the weight's are (the same update,
exactly). Read back, the parts' adapters become one adapter: their A's stacked (once, when they are all the same A)
and their B's placed in their rows.

Parameters trained beside the adapters (a new classification head) go to PEFT's ``modules_to_save``, under the
transformers names the same map gives them.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from aiayn.checkpoint import checkpoint_dir, read_state_dict, save_checkpoint
from aiayn.checkpoint.adapter import base_reference
from aiayn.checkpoint.layout import tokenizer_files
from aiayn.config import ModelConfig
from aiayn.errors import AiaynError
from aiayn.files import as_umask_allows
from aiayn.hf.family import FAMILIES, Family, supported_model_types
from aiayn.nn.lora import LoRALinear, adapter_entry, lora_layers, replace_layer, trainable_state
from aiayn.output_folder import CHECKPOINT, OutputFolder, check_output_folder, install, staging_folder
from aiayn.pretrained import load_pretrained

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."
#: PEFT's task type by aiayn task
TASK_TYPES = {"lm": "CAUSAL_LM", "translation": "SEQ_2_SEQ_LM", "classification": "SEQ_CLS",
              "embedding": "FEATURE_EXTRACTION", "mlm": "TOKEN_CLS"}


@dataclass(frozen=True)
class Part:
    """The share of an aiayn linear layer that one transformers module holds.

    Attributes:
        module: the transformers module's name (``model.layers.0.self_attn.k_proj``).
        rows: (out_hf,) the aiayn output rows it holds, in its own row order.
        cols: (in_hf,) the aiayn input columns it reads, in its own column order.
        transposed: its weight is stored (in, out), as GPT-2's ``Conv1D``.
    """

    module: str
    rows: Tensor
    cols: Tensor
    transposed: bool


def family_named(name: str) -> Family:
    """The registered converter family ``name`` ("gpt2", "bert-classifier", "t5", ...)."""
    supported_model_types()  # loads the built-in families
    if name not in FAMILIES:
        raise AiaynError(f"no transformers family {name!r}; aiayn converts {', '.join(FAMILIES)}")
    return FAMILIES[name]


def _plain_state(model: nn.Module) -> dict[str, Tensor]:
    """``model``'s state dict under the names of the model without adapters (``<layer>.base.weight`` ->
    ``<layer>.weight``; the adapters' own tensors left out)."""
    out = {}
    for key, value in model.state_dict().items():
        if ".lora_A." in key or ".lora_B." in key:
            continue
        out[key.replace(".base.weight", ".weight").replace(".base.bias", ".bias")] = value
    return out


def _trace(family: Family, config: ModelConfig, state: dict[str, Tensor], probed: list[str], strict: bool = True
           ) -> dict[str, tuple[str, Tensor]]:
    """transformers key -> (the probed aiayn tensor whose elements it holds, those elements' flat indices), by
    running the family's key map on a state where every probed tensor's elements are distinct numbers and every
    other tensor is -1.

    Raises:
        AiaynError: (``strict``; else the key is left out) a transformers tensor mixes a probed tensor's elements
            with others, or changes their values.
    """
    offsets, probe, start = {}, {}, 0
    for key, value in state.items():
        probe[key] = torch.tensor(-1.0, dtype=torch.float64).expand(value.shape)
    for key in probed:
        n = state[key].numel()
        probe[key] = (torch.arange(n, dtype=torch.float64) + start).view(state[key].shape)
        offsets[key], start = start, start + n
    found = {}
    for hf_key, tensor in family.state_to_hf(probe, config).items():
        t = tensor.to(torch.float64)
        if t.numel() == 0 or not bool((t >= 0).any()):
            continue
        key = max((k for k in probed if offsets[k] <= float(t.max())), key=lambda k: offsets[k])
        flat = t - offsets[key]
        if (not bool((t >= 0).all()) or bool((flat != flat.round()).any()) or bool((flat < 0).any())
                or float(flat.max()) >= state[key].numel()):
            if strict:
                raise AiaynError(f"{hf_key}: transformers' {family.name} layout mixes {key} with other tensors; an "
                                 "adapter on it cannot be written in PEFT's format")
            continue
        found[hf_key] = (key, flat.round().long())
    return found


def _whole(family: Family, config: ModelConfig, state: dict[str, Tensor], keys: list[str]) -> dict[str, str]:
    """aiayn tensor -> the transformers key that holds it whole and as it is, for those of ``keys`` that one does."""
    return {key: hf_key for hf_key, (key, flat) in _trace(family, config, state, keys, strict=False).items()
            if flat.shape == state[key].shape and torch.equal(flat.flatten(), torch.arange(state[key].numel()))}


def _part(module: str, flat: Tensor, in_features: int) -> Part:
    """The rows and columns of an aiayn weight (out, in) that a transformers weight of flat indices holds."""
    if flat.dim() != 2:
        raise AiaynError(f"{module}: holds an adapted weight as a {flat.dim()}-d tensor; PEFT adapts 2-d weights")
    row, col = flat // in_features, flat % in_features
    for transposed, rows, cols in ((False, row[:, 0], col[0, :]), (True, row[0, :], col[:, 0])):
        expect = rows[:, None] * in_features + cols[None, :]
        if torch.equal(expect.t() if transposed else expect, flat):
            return Part(module, rows, cols, transposed)
    raise AiaynError(f"{module}: its weight is not a choice of rows and columns of aiayn's; an adapter on it cannot "
                     "be written in PEFT's format")


def module_parts(family: Family, config: ModelConfig, state: dict[str, Tensor], layers: list[str]
                 ) -> dict[str, list[Part]]:
    """aiayn linear layer (name, without ``.weight``) -> the transformers modules that hold it, by tracing the
    family's key map (see the module docstring). A tied output layer, which transformers stores as its input
    embedding, is transformers' ``lm_head``.

    Raises:
        AiaynError: a layer no transformers module holds, or holds in a way an adapter cannot follow.
    """
    weights = [f"{name}.weight" for name in layers]
    traced = _trace(family, config, state, weights)
    parts: dict[str, list[Part]] = {name: [] for name in layers}
    for hf_key, (key, flat) in traced.items():
        if not hf_key.endswith(".weight"):
            raise AiaynError(f"{hf_key}: transformers holds {key} in a tensor that is not a module's weight")
        name = key.removesuffix(".weight")
        parts[name].append(_part(hf_key.removesuffix(".weight"), flat, state[key].shape[1]))
    for name, found in parts.items():
        if not found:
            if name == "lm_head.proj" and config.tie_embeddings:
                out, d = state[f"{name}.weight"].shape
                found.append(Part("lm_head", torch.arange(out), torch.arange(d), False))
                continue
            raise AiaynError(f"{name}: no module of transformers' {family.name} model holds this layer; adapt "
                             "another layer")
    return parts


def _saved_modules(family: Family, config: ModelConfig, state: dict[str, Tensor], trained: list[str]
                   ) -> dict[str, str]:
    """aiayn tensor -> transformers key, for tensors trained beside the adapters (each held whole, as it is).

    Raises:
        AiaynError: a trained tensor that transformers holds in parts, or not at all.
    """
    out = _whole(family, config, state, trained)
    missing = sorted(set(trained) - set(out))
    if missing:
        raise AiaynError(f"{missing[0]}: trained beside the adapters, but transformers' {family.name} model does not "
                         "hold it whole (PEFT's modules_to_save keeps whole modules)")
    return out


def to_peft(model: nn.Module, config: ModelConfig, family: str | Family
            ) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """An adapted model's adapters (and the parameters trained beside them) as PEFT's tensors and the
    ``adapter_config.json`` fields that describe them."""
    fam = family_named(family) if isinstance(family, str) else family
    layers = lora_layers(model)
    if not layers:
        raise AiaynError("the model has no LoRA adapters (aiayn.nn.lora.add_lora puts them on)")
    state = _plain_state(model)
    parts = module_parts(fam, config, state, list(layers))
    tensors: dict[str, Tensor] = {}
    ranks, alphas, targets = {}, {}, set()
    for name, layer in layers.items():
        a, b = layer.lora_A.weight.detach(), layer.lora_B.weight.detach()
        for part in parts[name]:
            tensors[f"{PREFIX}{part.module}.lora_A.weight"] = a[:, part.cols].contiguous()
            tensors[f"{PREFIX}{part.module}.lora_B.weight"] = b[part.rows].contiguous()
            ranks[part.module], alphas[part.module] = layer.rank, layer.scaling * layer.rank
            targets.add(part.module.rsplit(".", 1)[-1])
    trained = [n for n, p in model.named_parameters() if p.requires_grad and ".lora_" not in n]
    saved = _saved_modules(fam, config, state, trained) if trained else {}
    if fam.task == "classification":  # PEFT's SEQ_CLS reads its classifier from the adapter folder, trained or not
        others = [k for k in state if k not in saved]
        saved.update({k: hf for k, hf in _whole(fam, config, state, others).items()
                      if hf.startswith(("classifier.", "score."))})
    for key, hf_key in saved.items():
        tensors[PREFIX + hf_key] = state[key].detach().contiguous()
    rank = max(set(ranks.values()), key=list(ranks.values()).count)
    alpha = max(set(alphas.values()), key=list(alphas.values()).count)
    task = TASK_TYPES.get(fam.task)
    fields = {"peft_type": "LORA", "task_type": task, "r": rank, "lora_alpha": alpha, "lora_dropout": 0.0,
              "target_modules": sorted(targets), "bias": "none", "inference_mode": True,
              "fan_in_fan_out": any(p.transposed for ps in parts.values() for p in ps),
              "modules_to_save": sorted({k.rsplit(".", 1)[0] for k in saved.values()}) or None,
              "rank_pattern": {m: r for m, r in ranks.items() if r != rank},
              "alpha_pattern": {m: a for m, a in alphas.items() if a != alpha}}
    return tensors, fields


def save_peft(model: nn.Module, config: ModelConfig, family: str | Family, folder: str | Path,
              base_model: str | None = None) -> Path:
    """Write ``folder/adapter_config.json`` and ``folder/adapter_model.safetensors``, which
    ``peft.PeftModel.from_pretrained(hf_model, folder)`` loads onto the base model exported by ``--to-hf``."""
    tensors, fields = to_peft(model, config, family)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    as_umask_allows(folder / ADAPTER_WEIGHTS)
    (folder / ADAPTER_CONFIG).write_text(json.dumps({**fields, "base_model_name_or_path": base_model}, indent=2)
                                         + "\n", encoding="utf-8")
    return folder


def write_adapter_folder(checkpoint: Path, config: ModelConfig, family: Family, into: OutputFolder) -> Path:
    """``aiayn convert --to-hf`` of a LoRA run's checkpoint: its adapters as a PEFT folder at ``into`` (written
    beside and renamed into place, as every export), naming the base checkpoint in ``base_model_name_or_path``.

    Raises:
        AiaynError: the base is missing or another one; a layer transformers' model does not hold.
    """
    pre = load_pretrained(checkpoint, accel="none", merge=False)
    base = pre.meta["adapter"].get("base", {}).get("checkpoint")
    if base is not None:  # what the run trained besides the adapters: the checkpoint's own other tensors
        own = {k for k in read_state_dict(checkpoint) if ".lora_" not in k}
        for name, p in pre.model.named_parameters():
            p.requires_grad_(name in own)
    tmp = staging_folder(into.path)
    try:
        save_peft(pre.model, config, family, tmp, base_model=base)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return install(tmp, into)


def read_peft(folder: str | Path) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """A PEFT LoRA folder's config and tensors (keys without ``base_model.model.`` and the adapter's name).

    Raises:
        AiaynError: not a PEFT folder, not a plain LoRA adapter.
    """
    folder = Path(folder)
    try:
        fields = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise AiaynError(f"{folder / ADAPTER_CONFIG}: not a PEFT adapter config ({e})") from None
    if not isinstance(fields, dict) or fields.get("peft_type") != "LORA":
        got = fields.get("peft_type") if isinstance(fields, dict) else None
        raise AiaynError(f"{folder / ADAPTER_CONFIG}: peft_type {got!r}; only LORA adapters are read")
    if fields.get("use_rslora") or fields.get("use_dora"):
        raise AiaynError(f"{folder / ADAPTER_CONFIG}: rsLoRA and DoRA adapters are not read; plain LoRA only")
    if fields.get("bias", "none") != "none":
        raise AiaynError(f"{folder / ADAPTER_CONFIG}: bias={fields['bias']!r}; adapters that train biases are not "
                         "read (bias = \"none\" only)")
    try:
        raw = load_file(str(folder / ADAPTER_WEIGHTS))
    except (OSError, ValueError) as e:
        raise AiaynError(f"{folder / ADAPTER_WEIGHTS}: cannot read the adapter's tensors ({e})") from None
    return fields, {k.removeprefix(PREFIX).replace(".default", ""): v for k, v in raw.items()}


def _scaling(fields: dict[str, Any], module: str) -> tuple[int, float]:
    """(rank, alpha / rank) of one module, from the config's defaults and its rank and alpha patterns."""
    short = module.rsplit(".", 1)[-1]
    ranks, alphas = fields.get("rank_pattern") or {}, fields.get("alpha_pattern") or {}
    r = ranks.get(module, ranks.get(short, fields["r"]))
    return r, alphas.get(module, alphas.get(short, fields["lora_alpha"])) / r


def _one_adapter(base: nn.Linear, found: list[tuple[Part, Tensor, Tensor, float]]) -> LoRALinear:
    """One aiayn adapter of the same update as the parts' adapters (A (r, in_hf), B (out_hf, r), scaling)."""
    scaling = found[0][3]
    a_parts = []
    for part, a, _, _ in found:
        full = a.new_zeros(a.shape[0], base.in_features)
        full[:, part.cols] = a
        a_parts.append(full)
    shared = all(x.shape == a_parts[0].shape and torch.equal(x, a_parts[0]) for x in a_parts)
    a = a_parts[0] if shared else torch.cat(a_parts)
    b = a.new_zeros(base.out_features, a.shape[0])
    col = 0
    for (part, _, b_part, s), _ in zip(found, a_parts):
        width = b_part.shape[1]
        b[part.rows, slice(0, width) if shared else slice(col, col + width)] = b_part * (s / scaling)
        col += width
    layer = LoRALinear(base, a.shape[0], scaling)
    with torch.no_grad():
        layer.lora_A.weight.copy_(a)
        layer.lora_B.weight.copy_(b)
    return layer


def load_peft(model: nn.Module, config: ModelConfig, family: str | Family, folder: str | Path) -> list[str]:
    """Put the LoRA adapters of a PEFT folder on ``model`` (an aiayn model of the base), in place, and its
    ``modules_to_save`` tensors into the model; the adapted layers' names.

    Raises:
        AiaynError: not a LoRA folder, a module this family's model does not hold, shapes that do not fit the model.
    """
    fam = family_named(family) if isinstance(family, str) else family
    folder = Path(folder)
    fields, tensors = read_peft(folder)
    state = _plain_state(model)
    linears = [n for n, m in model.named_modules() if type(m) is nn.Linear and f"{n}.weight" in state]
    traced = _trace(fam, config, state, [f"{n}.weight" for n in linears])
    by_module: dict[str, list[Part]] = {}
    for hf_key, (key, flat) in traced.items():
        if hf_key.endswith(".weight"):
            by_module.setdefault(key.removesuffix(".weight"), []).append(
                _part(hf_key.removesuffix(".weight"), flat, state[key].shape[1]))
    if config.tie_embeddings and "lm_head.proj" in linears and "lm_head.proj" not in by_module:
        out, d = state["lm_head.proj.weight"].shape
        by_module["lm_head.proj"] = [Part("lm_head", torch.arange(out), torch.arange(d), False)]
    done, used = [], set()
    for name, parts in sorted(by_module.items()):
        found = []
        for part in parts:
            a_key, b_key = f"{part.module}.lora_A.weight", f"{part.module}.lora_B.weight"
            if a_key not in tensors:
                continue
            a, b = tensors[a_key], tensors[b_key] if b_key in tensors else None
            if b is None or a.shape[1] != part.cols.numel() or b.shape[0] != part.rows.numel():
                raise AiaynError(f"{folder / ADAPTER_WEIGHTS}: the adapter of {part.module} does not fit the model's "
                                 f"layer ({part.rows.numel()}, {part.cols.numel()}): an adapter for another base")
            found.append((part, a, b, _scaling(fields, part.module)[1]))
            used.update((a_key, b_key))
        if found:
            replace_layer(model, name, _one_adapter(model.get_submodule(name), found))
            done.append(name)
    used |= _load_saved_modules(model, fam, config, state, tensors, folder)
    left = sorted(set(tensors) - used)
    if left:
        raise AiaynError(f"{folder / ADAPTER_WEIGHTS}: {left[0]} adapts a module that transformers' {fam.name} model "
                         "does not map to aiayn's layers: an adapter for another base")
    return done


def _load_saved_modules(model: nn.Module, family: Family, config: ModelConfig, state: dict[str, Tensor],
                        tensors: dict[str, Tensor], folder: Path) -> set[str]:
    """Copy a PEFT folder's ``modules_to_save`` tensors into ``model`` (made trainable, as PEFT trains them); the
    keys used."""
    loose = {k for k in tensors if ".lora_A." not in k and ".lora_B." not in k}
    if not loose:
        return set()
    params = dict(model.named_parameters())
    where = {hf: key for key, hf in _whole(family, config, state, [k for k in state if k in params]).items()}
    for k in loose & set(where):
        target = params[where[k]]
        if target.shape != tensors[k].shape:
            raise AiaynError(f"{folder / ADAPTER_WEIGHTS}: {k} is {tuple(tensors[k].shape)}, the model's "
                             f"{where[k]} {tuple(target.shape)}: an adapter for another base")
        with torch.no_grad():
            target.copy_(tensors[k])
        target.requires_grad_(True)
    return loose & set(where)


def adapter_checkpoint(folder: str | Path, base: str | Path, out: str | Path, family: Family, *,
                       overwrite: bool = False) -> Path:
    """``aiayn convert --from-hf PEFT_FOLDER --base BASE``: a PEFT LoRA folder as an aiayn adapter checkpoint on
    the aiayn checkpoint ``base`` (:mod:`aiayn.checkpoint.adapter`: the adapters and ``modules_to_save`` alone,
    the base named by its manifest hash, the base's tokenizer files).

    Raises:
        AiaynError: ``base`` is an adapter checkpoint itself; the folder is not a LoRA folder or adapts another
            model; ``out`` may not be written (:func:`~aiayn.output_folder.check_output_folder`).
    """
    into = check_output_folder(out, CHECKPOINT, overwrite=overwrite, sources=[folder, base])
    pre = load_pretrained(base, accel="none")
    if pre.meta.get("adapter"):
        raise AiaynError(f"{base}: is an adapter checkpoint itself; give the plain base (or aiayn merge-adapter it "
                         "first)")
    for p in pre.model.parameters():
        p.requires_grad_(False)
    load_peft(pre.model, pre.config, family, folder)
    meta = {**pre.meta, "adapter": {**adapter_entry(pre.model), "base": base_reference(base)}}
    return save_checkpoint(out, trainable_state(pre.model), meta, tokenizer_writer=tokenizer_files(
        checkpoint_dir(base)), into=into)
