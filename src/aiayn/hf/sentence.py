"""sentence-transformers folders: the pooling of an ``embedding`` checkpoint read from them and written back.

A sentence-transformers model folder is a transformers folder (``config.json``, weights, tokenizer files at its
root) plus the modules that turn hidden states into one vector, listed in ``modules.json``::

    [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
     {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
     {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]

``1_Pooling/config.json`` names the pooling (``pooling_mode_mean_tokens``, ``pooling_mode_cls_token``,
``pooling_mode_max_tokens``, ``pooling_mode_lasttoken``, or sentence-transformers 6's ``pooling_mode``), a
``Normalize`` module scales the vector to unit length, and ``sentence_bert_config.json`` gives ``max_seq_length``
(the most tokens read, often below the position table) and ``do_lower_case``.

:func:`read_entries` turns these into the checkpoint's ``embedding`` and ``max_len`` entries (a folder without
``modules.json``, a bare ``BertModel``, keeps its family's default: mean pooling, not normalised); :func:`folder_files`
writes them back beside the transformers files, so that the folder ``to_hf`` writes is a sentence-transformers
folder again. Modules other than Transformer, Pooling and Normalize (``Dense``, ``LayerNorm``, ...) are refused by
name: aiayn has no counterpart for them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aiayn.errors import AiaynError
from aiayn.files import parse_json
from aiayn.hf.folder import read_json

MODULES = "modules.json"
POOLING_DIR = "1_Pooling"
SBERT_CONFIG = "sentence_bert_config.json"
#: sentence-transformers' pooling flags -> aiayn's pooling
FLAGS = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
         "pooling_mode_lasttoken": "last"}
#: sentence-transformers 6's ``pooling_mode`` names -> aiayn's pooling
MODES = {"mean": "mean", "cls": "cls", "max": "max", "lasttoken": "last"}
#: poolings sentence-transformers has and aiayn does not
UNSUPPORTED = {"pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
               "pooling_mode_weightedmean_tokens": "weightedmean"}


def default_entry(pooling: str) -> dict[str, Any]:
    """The ``embedding`` entry of a model converted without sentence-transformers files."""
    return {"pooling": pooling, "normalize": False, "lowercase": False, "from": "default"}


def _kind(module: Any) -> str:
    """A ``modules.json`` entry's class name (``Pooling`` for ``sentence_transformers.models.Pooling``)."""
    return str(module.get("type", "")).rsplit(".", 1)[-1] if isinstance(module, dict) else ""


def _pooling(file: Path, d_model: int) -> str:
    """aiayn's pooling from a ``1_Pooling/config.json``."""
    cfg = read_json(file)
    dim = cfg.get("word_embedding_dimension", cfg.get("embedding_dimension"))
    if dim is not None and dim != d_model:
        raise AiaynError(f"{file}: word_embedding_dimension {dim}, but the model's hidden size is {d_model}; the "
                         "pooling module is of another model")
    mode = cfg.get("pooling_mode")
    if mode is not None:
        modes = [mode] if isinstance(mode, str) else list(mode) if isinstance(mode, list) else [mode]
        names = [m for m in modes if m in MODES]
        if len(modes) != 1 or len(names) != 1:
            raise AiaynError(f"{file}: pooling_mode {mode!r}; aiayn pools one way at a time, one of "
                             f"{', '.join(MODES)}")
        return MODES[names[0]]
    unsupported = [name for key, name in UNSUPPORTED.items() if cfg.get(key)]
    chosen = [pool for key, pool in FLAGS.items() if cfg.get(key)]
    if unsupported:
        raise AiaynError(f"{file}: {unsupported[0]} pooling; aiayn pools by {', '.join(MODES)}")
    if len(chosen) > 1:
        raise AiaynError(f"{file}: {len(chosen)} poolings at once ({', '.join(chosen)}), whose vectors "
                         "sentence-transformers concatenates; aiayn pools one way at a time")
    return chosen[0] if chosen else "mean"  # sentence-transformers' default


def read_entries(folder: Path, task: str, fields: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` (a family's checkpoint entries) with the pooling of a sentence-transformers ``folder`` when it is
    one and the task is ``embedding``; else ``meta`` as it is.

    Args:
        folder: the transformers folder being converted.
        task: the family's task.
        fields: the converted model's config fields (``d_model``, ``max_len``).
        meta: the family's entries (``max_len``, ``embedding``).

    Raises:
        AiaynError: a ``modules.json``, pooling or ``sentence_bert_config.json`` that is corrupt (named), or modules
            aiayn has no counterpart for.
    """
    file = folder / MODULES
    if task != "embedding" or not file.is_file():
        return meta
    try:
        modules = parse_json(file.read_bytes())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise AiaynError(f"{file}: cannot read it as JSON ({e}); the file is corrupt: download it again") from None
    if not isinstance(modules, list) or not modules or _kind(modules[0]) != "Transformer":
        raise AiaynError(f"{file}: expected a list of modules, the Transformer first; the file is corrupt: download "
                         "it again")
    if str(modules[0].get("path", "")).strip("./"):
        raise AiaynError(f"{file}: the Transformer module lives in {modules[0]['path']!r}; aiayn reads the model at "
                         "the folder's root, as sentence-transformers 2 and later save it: save the model again")
    kinds = [_kind(m) for m in modules[1:]]
    other = [f"{k or '?'} ({m.get('path') if isinstance(m, dict) else m!r})" for k, m in zip(kinds, modules[1:])
             if k not in ("Pooling", "Normalize")]
    if other or kinds.count("Pooling") != 1 or kinds.count("Normalize") > 1 or (
            "Normalize" in kinds and kinds.index("Normalize") < kinds.index("Pooling")):
        found = ", ".join(["Transformer", *(k or "?" for k in kinds)])
        raise AiaynError(f"{file}: modules {found}; aiayn converts a Transformer, one Pooling and an optional "
                         f"Normalize after it{f' (it has no counterpart for {other[0]})' if other else ''}")
    pooling_dir = str(modules[1 + kinds.index("Pooling")].get("path", POOLING_DIR))
    pooling = _pooling(folder / pooling_dir / "config.json", int(fields["d_model"]))
    max_len, lowercase = int(fields["max_len"]), False
    sbert = folder / SBERT_CONFIG
    if sbert.is_file():
        cfg = read_json(sbert)
        seq = cfg.get("max_seq_length")
        if seq is not None and (not isinstance(seq, int) or isinstance(seq, bool) or seq < 3):
            raise AiaynError(f"{sbert}: max_seq_length {seq!r} is not a whole number of at least 3; the file is "
                             "corrupt: download it again")
        max_len = min(max_len, seq) if seq is not None else max_len
        lowercase = bool(cfg.get("do_lower_case", False))
    entry = {"pooling": pooling, "normalize": "Normalize" in kinds, "lowercase": lowercase,
             "from": "sentence-transformers"}
    return {**meta, "max_len": max_len, "embedding": entry}


def folder_files(meta: dict[str, Any], d_model: int) -> dict[str, str]:
    """The sentence-transformers files of an ``embedding`` checkpoint (relative path -> text): ``modules.json``,
    ``1_Pooling/config.json`` and ``sentence_bert_config.json``; none for other tasks. A ``Normalize`` module keeps
    no files (sentence-transformers loads it from ``modules.json`` alone)."""
    entry = meta.get("embedding")
    if meta.get("task") != "embedding" or not isinstance(entry, dict):
        return {}
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": POOLING_DIR, "type": "sentence_transformers.models.Pooling"}]
    if entry.get("normalize"):
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    pooling = {"word_embedding_dimension": d_model,
               **{key: entry.get("pooling") == pool for key, pool in FLAGS.items()},
               "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False}
    sbert = {"max_seq_length": meta.get("max_len"), "do_lower_case": bool(entry.get("lowercase", False))}
    return {MODULES: json.dumps(modules, indent=2) + "\n",
            f"{POOLING_DIR}/config.json": json.dumps(pooling, indent=2) + "\n",
            SBERT_CONFIG: json.dumps(sbert, indent=2) + "\n"}
