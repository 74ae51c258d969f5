"""Recipes: a TOML file of sections (``[data]``, ``[tokenizer]``, ``[model]``, ``[train]``, ``[decode]``,
``[eval]``) plus ``key=value`` overrides from the command line (``train.max_steps=200``).

Relative paths inside a recipe are resolved against the current directory first, then against the
recipe's own folder.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import tomllib

from aiayn.errors import AiaynError

TASKS = ("translation", "lm", "classification", "mlm")
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
    """Fill defaults from ``known`` and reject keys it does not have (with the list of valid keys)."""
    unknown = [k for k in section if k not in known]
    if unknown:
        raise AiaynError(f"[{where}]: unknown key(s) {unknown}; valid keys: {', '.join(sorted(known))}")
    return {**known, **section}
