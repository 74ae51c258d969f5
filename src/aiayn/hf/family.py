"""The interface every converted family follows, and the registry of families.

A family is a key map and a config map between a Hugging Face transformers checkpoint and an aiayn one; it holds
no model code. Converting a folder reads its ``config.json`` and weights, asks the family for aiayn's config and
state dict, and writes an aiayn checkpoint; converting back asks it for transformers' config and state dict.

Four functions make a family (``hf`` is transformers' ``config.json`` as a dict, ``state`` a state dict of
tensors; ``meta`` is the rest of an aiayn checkpoint's ``config.json``: task entries such as ``block_size``,
``labels``, ``decode``):

``config_from_hf(hf) -> (model_fields, meta)``
    ``model_fields`` is a dict of :class:`~aiayn.config.ModelConfig` fields; ``meta`` the task's checkpoint entries
    that the transformers config implies (for example ``block_size`` for an LM, ``labels`` / ``label_names`` for a
    classifier, ``decode`` for translation). The converter adds ``task``, ``model`` and ``tokenizers`` itself.
    Raises :class:`~aiayn.errors.AiaynError` naming each setting aiayn cannot represent (:func:`refuse`).
``state_from_hf(state, config, hf) -> state``
    transformers' tensors (as float32) -> aiayn's ``model.state_dict()`` keys (fused projections concatenated,
    transposes done). Of a group of tied aiayn parameters (``embed.weight``, ``decoder.embed.weight``,
    ``lm_head.proj.weight``) any one name suffices: the converter fills in the others. Read the tensors through a
    :class:`StateReader`, whose :meth:`~StateReader.done` refuses tensors that no rule used.
``config_to_hf(config, meta) -> hf``
    aiayn's config -> transformers' ``config.json`` entries (``model_type`` and ``architectures`` included; the
    special token ids are added by the converter from the checkpoint's tokenizer). ``meta["hf_config"]``, when
    present, is the ``config.json`` the checkpoint was converted from; the converter starts from it, so the map
    needs to give only what the model's shape decides. Raises :class:`~aiayn.errors.AiaynError` (:func:`refuse`)
    when the config is not this family's: ``to_hf`` tries every family of the checkpoint's task and reports each
    one's reasons when none fits.
``state_to_hf(state, config) -> state``
    aiayn's state dict (every name, tied ones included) -> transformers' keys. Tied weights appear once, under the
    name transformers keeps (the input embedding); transformers ties the rest on loading.

The tokenizer travels beside the weights: ``from_hf`` reads the folder's tokenizer files into one aiayn
tokenizer (:class:`~aiayn.tokenize.PretrainedTokenizer`, ``decoder_start_id`` from ``decoder_start_token_id``) and
stores it under every role the task reads (lm, mlm, classification: ``text``; translation: ``src`` and ``tgt``).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from aiayn.config import ModelConfig
from aiayn.errors import AiaynError

StateDict = dict[str, Tensor]
ConfigFromHF = Callable[[dict[str, Any]], tuple[dict[str, Any], dict[str, Any]]]
StateFromHF = Callable[[StateDict, ModelConfig, dict[str, Any]], StateDict]
ConfigToHF = Callable[[ModelConfig, dict[str, Any]], dict[str, Any]]
StateToHF = Callable[[StateDict, ModelConfig], StateDict]


@dataclass(frozen=True)
class Family:
    """One transformers model family, as a config map and a key map.

    Attributes:
        name: the family's name in messages and docs ("gpt2", "llama", "bert", ...).
        model_types: transformers ``model_type`` values this family reads (the first is the one it writes).
        task: the aiayn task of the converted checkpoint: "lm", "translation", "classification", "mlm" or
            "embedding".
        hf_class: the transformers class written into ``architectures`` ("GPT2LMHeadModel").
        config_from_hf, state_from_hf, config_to_hf, state_to_hf: the four maps (see the module docstring).
        architectures: further ``architectures`` names this family reads (the heads a folder may name); empty
            means any.
    """

    name: str
    model_types: tuple[str, ...]
    task: str
    hf_class: str
    config_from_hf: ConfigFromHF
    state_from_hf: StateFromHF
    config_to_hf: ConfigToHF
    state_to_hf: StateToHF
    architectures: tuple[str, ...] = ()

    def reads(self, hf: dict[str, Any]) -> bool:
        """Whether this family converts the transformers config ``hf``."""
        if hf.get("model_type") not in self.model_types:
            return False
        archs = hf.get("architectures") or []
        return not self.architectures or not archs or any(a in self.architectures for a in archs)


#: every registered family, in registration order
FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Add ``family`` to :data:`FAMILIES` (under its name; a second family of that name replaces the first)."""
    FAMILIES[family.name] = family
    return family


def supported_model_types() -> list[str]:
    """Every transformers ``model_type`` some registered family reads, sorted."""
    _load_builtin()
    return sorted({t for f in FAMILIES.values() for t in f.model_types})


def family_for_hf(hf: dict[str, Any], source: str = "config.json") -> Family:
    """The family that converts the transformers config ``hf`` (read from ``source``).

    Raises:
        AiaynError: no family reads its ``model_type`` / ``architectures``; the message names it and the supported
            ones.
    """
    _load_builtin()
    for family in FAMILIES.values():
        if family.reads(hf):
            return family
    model_type = hf.get("model_type")
    archs = ", ".join(hf.get("architectures") or []) or "none named"
    known = ", ".join(supported_model_types())
    if any(model_type in f.model_types for f in FAMILIES.values()):
        heads = ", ".join(sorted({a for f in FAMILIES.values() if model_type in f.model_types
                                  for a in (f.hf_class, *f.architectures)}))
        raise AiaynError(f"{source}: model_type {model_type!r} with architectures {archs} is not supported; "
                         f"aiayn converts {model_type} as {heads}")
    raise AiaynError(f"{source}: model_type {model_type!r} is not supported; aiayn converts these model types: "
                     f"{known}")


def _load_builtin() -> None:
    """Import the built-in families (each registers itself on import)."""
    for module in BUILTIN_MODULES:
        importlib.import_module(module)


class StateReader:
    """transformers' tensors, taken one by one by a family's key map; what no rule took is an error.

    Args:
        state: the folder's tensors.
        ignore: regular expressions of keys that carry nothing aiayn needs (buffers such as GPT-2's
            ``attn.masked_bias`` or LLaMA's ``rotary_emb.inv_freq``).
    """

    def __init__(self, state: StateDict, ignore: tuple[str, ...] = ()) -> None:
        self._state = {k: v for k, v in state.items() if not any(re.search(p, k) for p in ignore)}
        self._used: set[str] = set()

    def __contains__(self, key: str) -> bool:
        return key in self._state

    def take(self, key: str) -> Tensor:
        """The tensor ``key`` as float32 (an AiaynError naming it when the folder lacks it)."""
        if key not in self._state:
            raise AiaynError(f"the weights lack {key!r}; the folder is incomplete or not of this model type: "
                             "download it again")
        self._used.add(key)
        return self._state[key].float()

    def done(self) -> None:
        """Raise an AiaynError naming the tensors no rule took (a config that does not describe the weights)."""
        left = sorted(set(self._state) - self._used)
        if left:
            shown = ", ".join(left[:8]) + (f" and {len(left) - 8} more" if len(left) > 8 else "")
            raise AiaynError(f"the weights hold tensors this model type does not have ({shown}); config.json does "
                             "not describe these weights: download the folder again")


def mismatches(config: ModelConfig, wanted: dict[str, Any], family: str) -> list[str]:
    """``field=value: <family> has <wanted>`` for each field of ``config`` that differs from ``wanted`` (a value,
    or a tuple of allowed values)."""
    out = []
    for name, want in wanted.items():
        have = getattr(config, name)
        if not (have in want if isinstance(want, tuple) else have == want):
            shown = " or ".join(repr(w) for w in want) if isinstance(want, tuple) else repr(want)
            out.append(f"{name}={have!r}: {family} has {shown}")
    return out


def refuse(family: str, problems: list[str]) -> None:
    """Raise one AiaynError listing ``problems`` (settings of one side the other cannot represent), if any."""
    if problems:
        raise AiaynError(f"{family}: cannot convert:\n  - " + "\n  - ".join(problems))


#: the modules that register the built-in families
BUILTIN_MODULES = ("aiayn.hf.decoders", "aiayn.hf.mixtral", "aiayn.hf.bert", "aiayn.hf.t5", "aiayn.hf.bart",
                   "aiayn.hf.pegasus", "aiayn.hf.backbones")
