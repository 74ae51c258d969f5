"""The WMT 2014 recipes: the paper's settings, Table 3's parameter counts, and ``aiayn train --dry-run`` on a small
stand-in of the data folder (nothing written)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from aiayn.cli.main import main
from aiayn.data.wmt14_standin import write_standin
from aiayn.models.build import build_model
from aiayn.models.stats import count_parameters
from aiayn.tasks.dry_run import dry_run, format_report
from aiayn.tasks.registry import train_config
from aiayn.tasks.translation import build_model_config
from aiayn.train.recipe import load_recipe

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
NAMES = ["wmt14-en-de-base", "wmt14-en-de-big", "wmt14-en-fr-base", "wmt14-en-fr-big"]
TABLE_3 = {"base": 65e6, "big": 213e6}  # Vaswani et al. 2017, Table 3: params (En->De)
DROPOUT = {"wmt14-en-de-base": 0.1, "wmt14-en-de-big": 0.3, "wmt14-en-fr-base": 0.1, "wmt14-en-fr-big": 0.1}


def _recipe(name: str) -> dict:
    return load_recipe(RECIPES / f"{name}.toml", [])


def _count_on_meta(name: str) -> tuple[int, int]:
    """(parameters, d_model) of the recipe's model at its vocabulary size, built without allocating weights."""
    recipe = _recipe(name)
    config = build_model_config(recipe["model"], arch="encoder-decoder", vocab_size=recipe["tokenizer"]["vocab_size"])
    with torch.device("meta"):
        model = build_model(config)
    return count_parameters(model), config.d_model


@pytest.mark.parametrize("size", ["base", "big"])
def test_en_de_parameters_match_table_3_within_2_percent(size: str) -> None:
    count, _ = _count_on_meta(f"wmt14-en-de-{size}")
    assert abs(count - TABLE_3[size]) / TABLE_3[size] < 0.02, count


@pytest.mark.parametrize("size", ["base", "big"])
def test_en_fr_models_differ_from_en_de_only_in_their_vocabulary(size: str) -> None:
    """Table 3 counts the En->De models; the En->Fr ones are the same layers over a 32,000-entry vocabulary."""
    de, d_model = _count_on_meta(f"wmt14-en-de-{size}")
    fr, _ = _count_on_meta(f"wmt14-en-fr-{size}")
    vocab_de = _recipe(f"wmt14-en-de-{size}")["tokenizer"]["vocab_size"]
    vocab_fr = _recipe(f"wmt14-en-fr-{size}")["tokenizer"]["vocab_size"]
    assert vocab_fr == 32000
    assert de - fr == (vocab_de - vocab_fr) * d_model


@pytest.mark.parametrize("name", NAMES)
def test_the_recipes_hold_the_papers_settings(name: str) -> None:
    recipe = _recipe(name)
    cfg = train_config(recipe)
    big = name.endswith("big")
    assert (cfg.optimizer, cfg.betas, cfg.eps, cfg.schedule, cfg.warmup, cfg.lr) == \
        ("adam", (0.9, 0.98), 1e-9, "inverse_sqrt_warmup", 4000, 1.0)
    assert cfg.label_smoothing == 0.1 and cfg.max_steps == (300_000 if big else 100_000)
    assert cfg.save_every_minutes == 10.0 and cfg.average_last == (20 if big else 5)
    assert cfg.keep_checkpoints >= cfg.average_last
    assert (cfg.dtype, cfg.parallel) == ("bfloat16", "fsdp")
    assert recipe["decode"] == {"beam": 4, "alpha": 0.6, "max_len_a": 1.0, "max_len_b": 50}
    config = build_model_config(recipe["model"], arch="encoder-decoder", vocab_size=1000)
    assert config.dropout == DROPOUT[name] and config.share_src_tgt_embeddings and config.tie_embeddings
    assert (config.d_model, config.d_ff, config.n_heads) == ((1024, 4096, 16) if big else (512, 2048, 8))
    assert recipe["tokenizer"]["joint"] is True
    per_step = recipe["data"]["batch_tokens"] * cfg.accum * 8  # on 8 ranks, as the paper's 8 GPUs
    assert abs(per_step - 25_000) / 25_000 < 0.05


@pytest.fixture(scope="module")
def standins(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("wmt14-standin")
    return {pair: write_standin(pair, root / pair, n_train=300, n_test=20)[0].parent for pair in ("en-de", "en-fr")}


def _listing(folder: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(folder)), p.stat().st_mtime_ns) for p in folder.rglob("*"))


@pytest.mark.parametrize("name", NAMES)
def test_the_dry_run_checks_and_plans_each_recipe_writing_nothing(name: str, standins: dict[str, Path],
                                                                 tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The base En->De recipe times a step on the CPU; the others plan from FLOPs alone (building a 215M-parameter
    model and stepping it twice would take this test past its budget)."""
    monkeypatch.chdir(tmp_path)  # the recipe's out_dir, runs/..., would appear here
    data = standins[name.split("-")[1] + "-" + name.split("-")[2]]
    before = _listing(data)
    steps = 1 if name == "wmt14-en-de-base" else 0
    result = dry_run(RECIPES / f"{name}.toml", [], data_dir=str(data), steps=steps, step_tokens=128)
    assert list(tmp_path.iterdir()) == [] and _listing(data) == before
    assert result.params == _count_on_meta(name)[0]  # the full vocabulary, whatever the stand-in's tokenizer learned
    assert set(result.parts) >= {"encoder", "decoder"} and sum(result.parts.values()) == result.params
    one, eight = result.plan[1], result.plan[8]
    assert (one["accum"], eight["accum"]) == (8, 1)
    assert one["tokens_per_step"] == eight["tokens_per_step"] == 25_600
    assert eight["sharded"] and not one["sharded"]
    assert eight["memory"].weights == pytest.approx(one["memory"].weights / 8)
    assert one["memory"].optimizer == pytest.approx(8 * result.params)  # Adam's two float32 moments
    for wall, gpu_hours in eight["gpus"].values():
        assert wall > 0 and gpu_hours == pytest.approx(8 * wall)
    if steps:
        assert len(result.timed) == 1 and result.timed[0][2] > 0 and result.step_seconds > 0
    report = format_report(result, 1.0)
    assert "nothing written" in report and "GPU-h" in report and f"{result.params:,}" in report


def test_the_command_prints_the_plan(standins: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    code = main(["train", str(RECIPES / "wmt14-en-fr-base.toml"), "--dry-run", "--data-dir", str(standins["en-fr"]),
                 "--dry-run-steps", "0"])
    out = capsys.readouterr().out
    assert code == 0 and "8 rank(s): train.accum=1, 25,600 padded tokens" in out and "H100" in out
    assert list(tmp_path.iterdir()) == []


def test_a_dry_run_with_resume_is_refused(capsys: pytest.CaptureFixture) -> None:
    assert main(["train", str(RECIPES / "wmt14-en-de-base.toml"), "--dry-run", "--resume"]) == 2
    assert "--dry-run plans a new run" in capsys.readouterr().err


def test_the_standin_command_writes_the_layout_the_recipes_read(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["data", "standin", "wmt14", "--pair", "en-fr", "--dest", str(tmp_path), "--pairs", "50"]) == 0
    names = {Path(line).name for line in capsys.readouterr().out.split()}
    assert names == {f"{stem}.{lang}" for stem in ("train", "newstest2013", "newstest2014") for lang in ("en", "fr")}
    assert len((tmp_path / "train.fr").read_text().splitlines()) == 50
    assert main(["data", "standin", "multi30k", "--dest", str(tmp_path / "m")]) == 2


def test_a_dry_run_of_another_task_is_refused_by_name(capsys: pytest.CaptureFixture) -> None:
    assert main(["train", str(RECIPES / "shakespeare-char.toml"), "--dry-run"]) == 2
    assert "--dry-run plans translation recipes" in capsys.readouterr().err
