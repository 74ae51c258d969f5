"""Hugging Face interop: transformers checkpoints to aiayn checkpoints and back.

::

    from aiayn.hf import from_hf, to_hf

    from_hf("path/to/gpt2", "runs/gpt2")          # a transformers folder (or a Hub name) -> an aiayn checkpoint
    load_pretrained("runs/gpt2")                  # ... that every aiayn command reads
    to_hf("runs/shakespeare-char/best", "hf/")    # an aiayn checkpoint -> a folder transformers loads

A family (:mod:`aiayn.hf.family`) is a config map and a key map; the folders are read and written by
:mod:`aiayn.hf.folder`. The command line is ``aiayn convert --from-hf PATH_OR_NAME --out DIR`` and
``aiayn convert --to-hf CHECKPOINT --out DIR``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from aiayn.checkpoint import checkpoint_dir, checkpoint_file, load_config, read_state_dict, save_checkpoint
from aiayn.config import ModelConfig
from aiayn.errors import AiaynError
from aiayn.hf import peft, sentence
from aiayn.hf.family import FAMILIES, Family, family_for_hf, register, supported_model_types
from aiayn.hf.folder import CONFIG, read_config, read_weights, weight_files, write_folder
from aiayn.hf.layernorm_eps import eps_rescaled
from aiayn.hf.marian_vocab import needs_pad_last, pad_last_config, pad_last_state, pad_last_tokenizer
from aiayn.hf.pegasus import start_as_pad
from aiayn.hf.vocab import read_tokenizer
from aiayn.models.build import build_model
from aiayn.output_folder import CHECKPOINT, TRANSFORMERS, check_output_folder
from aiayn.pretrained import adapted_model_state
from aiayn.tokenize import load_tokenizer

__all__ = ["FAMILIES", "Family", "from_hf", "from_peft", "read_chat_template", "register", "resolve_source",
           "supported_model_types", "to_hf"]

TOKENIZER_FILE = "tokenizer.json"
#: the tokenizer roles each task's checkpoint reads
ROLES = {"lm": ("text",), "mlm": ("text",), "classification": ("text",), "translation": ("src", "tgt")}
#: transformers' config entries that describe the file, not the model (dropped from a saved ``hf_config``)
_FILE_KEYS = ("architectures", "model_type", "transformers_version", "_name_or_path", "torch_dtype", "dtype")
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def resolve_source(path_or_name: str | Path) -> Path:
    """A transformers model folder: the path itself when it exists, else a Hub name from the local Hugging Face
    cache or downloaded (``huggingface_hub.snapshot_download``).

    Raises:
        AiaynError: neither a folder nor a name the cache holds or the Hub gives (offline: says so and how to
            fix it).
    """
    path = Path(path_or_name)
    if path.exists():
        return path
    name = str(path_or_name)
    if not _HUB_NAME.match(name) or name.startswith((".", "/", "~")):
        raise AiaynError(f"{name}: no such folder; pass a transformers model folder (config.json, weights and "
                         "tokenizer files) or a Hugging Face Hub name such as openai-community/gpt2")
    try:
        from huggingface_hub import snapshot_download  # optional: huggingface_hub
    except ImportError:
        raise AiaynError(f"{name}: no such folder, and reading a Hub name needs the huggingface_hub package; "
                         "install it, or download the model folder and pass its path") from None
    patterns = ["*.json", "*.safetensors", "*.txt", "*.model", "*.spm"]
    try:
        return Path(snapshot_download(name, allow_patterns=patterns, local_files_only=True))
    except Exception:  # not in the local cache: try the network  # noqa: BLE001
        pass
    try:
        folder = Path(snapshot_download(name, allow_patterns=patterns))
    except Exception as e:  # huggingface_hub raises HTTP, connection and offline errors of many kinds  # noqa: BLE001
        cause = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160]}" if str(e).strip() else type(e).__name__
        raise AiaynError(f"{name}: no such folder, not found in the local Hugging Face cache, and the Hub could not "
                         f"be reached or has no such model ({cause}); on a machine with network, download it "
                         f"(huggingface-cli download {name} --local-dir DIR, or save_pretrained) and pass the "
                         "folder's path") from None
    if not any(folder.glob("*.safetensors")):  # only .bin weights: fetch them too
        folder = Path(snapshot_download(name, allow_patterns=[*patterns, "*.bin"]))
    return folder


def _tie_names(model: nn.Module) -> list[list[str]]:
    """Groups of state-dict names that share one tensor (tied weights), each with more than one name."""
    groups: dict[int, list[str]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        groups.setdefault(id(tensor), []).append(name)
    return [g for g in groups.values() if len(g) > 1]


def _complete_ties(model: nn.Module, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """``state`` with every tied name filled from whichever name of its group the family gave."""
    state = dict(state)
    for group in _tie_names(model):
        given = [n for n in group if n in state]
        if given:
            for n in group:
                state.setdefault(n, state[given[0]])
    return state


def read_chat_template(folder: Path) -> str | None:
    """A transformers folder's chat template (``chat_template.jinja``, else ``tokenizer_config.json``'s
    ``chat_template``: a text, or a list of named ones whose ``default`` is taken), or None."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    config = folder / "tokenizer_config.json"
    if not config.is_file():
        return None
    try:
        template = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
        raise AiaynError(f"{config}: not a JSON object ({e}); fix or remove the file") from None
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def from_hf(path_or_name: str | Path, out: str | Path, *, overwrite: bool = False, tokenizer: bool = True) -> Path:
    """Convert a transformers model folder (or a Hub name) into an aiayn checkpoint directory.

    The checkpoint holds the model (float32), the folder's tokenizer (its own special ids) and the task's entries,
    so that :func:`aiayn.pretrained.load_pretrained` and every ``aiayn`` command read it; its ``config.json`` keeps
    the source's transformers config under ``hf_config`` (used by :func:`to_hf`).

    Args:
        path_or_name: a folder that ``save_pretrained`` wrote (``config.json``, weights, tokenizer files), or a Hub
            name found in the local cache or downloaded.
        out: the checkpoint directory to write: a new or empty folder, or an aiayn checkpoint (its files are
            replaced); any other folder only with ``overwrite`` (:func:`aiayn.output_folder.check_output_folder`).
        overwrite: write the checkpoint's files into a folder that holds other things (only files of the same
            names are replaced; nothing else there is changed or removed).
        tokenizer: read the folder's tokenizer (checked against config.json: :func:`aiayn.hf.vocab.read_tokenizer`);
            False converts the weights alone, and commands that need a tokenizer then say it is missing.

    Returns:
        The checkpoint directory.

    Raises:
        AiaynError: missing or corrupt files (named), an unsupported ``model_type`` (named, with the supported
            ones), settings aiayn cannot represent, no tokenizer files, a tokenizer that does not fit the model;
            ``out`` is the source (or inside it, or around it), or a folder of something else and ``overwrite`` is
            false.
    """
    if not Path(path_or_name).exists():  # a Hub name: refuse a bad ``out`` before downloading
        check_output_folder(out, CHECKPOINT, overwrite=overwrite)
    folder = resolve_source(path_or_name)
    into = check_output_folder(out, CHECKPOINT, overwrite=overwrite, sources=[folder])
    hf = read_config(folder)
    family = family_for_hf(hf, str(folder / CONFIG))
    try:
        fields, extra = family.config_from_hf(hf)
    except AiaynError as e:
        raise AiaynError(f"{folder / CONFIG}: {e}") from None
    extra = sentence.read_entries(folder, family.task, fields, extra)  # a sentence-transformers folder's pooling
    config = ModelConfig.from_dict(fields, f"{folder / CONFIG} (converted)")
    tok = read_tokenizer(folder, hf, config) if tokenizer else None
    weights = read_weights(folder)
    source = ", ".join(f.name for f in weight_files(folder))
    try:
        state = family.state_from_hf(weights, config, hf)
    except AiaynError as e:
        raise AiaynError(f"{folder / source.split(', ')[0]}: {e}") from None
    del weights
    with torch.device("meta"):  # the model's names and shapes, without its memory
        model = build_model(config, init=False)
    state = _complete_ties(model, state)
    _check_fit(model, state, folder / source.split(", ")[0])
    template = read_chat_template(folder) if tok else None
    if template is not None:
        extra["chat_template"] = template
    meta: dict[str, Any] = {
        "task": family.task, "model": config.to_dict(),
        "tokenizers": {role: TOKENIZER_FILE for role in ROLES.get(family.task, ("text",))} if tok else {}, **extra,
        "hf_config": hf, "converted_from": {"source": str(path_or_name), "family": family.name,
                                            "weights": source}}
    writer = (lambda d: tok.save(Path(d) / TOKENIZER_FILE)) if tok else None
    return save_checkpoint(out, state, meta, tokenizer_writer=writer, into=into)


def _check_fit(model: nn.Module, state: dict[str, Tensor], where: Path) -> None:
    """Raise an AiaynError unless ``state`` has exactly the model's names and shapes."""
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = sorted(set(want) - set(state))
    extra = sorted(set(state) - set(want))
    shapes = [f"{k} {tuple(state[k].shape)} where the model has {want[k]}" for k in sorted(set(want) & set(state))
              if tuple(state[k].shape) != want[k]]
    problems = ([f"missing {', '.join(missing[:5])}"] if missing else []) + (
        [f"unexpected {', '.join(extra[:5])}"] if extra else []) + shapes[:5]
    if problems:
        raise AiaynError(f"{where}: the weights do not fit config.json ({'; '.join(problems)}); the folder's files "
                         "are of different models: download it again")


def _family_for_checkpoint(config: ModelConfig, meta: dict[str, Any], where: Path) -> tuple[Family, dict[str, Any]]:
    """The family that writes this checkpoint, and its transformers config entries."""
    base = meta.get("hf_config")
    if isinstance(base, dict) and isinstance(base.get("model_type"), str):
        family = family_for_hf(base, f"{where} (hf_config)")
        candidates = [family]
    else:
        supported_model_types()  # loads the built-in families
        candidates = [f for f in FAMILIES.values() if f.task == meta.get("task")]
        if not candidates:
            tasks = sorted({f.task for f in FAMILIES.values()})
            raise AiaynError(f"{where}: a {meta.get('task')!r} checkpoint; aiayn writes transformers folders for the "
                             f"tasks {', '.join(tasks)}")
    reasons = []
    for family in candidates:
        try:
            return family, family.config_to_hf(config, meta)
        except AiaynError as e:
            reasons.append(str(e))
    raise AiaynError(f"{where}: no transformers model type has this model's shape:\n" + "\n".join(reasons))


def from_peft(folder: str | Path, base: str | Path, out: str | Path, *, overwrite: bool = False) -> Path:
    """A PEFT LoRA folder (``adapter_config.json`` + ``adapter_model.safetensors``) as an aiayn adapter checkpoint
    on the aiayn checkpoint ``base`` (:func:`aiayn.hf.peft.adapter_checkpoint`); ``load_pretrained(out)`` and
    ``--checkpoint BASE --adapter OUT`` decode with it.

    Raises:
        AiaynError: what :func:`aiayn.hf.peft.adapter_checkpoint` raises; a base of no transformers family.
    """
    d = checkpoint_dir(base)
    meta = load_config(d)
    if "model" not in meta:
        raise AiaynError(f"{d / 'config.json'}: no 'model' entry; --base takes an aiayn model checkpoint")
    config = ModelConfig.from_dict(meta["model"], str(d / "config.json"))
    family, _ = _family_for_checkpoint(config, meta, d / "config.json")
    return peft.adapter_checkpoint(folder, base, out, family, overwrite=overwrite)


def to_hf(checkpoint: str | Path, out: str | Path, say: Callable[[str], None] | None = None, *,
          overwrite: bool = False, merged: bool = False) -> Path:
    """Write an aiayn checkpoint as a transformers model folder (``from_pretrained`` loads it).

    The family is the one the checkpoint was converted from, else the first of the checkpoint's task whose shape
    the model has (an aiayn-trained GPT-2-like decoder becomes a ``GPT2LMHeadModel``). The tokenizer is written as
    a fast tokenizer (pretrained, BPE and char tokenizers; a word-level one is left out, and ``say`` is told).

    Args:
        checkpoint: an aiayn checkpoint directory.
        out: the folder to write: a new or empty folder, or one an earlier ``to_hf`` wrote (its files are
            replaced); any other folder only with ``overwrite`` (:func:`aiayn.output_folder.check_output_folder`).
        say: called with a note on what was not written (default: nothing).
        overwrite: write the folder's files into a folder that holds other things (only files of the same names
            are replaced; nothing else there is changed or removed).
        merged: for a LoRA run's checkpoint, the whole model with its adapters folded in; without it, the adapters
            alone as a PEFT folder (:mod:`aiayn.hf.peft`), for ``PeftModel.from_pretrained`` on the base exported
            as transformers' model.

    Returns:
        The folder.

    Raises:
        AiaynError: the checkpoint is missing or corrupt; its model has no transformers counterpart (the message
            gives each family's reasons); ``out`` is the checkpoint (or inside it, or around it), or a folder of
            something else and ``overwrite`` is false.
    """
    d = checkpoint_dir(checkpoint)
    into = check_output_folder(out, TRANSFORMERS, overwrite=overwrite, sources=[checkpoint, d])
    meta = load_config(d)
    if "model" not in meta:
        raise AiaynError(f"{d / 'config.json'}: no 'model' entry; this is not an aiayn model checkpoint")
    config = ModelConfig.from_dict(meta["model"], str(d / "config.json"))
    family, entries = _family_for_checkpoint(config, meta, d / "config.json")
    if meta.get("adapter") and not merged:
        return peft.write_adapter_folder(d, config, family, into)
    base = meta.get("hf_config") if isinstance(meta.get("hf_config"), dict) else {}
    hf = {**{k: v for k, v in base.items() if k not in _FILE_KEYS}, **entries}
    tokenizers = meta.get("tokenizers") or {}
    role = next((r for r in ("text", "tgt", "src") if r in tokenizers), None)
    tok = load_tokenizer(checkpoint_file(d, tokenizers[role])) if role else None
    if tok is not None:
        if tokenizers.get("src", tokenizers[role]) != tokenizers[role] and say:
            say(f"{d}: the source and target vocabularies differ; the folder holds the target's only")
        ids = {"bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id,
               "pad_token_id": None if getattr(tok, "pads_with_eos", False) else tok.pad_id}
        if family.task == "translation":
            ids["decoder_start_token_id"] = tok.decoder_start_id
        hf.update({k: v for k, v in ids.items() if v is not None or k == "pad_token_id"})
    state = adapted_model_state(d)[1] if meta.get("adapter") else read_state_dict(d)  # adapters folded in
    state = family.state_to_hf(state, config)
    form = None
    if family.name == "marian" and tok is not None and needs_pad_last(tok, config.vocab_size):
        state = eps_rescaled(pad_last_state(state, config, tok.decoder_start_id), config.norm_eps, pre_norm=False)
        hf = pad_last_config(hf, config.vocab_size)
        form = partial(pad_last_tokenizer, tok=tok)
    elif family.name == "pegasus" and tok is not None:  # Pegasus starts from its pad token
        hf = {**hf, "pad_token_id": tok.decoder_start_id}
        form = partial(start_as_pad, tok=tok)
    folder, wrote = write_folder(into, hf, state, tok, config.max_len, sentence.folder_files(meta, config.d_model),
                                 tokenizer_form=form)
    if tok is not None and not wrote and say:
        say(f"{d}: a {tok.kind!r} tokenizer has no transformers form; the folder holds the model only")
    if tok is None and say:
        say(f"{d}: the checkpoint has no tokenizer; the folder holds the model only")
    return folder
