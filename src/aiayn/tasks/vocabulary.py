"""A pretrained vocabulary for a fresh model: ``[tokenizer] kind = "pretrained"`` with ``path``.

A run normally trains its tokenizer on its training text (``kind`` "bpe", "char" or "word"). With
``kind = "pretrained"`` it reads a transformers tokenizer folder (or its ``tokenizer.json``; an aiayn checkpoint
converted with ``aiayn convert --from-hf`` holds one too) and trains a new model on that vocabulary, keeping its
special tokens and ids: the model's ``vocab_size`` and ``pad_id`` come from it. Starting from a converted model's
weights is ``[model] init_from`` instead (:mod:`aiayn.tasks.finetune`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiayn.checkpoint import checkpoint_file
from aiayn.errors import AiaynError
from aiayn.tokenize import Tokenizer, load_tokenizer
from aiayn.tokenize.pretrained import PretrainedTokenizer, read_json_object
from aiayn.train.recipe import resolve_path

#: the ``[tokenizer]`` keys a pretrained vocabulary reads (the others train a tokenizer)
PRETRAINED_KEYS = ("kind", "path")


def pretrained_vocabulary(recipe: dict[str, Any], section: dict[str, Any], task: str) -> Tokenizer | None:
    """The tokenizer of ``[tokenizer] kind = "pretrained"``, or None for a kind that is trained.

    Args:
        recipe: the recipe (``path`` is resolved from the working directory, else beside the recipe file).
        section: the run's ``[tokenizer]`` section with defaults filled in.
        task: the task, for the special tokens it needs ("mlm" needs a mask token).
    Raises:
        AiaynError: the folder or its files are missing or corrupt, or the vocabulary lacks a token the task
            needs (the message names the folder and the fix).
    """
    if section.get("kind") != "pretrained":
        return None
    path = resolve_path(recipe, section.get("path"))
    if path is None:
        raise AiaynError("[tokenizer] kind = \"pretrained\" needs path = \"DIR\": the transformers tokenizer folder")
    tok = _checkpoint_tokenizer(path) or PretrainedTokenizer.from_folder(path)
    if task == "mlm" and getattr(tok, "mask_id", None) is None:
        raise AiaynError(f"{path}: this vocabulary has no mask token, which masked-LM training needs; give a "
                         "vocabulary with one (BERT's [MASK], BART's <mask>) or train one (kind = \"bpe\")")
    return tok


def pretrained_problems(section: dict[str, Any]) -> list[str]:
    """Recipe problems of a ``[tokenizer]`` section around ``kind = "pretrained"`` (one line each)."""
    kind, path = section.get("kind"), section.get("path")
    if kind == "pretrained":
        if path is None:
            return ["[tokenizer] kind=\"pretrained\": give path = \"DIR\", the transformers tokenizer folder (or an "
                    "aiayn checkpoint converted with aiayn convert --from-hf)"]
        others = sorted(k for k in section if k not in PRETRAINED_KEYS)
        if others:
            return [f"[tokenizer] {', '.join(others)}: a pretrained vocabulary is read, not trained; remove these "
                    "keys (only kind and path apply)"]
    elif path is not None:
        return [f"[tokenizer] path={path!r}: reading a tokenizer needs kind = \"pretrained\"; set it, or remove path"]
    return []


def _checkpoint_tokenizer(path: Path) -> Tokenizer | None:
    """The tokenizer of an aiayn checkpoint folder (its ``text`` role, else its target's), or None for another
    folder."""
    meta = read_json_object(path / "config.json") if path.is_dir() else None
    names = (meta or {}).get("tokenizers")
    if not isinstance(names, dict) or "task" not in meta:  # type: ignore[operator]
        return None
    role = next((r for r in ("text", "tgt", "src") if r in names), None)
    return None if role is None else load_tokenizer(checkpoint_file(path, names[role]))
