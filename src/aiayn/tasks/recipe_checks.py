"""Each task's recipe checks, registered with :mod:`aiayn.train.recipe` (which reads no task module): the defaults of
the sections the task reads, the model family it builds, its data checks, and the checks of ``[model] init_from``
(:mod:`aiayn.tasks.finetune`) and of a pretrained vocabulary (:mod:`aiayn.tasks.vocabulary`).

:mod:`aiayn.tasks.registry` imports this module, so every task is registered before a recipe is checked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiayn.generate.translate import DECODE_DEFAULTS
from aiayn.tasks import classification, image_classification, lm, mlm, translation
from aiayn.tasks.finetune import source_problems
from aiayn.tasks.vocabulary import pretrained_problems
from aiayn.train.recipe import TaskChecks, file_problems, register_task, resolve_path


def _translation_data(recipe: dict[str, Any], data: dict[str, Any]) -> list[str]:
    """Training pairs given (two aligned files or a TSV), both validation sides or neither, the files there."""
    out = []
    if data["train_tsv"] is None and (data["train_src"] is None or data["train_tgt"] is None):
        out.append("[data]: no training data; set train_src and train_tgt (two aligned files) or train_tsv")
    if data["valid_tsv"] is None and (data["valid_src"] is None) != (data["valid_tgt"] is None):
        given, missing = ("valid_src", "valid_tgt") if data["valid_tgt"] is None else ("valid_tgt", "valid_src")
        out.append(f"[data] {given}={data[given]!r}: {missing} is not set; set both, or neither (no validation)")
    return out + file_problems(recipe, data, ("train_src", "train_tgt", "train_tsv", "valid_src", "valid_tgt",
                                              "valid_tsv"))


def _lm_data(recipe: dict[str, Any], data: dict[str, Any]) -> list[str]:
    """Training text given and there; packing reads a folder of documents."""
    out = []
    if data["path"] is None:
        out.append("[data]: no training text; set path to a text file or a folder of *.txt documents")
    out += file_problems(recipe, data, ("path", "valid_path"))
    if data["packing"] and data["path"] is not None:
        path = resolve_path(recipe, data["path"])
        if path is not None and path.is_file():
            out.append(f"[data] packing=true: needs path to be a folder with one *.txt file per document, but "
                       f"{data['path']!r} is a file; give a folder, or set packing = false")
    return out


def _text_data(task: str) -> Callable[[dict[str, Any], dict[str, Any]], list[str]]:
    """The data checks of a task reading sentences (``mlm``) or labelled texts (``classification``)."""
    def problems(recipe: dict[str, Any], data: dict[str, Any]) -> list[str]:
        out = []
        if data["train"] is None:
            out.append("[data]: no training data; set train to a .tsv/.csv file"
                       + ("" if task == "classification" else " or a text file with one sentence per line"))
        return out + file_problems(recipe, data, ("train", "valid"))
    return problems


def _image_model_fields(recipe: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    return image_classification.model_fields(recipe, data, 2)  # 2 stands in for the number of classes in the data


_SHARED: dict[str, Any] = {"tokenizer_problems": pretrained_problems, "init_from_problems": source_problems}

register_task("translation", TaskChecks(
    "encoder-decoder", {"data": translation.DATA_DEFAULTS, "tokenizer": translation.TOKENIZER_DEFAULTS,
                        "decode": DECODE_DEFAULTS, "eval": translation.EVAL_DEFAULTS},
    _translation_data, **_SHARED))
register_task("lm", TaskChecks("decoder", {"data": lm.DATA_DEFAULTS, "tokenizer": lm.TOKENIZER_DEFAULTS},
                               _lm_data, **_SHARED))
register_task("mlm", TaskChecks("encoder", {"data": mlm.DATA_DEFAULTS, "tokenizer": mlm.TOKENIZER_DEFAULTS},
                                _text_data("mlm"), **_SHARED))
register_task("classification", TaskChecks(
    "encoder", {"data": classification.DATA_DEFAULTS, "tokenizer": classification.TOKENIZER_DEFAULTS},
    _text_data("classification"), **_SHARED))
register_task("image_classification", TaskChecks(
    "encoder", {"data": image_classification.DATA_DEFAULTS}, image_classification.data_problems,
    model_fields=_image_model_fields, **_SHARED))
