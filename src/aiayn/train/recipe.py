"""Recipes: a TOML file of sections (``[data]``, ``[tokenizer]``, ``[model]``, ``[train]``, ``[decode]``,
``[eval]``) plus ``key=value`` overrides from the command line (``train.max_steps=200``).

Relative paths inside a recipe are resolved against the current directory first, then against the
recipe's own folder.

:func:`validate_recipe` checks every section before anything is built (no tokenizer trained, no data
read, nothing written) and raises one :class:`AiaynError` that lists every problem of every section,
each as ``[section] key=value: problem; fix``. The rules are :mod:`aiayn.validation`'s, as for every other
section of settings. What is particular to a task (the defaults of the sections it reads, its model family, its
data checks) each task registers (:class:`TaskChecks`, :func:`register_task`; :mod:`aiayn.tasks.recipe_checks`),
so that this module reads no task module.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

from aiayn.config import PRESETS, ModelConfig
from aiayn.data.parallel import POLICIES
from aiayn.errors import AiaynError
from aiayn.models.stats import memory_bytes, size_problem
from aiayn.tokenize import NUM_SPECIAL, TOKENIZER_KINDS
from aiayn.train.train_config import TrainConfig
from aiayn.validation import Problems, Rule, at_least, choice, first, of_type, rule, type_of, unknown_key, within

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
        parts = [p.strip() for p in key.split(".")]
        if not all(parts):
            raise AiaynError(f"override {item!r}: an empty name in {key.strip()!r}; write section.key=value (e.g. "
                             "train.max_steps=200)")
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
        AiaynError: missing file, a folder, bytes that are not UTF-8 (with line), invalid TOML (with line), unknown
            task or section.
    """
    p = Path(path)
    if p.is_dir():
        raise AiaynError(f"{p}: is a folder, not a recipe; give a recipe file (e.g. recipes/multi30k-en-de.toml)")
    if not p.is_file():
        raise AiaynError(f"{p}: recipe not found; see recipes/ for examples")
    recipe = _parse_toml(p)
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


def _parse_toml(p: Path) -> dict[str, Any]:
    """The table a recipe file holds.

    Raises:
        AiaynError: an unreadable file, bytes that are not UTF-8 (naming the line), or invalid TOML (naming the line).
    """
    try:
        data = p.read_bytes()
    except OSError as e:
        raise AiaynError(f"{p}: cannot read the recipe ({e.strerror or e}); make the file readable") from None
    try:
        text = data.decode("utf-8-sig")  # a byte-order mark (as some editors write) is dropped
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise AiaynError(f"{p}:{line}: the recipe is not UTF-8 text (byte {data[e.start]:#04x}); save it as UTF-8, "
                         f"e.g. iconv -f latin1 -t utf-8 {p} > fixed.toml") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise AiaynError(f"{p}: invalid TOML: {e}; fix the file") from None


DATA_FILE_KEYS = ("train_src", "train_tgt", "train_tsv", "valid_src", "valid_tgt", "valid_tsv", "test_src", "test_tgt",
                  "path", "valid_path", "train", "valid")


def with_data_dir(recipe: dict[str, Any], data_dir: str | Path) -> dict[str, Any]:
    """Point every ``[data]`` file of ``recipe`` at the file of the same name in ``data_dir`` (in place; returns the
    recipe): the same recipe on data kept elsewhere, or on a small stand-in of the same layout."""
    data = recipe.setdefault("data", {})
    for key in DATA_FILE_KEYS:
        if isinstance(data.get(key), str):
            data[key] = str(Path(data_dir) / Path(data[key]).name)
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
@dataclass(frozen=True)
class TaskChecks:
    """What :func:`recipe_problems` knows of one task. The task layer registers one per task
    (:func:`register_task`; :mod:`aiayn.tasks.recipe_checks`), so that this module reads no task module.

    Attributes:
        arch: the model family the task builds (``"encoder-decoder"``, ``"decoder"``, ``"encoder"``).
        sections: the task sections it reads (of ``data``, ``tokenizer``, ``decode``, ``eval``), each with its keys'
            defaults; a recipe must leave the others empty.
        data_problems: ``(recipe, [data] with defaults) -> problems``: data given, files there.
        model_fields: ``(recipe, [data] with defaults) -> fields`` the task sets in ``[model]`` itself, beside the
            family and the vocabulary (an image model's input); None: none.
        tokenizer_problems: ``(the recipe's [tokenizer]) -> problems`` beyond each key's own rule.
        init_from_problems: ``(recipe, task) -> (checkpoint folder, its config.json, problems)`` of ``[model]
            init_from``.
    """

    arch: str
    sections: dict[str, dict[str, Any]]
    data_problems: Callable[[dict[str, Any], dict[str, Any]], list[str]]
    model_fields: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]] | None = None
    tokenizer_problems: Callable[[dict[str, Any]], list[str]] | None = None
    init_from_problems: Callable[[dict[str, Any], str], tuple[Any, Any, list[str]]] | None = None


_TASK_CHECKS: dict[str, TaskChecks] = {}


def register_task(name: str, checks: TaskChecks) -> None:
    """Make ``checks`` the recipe checks of task ``name`` (one of :data:`TASKS`)."""
    _TASK_CHECKS[name] = checks


def task_checks(name: str) -> TaskChecks:
    """The registered recipe checks of task ``name``.

    Raises:
        AiaynError: none registered (the task modules were not imported: import :mod:`aiayn.tasks.registry`).
    """
    if name not in _TASK_CHECKS:
        raise AiaynError(f"task {name!r}: its recipe checks are not registered; import aiayn.tasks.registry (which "
                         "registers every task's) before checking a recipe")
    return _TASK_CHECKS[name]


def _whole(low: int, unset: str | None = None) -> Rule:
    """A whole number >= ``low`` (or none, meaning ``unset``, when ``unset`` is given)."""
    none = f"none ({unset})" if unset else None
    return first(of_type("int | None", none) if none else of_type("int"), at_least(low, unset=none))


def _number(low: float, high: float = math.inf, *, open_low: bool = False, closed_high: bool = False) -> Rule:
    """A finite number in [low, high) (``open_low``: (low, ...; ``closed_high``: ..., high])."""
    span = (at_least(low, finite=True) if math.isinf(high)
            else within(low, high, open_low=open_low, closed_high=closed_high))
    return first(of_type("float"), span)


_FLAG = of_type("bool")
_PATH = rule(lambda v: v is None or isinstance(v, str), "must be a file path in quotes")
_COLUMN = rule(lambda v: v is None or isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool) and v >= 0),
               "must be a column name in quotes, or a 0-based column number")


def _rules() -> dict[str, dict[str, Rule]]:
    """The rules of the keys of the task sections, by section and key (a key the tasks share means the
    same everywhere). A key without a rule must have its default's type."""
    paths = dict.fromkeys(DATA_FILE_KEYS, _PATH)
    return {
        "data": {**paths, "max_tokens_per_side": _whole(2), "policy": choice(POLICIES),
                 "batch_tokens": _whole(1, "batches of batch_size examples"), "lowercase": _FLAG,
                 "val_fraction": _number(0, 1), "block_size": _whole(2), "batch_size": _whole(1),
                 "packing": _FLAG, "eval_batch_size": _whole(1), "eval_max_blocks": _whole(1, "every block"),
                 "text_column": _COLUMN, "label_column": _COLUMN, "max_len": _whole(3),
                 "mlm_prob": _number(0, 1, open_low=True, closed_high=True),
                 "mask_prob": _number(0, 1, closed_high=True), "random_prob": _number(0, 1, closed_high=True)},
        "tokenizer": {"kind": choice((*TOKENIZER_KINDS, "pretrained")), "path": _PATH,
                      "vocab_size": _whole(NUM_SPECIAL, "every word seen"), "joint": _FLAG,
                      "min_frequency": _whole(1), "split_punctuation": _FLAG, "dropout": _number(0, 1),
                      "newlines": _FLAG},
        "decode": {"beam": _whole(1), "alpha": _number(0), "max_len_a": _number(0), "max_len_b": _whole(0)},
        "eval": {"bleu": _FLAG, "bleu_sentences": _whole(1), "bleu_beam": _whole(1)},
    }


def section_problems(section: dict[str, Any], known: dict[str, Any], where: str) -> list[str]:
    """Every problem of one section, each as ``[where] key=value: problem; fix``: unknown keys (with the
    closest known one), wrong types, values out of range.

    Args:
        section: the section's keys as the recipe (and its overrides) give them.
        known: every key the section may have, with its default.
        where: the section's name, for messages.
    """
    return _section(section, known, where).lines


def _section(section: dict[str, Any], known: dict[str, Any], where: str) -> Problems:
    """:func:`section_problems`, with the keys that have them."""
    rules = _rules().get(where, {})
    p = Problems(section, prefix=f"[{where}] ")
    for key, value in section.items():
        if key not in known:
            p.line(unknown_key(key, value, known), key)
            continue
        # [train]'s types come from TrainConfig's annotations (which allow None where a default is not None)
        kind = type_of(known[key])
        r = rules.get(key) or (None if where == "train" or kind is None else of_type(kind))
        if r is not None:
            p.check(key, r, example=known[key])
    merged = {**known, **section}
    probs = [merged.get(k) for k in ("mask_prob", "random_prob")]
    if all(isinstance(x, (int, float)) for x in probs) and sum(probs) > 1:
        p.line(f"random_prob={probs[1]!r}: mask_prob + random_prob = {sum(probs):g} must be at most 1 (the rest of "
               "the chosen tokens are kept); lower one of them", "random_prob")
    return p


_TASK_SECTIONS = ("data", "tokenizer", "decode", "eval")  # read by the task classes; model and train are shared


def recipe_problems(recipe: dict[str, Any], *, resume: bool = False, processes: int = 1) -> list[str]:
    """Every problem of a loaded recipe, section by section (``[section] key=value: problem; fix``), found
    without training a tokenizer, reading data or writing anything.

    The task sections are checked against the task's defaults and checks (:class:`TaskChecks`, registered by the
    task layer), ``[model]`` by building its :class:`~aiayn.config.ModelConfig` as the task would (the vocabulary,
    unknown until the tokenizer is trained, stands in as a placeholder), ``[train]`` by
    :meth:`~aiayn.train.train_config.TrainConfig.check`; data files must exist.

    Args:
        recipe: a recipe from :func:`load_recipe`.
        resume: the run resumes from its checkpoint (encoder tasks then take the model from it).
        processes: the data-parallel processes on this machine (one GPU each when on CUDA).
    """
    task = recipe["task"]
    checks = task_checks(task)
    problems: list[str] = []
    merged: dict[str, dict[str, Any]] = {}
    for name in _TASK_SECTIONS:
        defaults = checks.sections.get(name)
        if defaults is None:
            if recipe[name]:
                problems.append(f"[{name}]: {task} recipes do not read this section; remove it")
            continue
        section = _section(recipe[name], defaults, name)
        problems += section.lines
        # keys with problems fall back to their defaults, so the checks below see only good values
        merged[name] = {**defaults, **{k: v for k, v in recipe[name].items() if k not in section.keys}}
    tok = merged.get("tokenizer", {})
    if tok.get("dropout") and tok.get("kind") != "bpe":
        problems.append(f"[tokenizer] dropout={tok['dropout']!r}: BPE-dropout skips BPE merges, so it needs "
                        f"kind = \"bpe\", not {tok['kind']!r}; set dropout = 0 or kind = \"bpe\"")
    if "tokenizer" in merged and checks.tokenizer_problems is not None:
        problems += checks.tokenizer_problems(recipe["tokenizer"])
    problems += checks.data_problems(recipe, merged.get("data", {}))
    problems += _model_problems(recipe, task, checks, merged, resume)
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


def file_problems(recipe: dict[str, Any], data: dict[str, Any], keys: tuple[str, ...]) -> list[str]:
    """``[data] key=...: no such file`` for each of ``keys`` that names a file not there (looked for as
    :func:`resolve_path` does); for a task's :attr:`TaskChecks.data_problems`."""
    out = []
    for key in keys:
        path = resolve_path(recipe, data[key])
        if path is not None and not path.exists():
            out.append(f"[data] {key}={data[key]!r}: no such file (looked in the current directory and beside the "
                       "recipe); fix the path")
    return out


def _model_problems(recipe: dict[str, Any], task: str, checks: TaskChecks, sections: dict[str, dict[str, Any]],
                    resume: bool) -> list[str]:
    """``[model]`` built into a ModelConfig as the task builds it, with a placeholder vocabulary."""
    section = dict(recipe["model"])
    data, tok = sections.get("data", {}), sections.get("tokenizer", {})
    encoder = task in ("mlm", "classification")
    if resume:
        if encoder or section.get("init_from"):
            return []  # the run's own checkpoint holds the model config
    elif section.get("init_from") and checks.init_from_problems is not None:
        _, meta, problems = checks.init_from_problems(recipe, task)
        if problems or meta is None:
            return problems
        fields = {**meta["model"], **{k: v for k, v in section.items() if k != "init_from"}}
        if task == "classification":
            fields["n_classes"] = 2  # the number of labels in the data
        out = [f"[model] {p}" for p in ModelConfig.check(fields)] or _size_problems(fields, task, data)
        if not out and task == "lm" and fields.get("max_len", 1024) < data["block_size"]:
            out.append(f"[data] block_size={data['block_size']}: longer than the init_from checkpoint's "
                       f"max_len={fields['max_len']}; lower block_size")
        return out
    section.pop("init_from", None)
    out: list[str] = []
    preset = section.pop("preset", None)
    forced: dict[str, Any] = {"arch": checks.arch}
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
    if checks.model_fields is not None:
        forced.update(checks.model_fields(recipe, data))
    fields = {**base, **section, **forced}
    problems = ModelConfig.check(fields)
    if fields.get("arch") == "decoder" and section.get("n_encoder_layers") is not None:
        problems.append(f"n_encoder_layers={section['n_encoder_layers']!r}: a decoder-only model has no encoder "
                        "(n_layers sets its depth); remove it")
    out += [f"[model] {p}" for p in problems] or _size_problems(fields, task, data)
    if not problems and task == "lm" and fields.get("max_len", 1024) < data["block_size"]:
        out.append(f"[model] max_len={fields['max_len']}: shorter than data.block_size={data['block_size']}; raise "
                   "max_len or lower data.block_size")
    return out


def _size_problems(fields: dict[str, Any], task: str, data: dict[str, Any]) -> list[str]:
    """A model, or a batch of its activations, too large for this machine's memory (a typo such as
    ``d_ff = 20480000`` or ``batch_size = 10000000000``), found before anything is allocated."""
    config = ModelConfig(**fields)
    problem = size_problem(config, 16, "train (weights, gradients and Adam's two moments)")
    if problem is not None:
        block = task == "lm" and data.get("block_size") == config.max_len
        return [f"[model] {problem}" + (" (max_len is data.block_size here)" if block else "")]
    if task == "lm":
        key, tokens = "batch_size", data.get("batch_size", 1) * data.get("block_size", 1)
    elif data.get("batch_tokens") is not None:
        key, tokens = "batch_tokens", data["batch_tokens"]
    else:
        key, tokens = "batch_size", data.get("batch_size", 1) * (data.get("max_len") or config.max_len)
    # at the least, each layer keeps a few d_model-wide activations per token for the backward pass, and the output
    # layer one score per vocabulary entry
    layers = {"decoder": config.n_layers, "encoder": config.encoder_layers}.get(
        config.arch, max(config.n_layers, config.encoder_layers))  # the stacks this model builds
    need = tokens * (4 * config.d_model * layers + config.target_vocab_size) * 4
    have = memory_bytes(need)
    if need > have:
        return [f"[data] {key}={data.get(key)!r}: a batch of {tokens:,} tokens needs at least {need / 2**30:,.0f} GiB "
                f"of activations, more than this machine's {have / 2**30:,.0f} GiB; lower {key}"]
    return []
