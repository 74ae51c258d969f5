"""``train.activation_checkpointing`` and ``train.compile`` change how a step is computed, not what it computes:
the same losses and weights as the plain run (a tiny character LM, a few steps)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from aiayn.checkpoint import read_state_dict
from aiayn.config import ModelConfig
from aiayn.errors import AiaynError
from aiayn.models.build import build_model
from aiayn.tasks.registry import run_recipe
from aiayn.train.metrics_log import read_metrics
from aiayn.train.parallel import checkpoint_activations, compile_problem, prepare_model

RECIPE = """
task = "lm"
[data]
path = "{path}"
block_size = 16
batch_size = 4
eval_max_blocks = 2
[tokenizer]
kind = "char"
[model]
d_model = 16
n_heads = 2
n_layers = 2
d_ff = 32
dropout = 0.1
[train]
out_dir = "{out}"
max_steps = 4
optimizer = "adamw"
lr = 3e-3
schedule = "constant_warmup"
warmup = 2
eval_every = 4
log_every = 1
progress = false
threads = 1
device = "cpu"
"""


@pytest.fixture
def recipe_file(tmp_path: Path) -> Path:
    words = "the king and queen of a fair land walk to sea by night with their old dog".split()
    lines = [" ".join(words[(i * 7 + j) % len(words)] for j in range(6 + i % 5)) for i in range(100)]
    (tmp_path / "text.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    path = tmp_path / "lm.toml"
    path.write_text(RECIPE.format(path=tmp_path / "text.txt", out=tmp_path / "run"), encoding="utf-8")
    return path


def _run(recipe: Path, name: str, *overrides: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    out = recipe.parent / name
    run_recipe(recipe, [f"train.out_dir={out}", *overrides])
    losses = [r["train_loss"] for r in read_metrics(out / "metrics.jsonl") if "train_loss" in r]
    return losses, read_state_dict(out / "last")


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float) -> bool:
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=0, atol=atol) for k in a)


def test_activation_checkpointing_recomputes_the_same_step(recipe_file: Path) -> None:
    # with dropout: the recomputed forward pass must draw the same masks
    plain = _run(recipe_file, "plain")
    checkpointed = _run(recipe_file, "checkpointed", "train.activation_checkpointing=true")
    assert checkpointed[0] == pytest.approx(plain[0], rel=0, abs=1e-6)
    assert _close(checkpointed[1], plain[1], 1e-6)


def test_checkpointed_layers_keep_their_names_and_skip_recomputing_without_gradients() -> None:
    torch.manual_seed(0)
    model = build_model(ModelConfig.preset("tiny", arch="decoder", dropout=0.0))
    names = list(model.state_dict())
    ids = torch.randint(0, model.config.vocab_size, (2, 8))
    reference = model(ids).logits
    checkpoint_activations(model)
    assert list(model.state_dict()) == names
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference)


@pytest.mark.skipif(compile_problem() is not None, reason=str(compile_problem()))
def test_a_compiled_run_makes_the_steps_of_the_eager_one(recipe_file: Path) -> None:
    # without dropout: inductor draws its masks from its own generator; without biases: a key bias's gradient is
    # zero up to rounding, which Adam turns into full-size updates of either sign
    exact = ("model.dropout=0.0", "model.bias=false")
    eager = _run(recipe_file, "eager", "train.accel=none", *exact)
    compiled = _run(recipe_file, "compiled", "train.compile=true", *exact)
    assert compiled[0] == pytest.approx(eager[0], rel=0, abs=1e-5)
    assert _close(compiled[1], eager[1], 1e-5)


def test_compiling_without_a_c_compiler_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    model = build_model(ModelConfig.preset("tiny", arch="decoder"))
    with pytest.raises(AiaynError, match="train.compile=true: torch.compile on the CPU needs a C compiler"):
        prepare_model(model, activation_checkpointing=False, compile_model=True)
