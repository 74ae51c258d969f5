"""Reading and writing a Hugging Face transformers model folder (what ``save_pretrained`` writes).

Read: ``config.json``; the weights from ``model.safetensors``, a sharded ``model.safetensors.index.json``,
``pytorch_model.bin`` (read with ``torch.load(weights_only=True)``: nothing is unpickled) or a sharded
``pytorch_model.bin.index.json``, in that order of preference; the tokenizer files beside them
(:meth:`~aiayn.tokenize.PretrainedTokenizer.from_folder`). Every missing or corrupt file is one
:class:`~aiayn.errors.AiaynError` that names it.

Write: ``config.json`` (``architectures``, ``model_type``, ``torch_dtype``, the special token ids),
``generation_config.json``, ``model.safetensors`` (each tied weight once, as transformers saves it) and the
tokenizer as ``tokenizer.json`` + ``tokenizer_config.json`` + ``special_tokens_map.json`` (a fast tokenizer that
``AutoTokenizer.from_pretrained`` loads), and ``aiayn-output.json``, which records what aiayn wrote. The folder is
written beside its destination and then put in place (:mod:`aiayn.output_folder`): a new folder, or one an earlier
export wrote, is renamed into place; a folder that also holds other files (allowed by ``--overwrite``) gets these
files one by one, the others left as they are.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import safetensors
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer
from torch import Tensor

from aiayn.checkpoint.load import pickled_class
from aiayn.errors import AiaynError
from aiayn.files import as_umask_allows
from aiayn.output_folder import (
    TRANSFORMERS,
    OutputFolder,
    check_output_folder,
    install,
    staging_folder,
)
from aiayn.tokenize import Tokenizer
from aiayn.tokenize.base import SPECIAL_TOKENS
from aiayn.tokenize.pretrained import read_json_object
from aiayn.tokenize.word import WORD_PATTERN

CONFIG = "config.json"
SAFETENSORS, SAFETENSORS_INDEX = "model.safetensors", "model.safetensors.index.json"
BIN, BIN_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file of a model folder (an AiaynError naming the file when missing or corrupt)."""
    data = read_json_object(path, fix="download it again")
    if data is None:
        raise AiaynError(f"{path}: no such file; a transformers model folder holds {CONFIG} and its weights (what "
                         "model.save_pretrained(folder) writes): download the whole folder")
    return data


def read_config(folder: str | Path) -> dict[str, Any]:
    """The folder's ``config.json`` as a dict (it must name its ``model_type``)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise AiaynError(f"{folder}: no such folder; pass a transformers model folder (config.json and weights)")
    config = read_json(folder / CONFIG)
    if not isinstance(config.get("model_type"), str):
        raise AiaynError(f"{folder / CONFIG}: no model_type; this is not a transformers model config (save the model "
                         "with model.save_pretrained(folder))")
    return config


def weight_files(folder: str | Path) -> list[Path]:
    """The files that hold the folder's weights, in the order of preference (safetensors first)."""
    folder = Path(folder)
    for single, index in ((SAFETENSORS, SAFETENSORS_INDEX), (BIN, BIN_INDEX)):
        if (folder / single).is_file():
            return [folder / single]
        if (folder / index).is_file():
            data = read_json(folder / index)
            weight_map = data.get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise AiaynError(f"{folder / index}: no weight_map; the index is corrupt: download it again")
            shards = sorted({str(v) for v in weight_map.values()})
            missing = [s for s in shards if not (folder / s).is_file()]
            if missing:
                raise AiaynError(f"{folder / missing[0]}: no such file, though {index} lists it"
                                 f"{f' (and {len(missing) - 1} more shards)' if len(missing) > 1 else ''}; download "
                                 "every shard of the model")
            return [folder / s for s in shards]
    raise AiaynError(f"{folder}: no weights; a transformers model folder holds {SAFETENSORS}, {SAFETENSORS_INDEX} "
                     f"with its shards, {BIN} or {BIN_INDEX}: download the model's weights too")


def _read_one(file: Path) -> dict[str, Tensor]:
    if file.suffix == ".safetensors":
        try:
            return load_file(str(file), device="cpu")
        except (safetensors.SafetensorError, OSError, ValueError) as e:
            raise AiaynError(f"{file}: cannot read the weights ({str(e).strip()[:200]}); the file is corrupt or "
                             "incomplete: download it again") from None
    try:
        state = torch.load(str(file), map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises pickle, zip and runtime errors of many kinds
        named = pickled_class(e)
        if named:
            raise AiaynError(f"{file}: holds objects other than tensors (it names {named}); refused for "
                             "safety, since loading it could run code: use the model's model.safetensors, or a "
                             "weights file that holds only tensors") from None
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise AiaynError(f"{file}: cannot read the weights ({type(e).__name__}: {first}); the file is corrupt or "
                         "incomplete: download it again") from None
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise AiaynError(f"{file}: expected a dict of tensors; it is not a transformers weights file")
    return state


def _check_finite(file: Path, part: dict[str, Tensor]) -> None:
    """Raise an AiaynError naming the first tensor of ``file`` with a NaN or an infinity (damaged bytes)."""
    for key, tensor in part.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise AiaynError(f"{file}: tensor {key!r} holds NaN or infinite values; the file is damaged: download it "
                             "again")


def read_weights(folder: str | Path) -> dict[str, Tensor]:
    """Every tensor of the folder's weights (shards merged), by transformers' key; each must be finite."""
    state: dict[str, Tensor] = {}
    for file in weight_files(folder):
        part = _read_one(file)
        _check_finite(file, part)
        twice = set(state) & set(part)
        if twice:
            raise AiaynError(f"{file}: holds {sorted(twice)[0]!r} that another shard holds too; the shards are of "
                             "different downloads: download the model again")
        state.update(part)
    return state


# ---------------------------------------------------------------------------------------------- writing
#: a tokenizers.Tokenizer, its special tokens by role, and whether decoding cleans up spaces
TokenizerForm = tuple[Any, dict[str, str | None], bool]


def hf_tokenizer(tok: Tokenizer) -> TokenizerForm | None:
    """A Hugging Face ``tokenizers.Tokenizer`` equal to ``tok``, its special tokens by role, and whether decoding
    cleans up spaces; None for a tokenizer without such a form."""
    builtin = dict(zip(("pad", "bos", "eos", "unk", "mask"), SPECIAL_TOKENS))
    if tok.kind == "pretrained":
        return HFTokenizer.from_str(tok.hf.to_str()), tok.special_tokens, tok.clean_up
    if tok.kind == "bpe":
        return HFTokenizer.from_str(tok.hf.to_str()), builtin, False
    if tok.kind in ("char", "word"):
        vocab = {tok.id_to_token(i): i for i in range(tok.vocab_size)}
        hf = HFTokenizer(models.WordLevel(vocab, unk_token=builtin["unk"]))
        if tok.kind == "char":
            hf.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # a token a character
            hf.decoder = decoders.Fuse()
        else:  # aiayn.tokenize.word: NFKC, then words and single punctuation characters; decoded with spaces
            hf.normalizer = normalizers.NFKC()
            hf.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                        pre_tokenizers.Split(Regex(WORD_PATTERN), "isolated")])
        return hf, builtin, False
    return None


def write_tokenizer(folder: Path, tok: Tokenizer, max_len: int,
                    form: Callable[[TokenizerForm], TokenizerForm] | None = None) -> bool:
    """Write ``tok`` as a transformers fast tokenizer into ``folder`` (its :func:`hf_tokenizer` form, changed by
    ``form`` when given); False when it has no such form."""
    converted = hf_tokenizer(tok)
    if converted is not None and form is not None:
        converted = form(converted)
    if converted is None:
        return False
    hf, specials, clean_up = converted
    hf.save(str(folder / "tokenizer.json"))
    named = {f"{role}_token": token for role, token in specials.items() if token is not None}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_len,
              "clean_up_tokenization_spaces": clean_up, **named}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n",
                                                  encoding="utf-8")
    (folder / "special_tokens_map.json").write_text(json.dumps(named, indent=2, ensure_ascii=False) + "\n",
                                                    encoding="utf-8")
    return True


def write_folder(out: str | Path | OutputFolder, config: dict[str, Any], state: dict[str, Tensor],
                 tokenizer: Tokenizer | None = None, max_len: int = 1024,
                 files: dict[str, str] | None = None,
                 tokenizer_form: Callable[[TokenizerForm], TokenizerForm] | None = None) -> tuple[Path, bool]:
    """Write a transformers model folder: ``config.json``, ``generation_config.json``, ``model.safetensors``, the
    tokenizer when given (and convertible), and ``aiayn-output.json`` (what aiayn wrote, with sizes and SHA-256).

    Args:
        out: the folder, or the folder as :func:`aiayn.output_folder.check_output_folder` checked it. A path is
            checked here: a new or empty folder, or one an earlier export wrote; nothing else is overwritten.
        config: transformers' config entries (``model_type``, ``architectures``, ...).
        state: transformers' state dict, each tied weight once.
        tokenizer: written as a fast tokenizer when it has a Hugging Face form.
        max_len: the tokenizer's ``model_max_length``.
        files: more text files to write, by path relative to the folder (a sentence-transformers model's
            ``modules.json`` and ``1_Pooling/config.json``: :func:`aiayn.hf.sentence.folder_files`).
        tokenizer_form: changes the tokenizer's transformers form before it is written (Marian's vocabulary
            layout: :func:`aiayn.hf.marian_vocab.pad_last_tokenizer`).

    Returns:
        The folder, and whether the tokenizer was written.

    Raises:
        AiaynError: ``out`` may not be written (:func:`~aiayn.output_folder.check_output_folder`), or writing
            failed (named, with the cause).
    """
    into = out if isinstance(out, OutputFolder) else check_output_folder(out, TRANSFORMERS)
    tmp = staging_folder(into.path)
    try:
        tensors = {k: v.detach().to("cpu", torch.float32).contiguous().clone() for k, v in state.items()}
        save_file(tensors, str(tmp / SAFETENSORS), metadata={"format": "pt"})
        as_umask_allows(tmp / SAFETENSORS)  # save_file makes it 0600; the other files of the folder follow the umask
        full = {**config, "torch_dtype": "float32"}
        (tmp / CONFIG).write_text(json.dumps(full, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        generation = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id",
                                             "decoder_start_token_id") if config.get(k) is not None}
        (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n", encoding="utf-8")
        wrote = tokenizer is not None and write_tokenizer(tmp, tokenizer, max_len, tokenizer_form)
        for name, text in (files or {}).items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_text(text, encoding="utf-8")
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise AiaynError(f"{into.path}: cannot write the model folder ({e.strerror or e}); check the disk space and "
                         "permissions") from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return install(tmp, into), wrote
