"""Recipes: a TOML file of sections (``[data]``, ``[tokenizer]``, ``[model]``, ``[train]``, ``[decode]``,
``[eval]``) plus ``key=value`` overrides from the command line (``train.max_steps=200``).

Relative paths inside a recipe are resolved against the current directory first, then against the
recipe's own folder.

:func:`validate_recipe` checks every section before anything is built (no tokenizer trained, no data
read, nothing written) and raises one :class:`AiaynError` that lists every problem of every section,
each as ``[section] key=value: problem; fix``.
"""

from __future__ import annotations

import ast
import importlib
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tomllib

from aiayn.config import unknown_key
from aiayn.errors import AiaynError

TASKS = ("translation", "lm", "classification", "mlm", "image_classification")
SECTIONS = ("data", "tokenizer", "model", "train", "decode", "eval")


def _parse_value(text: str) -> Any:
    """``"3"`` -> 3, ``"0.1"`` -> 0.1, ``"true"`` -> True, ``"[1,2]"`` -> [1, 2], else the string."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def apply_overrides(recipe: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` (or top-level ``key=value``) overrides in place and return the recipe."""
    for item in overrides:
        if "=" not in item:
            raise AiaynError(f"override {item!r} is not of the form section.key=value (e.g. train.max_steps=200)")
        key, value = item.split("=", 1)
        parts = key.strip().split(".")
        node = recipe
        for p in parts[:-1]:
            if p not in SECTIONS and node is recipe:
                raise AiaynError(f"override {item!r}: unknown section {p!r}; sections are {', '.join(SECTIONS)}")
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise AiaynError(f"override {item!r}: {p} is a value, not a section; write section.key=value")
        node[parts[-1]] = _parse_value(value.strip())
    return recipe


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> dict[str, Any]:
    """Read a recipe file and apply overrides. The result has ``task`` and one dict per section.

    Raises:
        AiaynError: missing file, invalid TOML (with line), unknown task or section.
    """
    p = Path(path)
    if not p.is_file():
        raise AiaynError(f"{p}: recipe not found; see recipes/ for examples")
    try:
        recipe = tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise AiaynError(f"{p}: invalid TOML: {e}; fix the file") from None
    recipe["_path"] = str(p)
    apply_overrides(recipe, overrides or [])
    task = recipe.get("task")
    if task not in TASKS:
        raise AiaynError(f"{p}: task = {task!r}; set task to one of {', '.join(TASKS)}")
    unknown = [k for k in recipe if k not in SECTIONS and k not in ("task", "_path", "name")]
    if unknown:
        raise AiaynError(f"{p}: unknown top-level key(s) {unknown}; sections are {', '.join(SECTIONS)}")
    for s in SECTIONS:
        recipe.setdefault(s, {})
        if not isinstance(recipe[s], dict):
            raise AiaynError(f"{p}: {s} = {recipe[s]!r}; [{s}] must be a section of key = value lines")
    return recipe


def resolve_path(recipe: dict[str, Any], value: str | None) -> Path | None:
    """Resolve a path from a recipe: as given if it exists from the current directory, else next to the recipe."""
    if value is None:
        return None
    p = Path(value).expanduser()
    if p.is_absolute() or p.exists() or "_path" not in recipe:
        return p
    beside = Path(recipe["_path"]).parent / p
    return beside if beside.exists() else p


def take(section: dict[str, Any], known: dict[str, Any], where: str) -> dict[str, Any]:
    """Fill defaults from ``known``, after checking every key (unknown keys, types, ranges: see
    :func:`section_problems`).

    Raises:
        AiaynError: listing every problem of the section.
    """
    problems = section_problems(section, known, where)
    if problems:
        raise AiaynError(problems[0] if len(problems) == 1 else "\n  - ".join([f"invalid [{where}]", *problems]))
    return {**known, **section}


# ------------------------------------------------------------------------------------------ validation
Rule = Callable[[Any], "str | None"]  # a value -> what is wrong with it and the fix, or None when it is fine


def _whole(low: int, unset: str | None = None) -> Rule:
    """A whole number >= ``low`` (or None, meaning ``unset``, when ``unset`` is given)."""
    tail = f", or none ({unset})" if unset else ""

    def rule(v: Any) -> str | None:
        if v is None and unset:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            return f"must be a whole number{tail}"
        return None if v >= low else f"must be >= {low}{tail}"
    return rule


def _number(low: float, high: float, *, closed_high: bool = False, open_low: bool = False) -> Rule:
    """A number in [low, high) (``closed_high``: ]; ``open_low``: (low, ...)."""
    if math.isinf(high):
        span = "" if math.isinf(low) else f" {'>' if open_low else '>='} {low:g}"
    else:
        span = f" in {'(' if open_low else '['}{low:g}, {high:g}{']' if closed_high else ')'}"

    def rule(v: Any) -> str | None:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return f"must be a number{span}"
        above = v > low if open_low else v >= low
        below = v <= high if closed_high else v < high
        return None if above and below and not math.isnan(v) else f"must be{span}"
    return rule


def _choice(*options: str) -> Rule:
    return lambda v: None if isinstance(v, str) and v in options else f"unknown; choose one of {', '.join(options)}"


def _flag(v: Any) -> str | None:
    return None if isinstance(v, bool) else "must be true or false"


def _path(v: Any) -> str | None:
    return None if v is None or isinstance(v, str) else "must be a file path in quotes"


def _column(v: Any) -> str | None:
    ok = v is None or isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool) and v >= 0)
    return None if ok else "must be a column name in quotes, or a 0-based column number"


def _rules() -> dict[str, dict[str, Rule]]:
    """The checks of the keys of the task sections, by section and key (a key the tasks share means the
    same everywhere). A key without a rule must have its default's type."""
    from aiayn.data.parallel import POLICIES
    from aiayn.tokenize import NUM_SPECIAL, TOKENIZER_KINDS

    paths = dict.fromkeys(("train_src", "train_tgt", "train_tsv", "valid_src", "valid_tgt", "valid_tsv", "test_src",
                           "test_tgt", "path", "valid_path", "train", "valid"), _path)
    return {
        "data": {**paths, "max_tokens_per_side": _whole(2), "policy": _choice(*POLICIES),
                 "batch_tokens": _whole(1, "batches of batch_size examples"), "lowercase": _flag,
                 "val_fraction": _number(0, 1), "block_size": _whole(2), "batch_size": _whole(1),
                 "packing": _flag, "eval_batch_size": _whole(1), "eval_max_blocks": _whole(1, "every block"),
                 "text_column": _column, "label_column": _column, "max_len": _whole(3),
                 "mlm_prob": _number(0, 1, open_low=True, closed_high=True),
                 "mask_prob": _number(0, 1, closed_high=True), "random_prob": _number(0, 1, closed_high=True)},
        "tokenizer": {"kind": _choice(*TOKENIZER_KINDS, "pretrained"), "path": _path,
                      "vocab_size": _whole(NUM_SPECIAL, "every word seen"),
                      "joint": _flag,
                      "min_frequency": _whole(1), "split_punctuation": _flag, "dropout": _number(0, 1),
                      "newlines": _flag},
        "decode": {"beam": _whole(1), "alpha": _number(0, math.inf), "max_len_a": _number(0, math.inf),
                   "max_len_b": _whole(0)},
        "eval": {"bleu": _flag, "bleu_sentences": _whole(1), "bleu_beam": _whole(1)},
    }


def _like(default: Any) -> Rule | None:
    """The type check a default implies (None: any value)."""
    if isinstance(default, bool):
        return _flag
    if isinstance(default, int):
        return _whole(-(2**63))
    if isinstance(default, float):
        return _number(-math.inf, math.inf, closed_high=True)
    if isinstance(default, str):
        return lambda v: None if isinstance(v, str) else "must be a string in quotes"
    return None


def section_problems(section: dict[str, Any], known: dict[str, Any], where: str) -> list[str]:
    """Every problem of one section, each as ``[where] key=value: problem; fix``: unknown keys (with the
    closest known one), wrong types, values out of range.

    Args:
        section: the section's keys as the recipe (and its overrides) give them.
        known: every key the section may have, with its default.
        where: the section's name, for messages.
    """
    rules = _rules().get(where, {})
    out = []
    for key, value in section.items():
        if key not in known:
            out.append(f"[{where}] {unknown_key(key, value, known)}")
            continue
        # [train]'s types come from TrainConfig's annotations (which allow None where a default is not None)
        rule = rules.get(key) or (None if where == "train" else _like(known[key]))
        problem = rule(value) if rule is not None else None
        if problem is not None:
            example = f", e.g. {key} = {_toml(known[key])}" if known[key] is not None and rule(known[key]) is None \
                and "e.g." not in problem and "choose one of" not in problem else ""
            out.append(f"[{where}] {key}={value!r}: {problem}{example}")
    merged = {**known, **section}
    probs = [merged.get(k) for k in ("mask_prob", "random_prob")]
    if all(isinstance(x, (int, float)) for x in probs) and sum(probs) > 1:
        out.append(f"[{where}] random_prob={probs[1]!r}: mask_prob + random_prob = {sum(probs):g} must be at most "
                   "1 (the rest of the chosen tokens are kept); lower one of them")
    return out


def _toml(value: Any) -> str:
    """A value as a TOML file writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


_ARCH = {"translation": "encoder-decoder", "lm": "decoder", "mlm": "encoder", "classification": "encoder",
         "image_classification": "encoder"}
_TASK_SECTIONS = ("data", "tokenizer", "decode", "eval")  # read by the task classes; model and train are shared


def recipe_problems(recipe: dict[str, Any], *, resume: bool = False, processes: int = 1) -> list[str]:
    """Every problem of a loaded recipe, section by section (``[section] key=value: problem; fix``), found
    without training a tokenizer, reading data or writing anything.

    The task sections are checked against the task's defaults (``DATA_DEFAULTS``, ... of its module),
    ``[model]`` by building its :class:`~aiayn.config.ModelConfig` as the task would (the vocabulary,
    unknown until the tokenizer is trained, stands in as a placeholder), ``[train]`` by
    :meth:`~aiayn.train.train_config.TrainConfig.check`; data files must exist.

    Args:
        recipe: a recipe from :func:`load_recipe`.
        resume: the run resumes from its checkpoint (encoder tasks then take the model from it).
        processes: the data-parallel processes on this machine (one GPU each when on CUDA).
    """
    from aiayn.train.train_config import TrainConfig

    task = recipe["task"]
    module = importlib.import_module(f"aiayn.tasks.{task}")
    problems: list[str] = []
    merged: dict[str, dict[str, Any]] = {}
    for name in _TASK_SECTIONS:
        defaults = getattr(module, f"{name.upper()}_DEFAULTS", None)
        if defaults is None:
            if recipe[name]:
                problems.append(f"[{name}]: {task} recipes do not read this section; remove it")
            continue
        section_issues = section_problems(recipe[name], defaults, name)
        problems += section_issues
        # keys with problems fall back to their defaults, so the checks below see only good values
        bad = {p.split("] ", 1)[1].split("=", 1)[0] for p in section_issues}
        merged[name] = {**defaults, **{k: v for k, v in recipe[name].items() if k not in bad}}
    tok = merged.get("tokenizer", {})
    if tok.get("dropout") and tok.get("kind") != "bpe":
        problems.append(f"[tokenizer] dropout={tok['dropout']!r}: BPE-dropout skips BPE merges, so it needs "
                        f"kind = \"bpe\", not {tok['kind']!r}; set dropout = 0 or kind = \"bpe\"")
    if "tokenizer" in merged:
        from aiayn.tasks.vocabulary import pretrained_problems

        problems += pretrained_problems(recipe["tokenizer"])
    problems += _data_problems(recipe, task, merged.get("data", {}))
    problems += _model_problems(recipe, task, merged, resume)
    problems += [f"[train] {p}" for p in TrainConfig.check(recipe["train"])]
    device = str(recipe["train"].get("device", "auto"))
    if processes > 1 and device.startswith("cuda:"):
        problems.append(f"[train] device={device!r}: would put all {processes} processes of this machine on one "
                        "GPU; give device = \"cuda\" (each process then takes cuda:LOCAL_RANK) or \"auto\"")
    order = {f"[{s}]": i for i, s in enumerate(SECTIONS)}
    return sorted(problems, key=lambda p: order.get(p.split(" ", 1)[0].rstrip(":"), len(order)))


def validate_recipe(recipe: dict[str, Any], *, resume: bool = False, processes: int = 1) -> None:
    """Raise one :class:`AiaynError` naming the recipe file and listing every problem of every section
    (:func:`recipe_problems`); return quietly when there is none."""
    problems = recipe_problems(recipe, resume=resume, processes=processes)
    if not problems:
        return
    origin = recipe.get("_path", "recipe")
    if len(problems) == 1:
        raise AiaynError(f"{origin}: {problems[0]}")
    raise AiaynError(f"{origin}: {len(problems)} problems; fix them in the recipe or its key=value overrides:\n  - "
                     + "\n  - ".join(problems))


def _data_problems(recipe: dict[str, Any], task: str, data: dict[str, Any]) -> list[str]:
    """The data files a task reads: given, and there."""
    out = []
    if task == "image_classification":
        from aiayn.tasks.image_classification import data_problems

        return data_problems(recipe, data)
    if task == "translation":
        if data["train_tsv"] is None and (data["train_src"] is None or data["train_tgt"] is None):
            out.append("[data]: no training data; set train_src and train_tgt (two aligned files) or train_tsv")
        if data["valid_tsv"] is None and (data["valid_src"] is None) != (data["valid_tgt"] is None):
            given, missing = ("valid_src", "valid_tgt") if data["valid_tgt"] is None else ("valid_tgt", "valid_src")
            out.append(f"[data] {given}={data[given]!r}: {missing} is not set; set both, or neither (no validation)")
        keys = ("train_src", "train_tgt", "train_tsv", "valid_src", "valid_tgt", "valid_tsv")
    elif task == "lm":
        if data["path"] is None:
            out.append("[data]: no training text; set path to a text file or a folder of *.txt documents")
        keys = ("path", "valid_path")
    else:
        if data["train"] is None:
            out.append("[data]: no training data; set train to a .tsv/.csv file"
                       + ("" if task == "classification" else " or a text file with one sentence per line"))
        keys = ("train", "valid")
    for key in keys:
        path = resolve_path(recipe, data[key])
        if path is not None and not path.exists():
            out.append(f"[data] {key}={data[key]!r}: no such file (looked in the current directory and beside the "
                       "recipe); fix the path")
    if task == "lm" and data["packing"] and data["path"] is not None:
        path = resolve_path(recipe, data["path"])
        if path is not None and path.is_file():
            out.append(f"[data] packing=true: needs path to be a folder with one *.txt file per document, but "
                       f"{data['path']!r} is a file; give a folder, or set packing = false")
    return out


def _model_problems(recipe: dict[str, Any], task: str, sections: dict[str, dict[str, Any]],
                    resume: bool) -> list[str]:
    """``[model]`` built into a ModelConfig as the task builds it, with a placeholder vocabulary."""
    from aiayn.config import PRESETS, ModelConfig

    section = dict(recipe["model"])
    data, tok = sections.get("data", {}), sections.get("tokenizer", {})
    encoder = task in ("mlm", "classification")
    if resume:
        if encoder or section.get("init_from"):
            return []  # the run's own checkpoint holds the model config
    elif section.get("init_from"):
        from aiayn.tasks.finetune import source_problems

        _, meta, problems = source_problems(recipe, task)
        if problems or meta is None:
            return problems
        fields = {**meta["model"], **{k: v for k, v in section.items() if k != "init_from"}}
        if task == "classification":
            fields["n_classes"] = 2  # the number of labels in the data
        out = [f"[model] {p}" for p in ModelConfig.check(fields)]
        if not out and task == "lm" and fields.get("max_len", 1024) < data["block_size"]:
            out.append(f"[data] block_size={data['block_size']}: longer than the init_from checkpoint's "
                       f"max_len={fields['max_len']}; lower block_size")
        return out
    section.pop("init_from", None)
    out: list[str] = []
    preset = section.pop("preset", None)
    forced: dict[str, Any] = {"arch": _ARCH[task]}
    base: dict[str, Any] = {}
    if preset is not None:
        if preset not in PRESETS:
            out.append(f"[model] preset={preset!r}: unknown; choose one of {', '.join(PRESETS)}")
        else:
            base = {**PRESETS[preset], "name": preset}
    forced.update(vocab_size=1000, pad_id=0)  # the tokenizer's, once trained
    if task == "translation" and not tok.get("joint", True):
        forced.update(tgt_vocab_size=1000, share_src_tgt_embeddings=False)
    if "max_len" not in section:
        length = data.get("block_size") if task == "lm" else data.get("max_len") if encoder else None
        if length is not None:
            forced["max_len"] = length
    if task == "classification":
        forced["n_classes"] = 2  # the number of labels in the data
    if task == "image_classification":
        from aiayn.tasks.image_classification import model_fields

        forced.update(model_fields(recipe, data, 2))  # 2 stands in for the number of classes in the data
    fields = {**base, **section, **forced}
    problems = ModelConfig.check(fields)
    out += [f"[model] {p}" for p in problems]
    if not problems and task == "lm" and fields.get("max_len", 1024) < data["block_size"]:
        out.append(f"[model] max_len={fields['max_len']}: shorter than data.block_size={data['block_size']}; raise "
                   "max_len or lower data.block_size")
    return out
