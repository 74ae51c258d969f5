"""Encoder tasks end to end on tiny models: masked-LM pretraining, classification from scratch and from
the MLM checkpoint, exact MLM resume, the ``classify`` command, evaluation and input errors."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from aiayn.checkpoint import read_state_dict
from aiayn.cli.main import main
from aiayn.errors import AiaynError
from aiayn.evaluate.run import evaluate_classifier
from aiayn.pretrained import load_pretrained
from aiayn.tasks.classification import ClassificationTask
from aiayn.tasks.registry import run_recipe
from aiayn.train.recipe import load_recipe

GOOD = "great lovely superb moving funny brilliant".split()
BAD = "dull awful boring messy tedious bland".split()
FILLER = "the film a story with its cast and plot is was".split()

MODEL = """
[model]
d_model = 32
n_heads = 2
n_layers = 2
d_ff = 64
dropout = 0.0
position = "learned"
norm_position = "pre"
scale_embeddings = false
pooling = "mean"
"""
TRAIN = """
[train]
out_dir = "{out}"
max_steps = {steps}
optimizer = "adamw"
lr = 3e-3
schedule = "constant_warmup"
warmup = 5
label_smoothing = 0.0
eval_every = {steps}
log_every = 1
progress = false
threads = 1
"""
DATA = """
[data]
train = "{train}"
valid = "{valid}"
max_len = 24
batch_size = 16
"""
TOKENIZER = """
[tokenizer]
kind = "word"
"""


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny models run fastest (and steadiest on a shared machine) on one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _tsv(path: Path, n: int, seed: int) -> Path:
    rng = random.Random(seed)
    rows = ["label\tsentence"]
    for _ in range(n):
        label = rng.randint(0, 1)
        words = [rng.choice(FILLER) for _ in range(rng.randint(3, 7))] + [rng.choice(GOOD if label else BAD)]
        rng.shuffle(words)
        rows.append(f"{label}\t{' '.join(words)}")
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("sst")
    return {"train": _tsv(d / "train.tsv", 400, 0), "valid": _tsv(d / "dev.tsv", 60, 1)}


def _recipe(tmp: Path, data: dict[str, Path], task: str, name: str, steps: int, model: str = MODEL,
            tokenizer: str = TOKENIZER) -> Path:
    text = (f'task = "{task}"\n' + DATA.format(train=data["train"].as_posix(), valid=data["valid"].as_posix())
            + tokenizer + model + TRAIN.format(out=(tmp / name).as_posix(), steps=steps))
    path = tmp / f"{name}.toml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def mlm_checkpoint(tmp_path_factory: pytest.TempPathFactory, data: dict[str, Path]) -> Path:
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("mlm")
    result = run_recipe(_recipe(tmp, data, "mlm", "mlm", 10), [])
    assert result.best_metric is not None
    return tmp / "mlm" / "best"


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory, data: dict[str, Path]) -> Path:
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("cls")
    result = run_recipe(_recipe(tmp, data, "classification", "cls", 60), [])
    assert result.best_metric >= 0.9  # one sentiment word decides the label: easy to learn
    return tmp / "cls" / "best"


def test_mlm_checkpoint(mlm_checkpoint: Path) -> None:
    pre = load_pretrained(mlm_checkpoint)
    assert pre.task == "mlm" and pre.config.arch == "encoder" and pre.tokenizers["text"].kind == "word"
    rows = [json.loads(x) for x in (mlm_checkpoint.parent / "metrics.jsonl").read_text().splitlines()]
    assert any("val_masked_accuracy" in r for r in rows)


@pytest.mark.parametrize("batching", [[], ["data.batch_tokens=150"]], ids=["fixed", "token-budget"])
def test_mlm_resume_equals_uninterrupted(tmp_path: Path, data: dict[str, Path], batching: list[str]) -> None:
    """Batch order and masking resume exactly from the (epoch, index) position (400 examples / 16 =
    25 batches per epoch, so 30 steps cross an epoch boundary; with a 150-token budget, about 27)."""
    run_recipe(_recipe(tmp_path, data, "mlm", "full", 30), ["model.dropout=0.1", *batching])
    parts = _recipe(tmp_path, data, "mlm", "parts", 30)
    run_recipe(parts, ["model.dropout=0.1", "train.max_steps=24", *batching])
    run_recipe(parts, ["model.dropout=0.1", *batching], resume=True)

    def losses(name: str) -> dict[int, float]:
        rows = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        return {r["step"]: r["train_loss"] for r in rows if "train_loss" in r}

    full, resumed = losses("full"), losses("parts")
    assert sorted(full) == sorted(resumed) == list(range(1, 31))
    for step in full:
        assert resumed[step] == pytest.approx(full[step], abs=1e-6), step


def test_finetune_from_mlm_checkpoint(tmp_path: Path, data: dict[str, Path], mlm_checkpoint: Path,
                                      capsys: pytest.CaptureFixture) -> None:
    model = f'[model]\ninit_from = "{mlm_checkpoint.as_posix()}"\npooling = "cls"\n'
    recipe = load_recipe(_recipe(tmp_path, data, "classification", "ft", 5, model=model, tokenizer=""))
    task = ClassificationTask(recipe)
    report = capsys.readouterr().out
    assert "newly initialized: ['cls_head.dense.bias'" in report
    missing, unexpected = task.init_report
    assert sorted(missing) == ["cls_head.dense.bias", "cls_head.dense.weight", "cls_head.out.bias",
                               "cls_head.out.weight"] and unexpected == []
    assert task.model_config.d_model == 32 and task.model_config.pooling == "cls"
    saved = read_state_dict(mlm_checkpoint)
    state = task.model.state_dict()
    assert "embed.weight" in saved and "encoder.layers.1.ffn.w_in.weight" in saved
    for name, value in saved.items():  # every pretrained tensor (embeddings, encoder, MLM head) is copied
        torch.testing.assert_close(state[name], value)
    assert task.tok.vocab_size == load_pretrained(mlm_checkpoint).tokenizers["text"].vocab_size

    result = run_recipe(tmp_path / "ft.toml", [])
    assert result.steps == 5 and load_pretrained(tmp_path / "ft" / "best").meta["labels"] == ["0", "1"]

    bad = tmp_path / "bad.toml"
    text = (tmp_path / "ft.toml").read_text()
    bad.write_text(text.replace(mlm_checkpoint.as_posix(), str(tmp_path / "no")))
    assert main(["train", str(bad)]) == 2
    assert str(tmp_path / "no") in capsys.readouterr().err


def test_classifier_evaluate_and_classify_cli(classifier: Path, data: dict[str, Path], tmp_path: Path,
                                              capsys: pytest.CaptureFixture) -> None:
    pre = load_pretrained(classifier)
    assert pre.task == "classification" and pre.meta["labels"] == ["0", "1"] and pre.config.n_classes == 2
    scores = evaluate_classifier(pre, data["valid"])
    assert scores["accuracy"] >= 0.9 and scores["examples"] == 60
    assert sum(map(sum, scores["confusion"])) == 60 and "true \\ pred" in scores["confusion_text"]
    assert set(scores["per_class"]) == {"0", "1"}

    texts = tmp_path / "texts.txt"
    texts.write_text("the film was brilliant\na dull story\nawful awful plot\n", encoding="utf-8")
    assert main(["classify", "--checkpoint", str(classifier), "--input", str(texts)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in out] == ["1", "0", "0"]
    assert all(0.5 <= float(line.split("\t")[1]) <= 1.0 for line in out)
    # bf16 inference: the same labels, probabilities within bf16 rounding
    assert main(["classify", "--checkpoint", str(classifier), "--input", str(texts), "--dtype", "bfloat16",
                 "--device", "cpu"]) == 0
    out_bf16 = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in out_bf16] == ["1", "0", "0"]
    for line, line_bf16 in zip(out, out_bf16, strict=True):
        assert abs(float(line.split("\t")[1]) - float(line_bf16.split("\t")[1])) < 0.05


def test_broken_tsv_row_is_a_clear_error(tmp_path: Path, data: dict[str, Path],
                                         capsys: pytest.CaptureFixture) -> None:
    broken = tmp_path / "broken.tsv"
    broken.write_text("label\tsentence\n1\ta fine film\n0\ttoo\tmany\tcolumns\n", encoding="utf-8")
    recipe = _recipe(tmp_path, {"train": broken, "valid": data["valid"]}, "classification", "broken", 2)
    assert main(["train", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert f"{broken}:3" in err and "Traceback" not in err
    assert main(["classify", "--checkpoint", str(tmp_path / "missing")]) == 2
    mlm_recipe = _recipe(tmp_path, {"train": broken, "valid": data["valid"]}, "mlm", "broken_mlm", 2)
    with pytest.raises(AiaynError, match=f"{broken}:3"):
        run_recipe(mlm_recipe, [])


def test_classify_rejects_other_checkpoints(mlm_checkpoint: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["classify", "--checkpoint", str(mlm_checkpoint)]) == 2
    assert "classification" in capsys.readouterr().err


def _named(recipe: Path, names: str) -> Path:
    """``recipe`` with ``[data] label_names = NAMES``."""
    recipe.write_text(recipe.read_text(encoding="utf-8").replace("[data]\n", f"[data]\nlabel_names = {names}\n"),
                      encoding="utf-8")
    return recipe


def test_label_names_are_saved_and_shown(tmp_path: Path, data: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    run_recipe(_named(_recipe(tmp_path, data, "classification", "named", 3), '{ 0 = "negative", 1 = "positive" }'),
               [])
    best = tmp_path / "named" / "best"
    pre = load_pretrained(best)
    assert pre.meta["labels"] == ["0", "1"] and pre.meta["label_names"] == ["negative", "positive"]
    assert set(evaluate_classifier(pre, data["valid"])["per_class"]) == {"negative", "positive"}
    texts = tmp_path / "texts.txt"
    texts.write_text("the film was brilliant\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["classify", "--checkpoint", str(best), "--input", str(texts)]) == 0
    assert capsys.readouterr().out.split("\t")[0] in ("negative", "positive")

    bad = _named(_recipe(tmp_path, data, "classification", "badly_named", 3), '{ 0 = "negative", 2 = "positive" }')
    with pytest.raises(AiaynError, match=r"label_names .*missing \['1'\]"):
        run_recipe(bad, [])
