"""Every shipped recipe parses: known keys in every section, a valid model config, a valid [train] section.

Catches a typo in a recipe before a user's hour-long run does.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from aiayn.tasks.registry import train_config
from aiayn.tasks.translation import build_model_config
from aiayn.train.recipe import load_recipe, recipe_problems, take

RECIPES = sorted((Path(__file__).resolve().parents[2] / "recipes").glob("*.toml"))
MODULES = {"translation": "translation", "lm": "lm", "mlm": "mlm", "classification": "classification",
           "image_classification": "image_classification"}
FORCED = {"translation": {"arch": "encoder-decoder"}, "lm": {"arch": "decoder"}, "mlm": {"arch": "encoder"},
          "classification": {"arch": "encoder", "n_classes": 2},
          "image_classification": {"arch": "encoder", "input": "patches", "n_classes": 10}}


def test_there_are_recipes() -> None:
    assert len(RECIPES) >= 7


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_is_valid(path: Path) -> None:
    recipe = load_recipe(path, [])
    task = recipe["task"]
    module = importlib.import_module(f"aiayn.tasks.{MODULES[task]}")
    take(recipe["data"], module.DATA_DEFAULTS, "data")
    tokenizer_defaults = getattr(module, "TOKENIZER_DEFAULTS", None)
    if tokenizer_defaults is not None and "tokenizer" in recipe:
        take(recipe["tokenizer"], tokenizer_defaults, "tokenizer")
    cfg = train_config(recipe)
    assert cfg.max_steps > 0 and cfg.out_dir
    model = dict(recipe["model"])
    if "init_from" not in model:
        config = build_model_config(model, **{**FORCED[task], "vocab_size": 1000})
        assert config.d_model % config.n_heads == 0


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_passes_the_checks_run_before_training(path: Path) -> None:
    """Every section of every shipped recipe is valid; only data and checkpoints this machine lacks may be
    missing (the shared corpora, the checkpoint a fine-tuning recipe starts from)."""
    problems = recipe_problems(load_recipe(path, []))
    absent = ("no such file", "no checkpoint directory")
    assert [p for p in problems if not any(a in p for a in absent)] == []


@pytest.mark.parametrize("value", [2, 10**9])
def test_an_encoder_depth_in_a_language_model_recipe_is_named(value: int) -> None:
    """A decoder-only model has no encoder: ``n_encoder_layers`` there is refused by name (not blamed on the batch
    size through an activation estimate that counted layers the model never builds)."""
    recipe = load_recipe(RECIPES[0].parent / "shakespeare-char.toml", [f"model.n_encoder_layers={value}"])
    problems = recipe_problems(recipe)
    assert any(p.startswith(f"[model] n_encoder_layers={value}: a decoder-only model has no encoder") for p in problems)
    assert not any("batch_size" in p for p in problems)
