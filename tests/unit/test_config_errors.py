"""Mistakes in a recipe are reported all at once, before any work: every section is checked (types, ranges,
unknown keys, files), the message names the recipe file and each problem as ``[section] key=value: problem;
fix``; over-long training pairs are reported at their ``file:line``."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from aiayn.cli.main import main
from aiayn.config import ModelConfig
from aiayn.data.parallel import DataWarning
from aiayn.errors import AiaynError
from aiayn.tasks.registry import run_recipe
from aiayn.tasks.translation import TranslationTask
from aiayn.train.recipe import load_recipe, recipe_problems, validate_recipe
from aiayn.train.schedules import warmup_cosine
from aiayn.train.train_config import TrainConfig

WORDS = "the a dog cat sees sleeps ball small big runs".split()


def _pairs(n: int, long_line: int | None = None, blank_line: int | None = None) -> tuple[str, str]:
    """n aligned lines of source and target text; line ``long_line`` (1-based) is 30 words a side."""
    src, tgt = [], []
    for i in range(1, n + 1):
        if i == blank_line:
            src.append("")
            tgt.append("")
            continue
        width = 30 if i == long_line else 3 + i % 3
        src.append(" ".join(WORDS[(i + k) % len(WORDS)] for k in range(width)))
        tgt.append(" ".join(WORDS[(i * 3 + k) % len(WORDS)] for k in range(width)))
    return "\n".join(src) + "\n", "\n".join(tgt) + "\n"


TRANSLATION = """
task = "translation"
[data]
train_src = "{d}/train.src"
train_tgt = "{d}/train.tgt"
max_tokens_per_side = 16
policy = "{policy}"
batch_tokens = 200
[tokenizer]
kind = "word"
vocab_size = 60
min_frequency = 1
[model]
preset = "tiny"
[train]
out_dir = "{d}/run"
max_steps = 4
warmup = 2
progress = false
"""


def _recipe(tmp: Path, policy: str = "warn", long_line: int | None = None, blank_line: int | None = None) -> Path:
    src, tgt = _pairs(25, long_line, blank_line)
    (tmp / "train.src").write_text(src, encoding="utf-8")
    (tmp / "train.tgt").write_text(tgt, encoding="utf-8")
    path = tmp / "tiny.toml"
    path.write_text(TRANSLATION.format(d=tmp.as_posix(), policy=policy), encoding="utf-8")
    return path


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if a tokenizer is trained or a task is built: validation must come first."""
    def forbidden(*args, **kwargs):
        raise AssertionError("work started before the recipe was validated")

    monkeypatch.setattr("aiayn.tasks.registry.build_task", forbidden)
    monkeypatch.setattr("aiayn.tasks.translation.train_tokenizer", forbidden)


# ---------------------------------------------------------------------------------------- [train] values
@pytest.mark.parametrize("override, fragment", [
    ("train.lr=fast", "[train] lr='fast': must be a number"),
    ("train.lr=-1", "[train] lr=-1: must be a finite number > 0"),
    ("train.keep_checkpoints=-1", "[train] keep_checkpoints=-1: must be >= 0"),
])
def test_bad_train_value_is_one_error_before_any_work(tmp_path: Path, no_work: None, override: str,
                                                      fragment: str) -> None:
    recipe = _recipe(tmp_path)
    with pytest.raises(AiaynError) as exc:
        run_recipe(recipe, [override])
    msg = str(exc.value)
    assert msg == f"{recipe}: {fragment}" or msg.startswith(f"{recipe}: {fragment}")
    assert "\n" not in msg  # one problem, one line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("values, fragment", [
    ({"betas": [0.9, 1.0]}, "betas=(0.9, 1.0): each must be in [0, 1)"),
    ({"eps": 0}, "eps=0: must be a finite number > 0"),
    ({"weight_decay": -0.1, "optimizer": "adamw"}, "weight_decay=-0.1: must be a finite number >= 0"),
    ({"weight_decay": 0.1}, "optimizer = \"adamw\", or weight_decay = 0"),
    ({"warmup": -1, "schedule": "constant_warmup"}, "warmup=-1: must be >= 0"),
    ({"warmup": 0}, "schedule 'inverse_sqrt_warmup' needs warmup >= 1"),
    ({"min_lr_ratio": 1.5}, "min_lr_ratio=1.5: must be in [0, 1]"),
    ({"eval_every": 0}, "eval_every=0: must be >= 1"),
    ({"log_every": 0}, "log_every=0: must be >= 1"),
    ({"save_every": 0}, "save_every=0: must be >= 1, or none"),
    ({"save_every_minutes": 0}, "save_every_minutes=0: must be a finite number > 0, or none"),
    ({"average_last": -1}, "average_last=-1: must be >= 0"),
    ({"average_last": 3}, "average_last=3: averages the periodic checkpoints, but neither save_every nor "
                          "save_every_minutes is set"),
    ({"max_minutes": 0}, "max_minutes=0: must be a finite number > 0, or none"),
    ({"clip_norm": -1.0}, "clip_norm=-1.0: must be a finite number > 0, or none"),
    ({"threads": 0}, "threads=0: must be >= 1, or none"),
    ({"seed": 1.5}, "seed=1.5: must be a whole number"),
    ({"seed": -1}, "seed=-1: must be a whole number from 0 to"),
    ({"schedule": "noam"}, "schedule='noam': unknown; choose one of inverse_sqrt_warmup"),
    ({"optimizer": "sgd"}, "optimizer='sgd': unknown; choose one of adam, adamw"),
    ({"device": "gpu"}, "device='gpu': not a device"),
    ({"progress": "no"}, "progress='no': must be true or false"),
    ({"max_steps": 10.0}, "max_steps=10.0: must be a whole number"),
])
def test_each_train_rule(values: dict, fragment: str) -> None:
    problems = TrainConfig.check(values)
    assert len(problems) == 1 and fragment in problems[0], problems
    with pytest.raises(AiaynError, match=r"invalid \[train\] settings:\n  - ") as exc:
        TrainConfig(**values)
    assert fragment in str(exc.value)
    assert TrainConfig.check({"max_step": 3}) == ["max_step=3: unknown key; did you mean 'max_steps'?"]


def test_an_int_is_a_fine_float_and_good_settings_have_no_problems() -> None:
    assert TrainConfig.check({"lr": 1, "eps": 1, "max_minutes": 5, "betas": [0, 0.5]}) == []
    assert TrainConfig(betas=[0.9, 0.99]).betas == (0.9, 0.99)


# ---------------------------------------------------------------------------------------- every section at once
def test_problems_of_every_section_in_one_message(tmp_path: Path, no_work: None) -> None:
    recipe = _recipe(tmp_path)
    overrides = ["model.d_model=10", "model.n_heads=3", "model.dropuot=0.1", "train.lr=fast", "data.policy=drop",
                 "tokenizer.min_frequency=0", "decode.beam=0", "eval.bleu=yes", "data.train_src=missing.src"]
    with pytest.raises(AiaynError) as exc:
        run_recipe(recipe, overrides)
    header, *lines = str(exc.value).split("\n  - ")
    assert header == f"{recipe}: 8 problems; fix them in the recipe or its key=value overrides:"
    assert lines == [
        "[data] policy='drop': unknown; choose one of skip, warn, error",
        "[data] train_src='missing.src': no such file (looked in the current directory and beside the recipe); "
        "fix the path",
        "[tokenizer] min_frequency=0: must be >= 1, e.g. min_frequency = 2",
        "[model] dropuot=0.1: unknown key; did you mean 'dropout'?",
        "[model] d_model=10: not divisible by n_heads=3; pick n_heads that divides d_model",
        "[train] lr='fast': must be a number, e.g. lr = 1.0",
        "[decode] beam=0: must be >= 1, e.g. beam = 4",
        "[eval] bleu='yes': must be true or false, e.g. bleu = true",
    ]
    assert not (tmp_path / "run").exists()


def test_bad_model_key_and_bad_train_key_are_reported_together(tmp_path: Path) -> None:
    recipe = load_recipe(_recipe(tmp_path), ["model.d_modle=64", "train.keep_checkpoints=-1"])
    with pytest.raises(AiaynError) as exc:
        validate_recipe(recipe)
    msg = str(exc.value)
    assert "[model] d_modle=64: unknown key; did you mean 'd_model'?" in msg
    assert "[train] keep_checkpoints=-1: must be >= 0" in msg


def test_warmup_cosine_message_names_real_keys(tmp_path: Path) -> None:
    recipe = load_recipe(_recipe(tmp_path), ["train.schedule=warmup_cosine", "train.warmup=200", "train.max_steps=100"])
    with pytest.raises(AiaynError) as exc:
        validate_recipe(recipe)
    msg = str(exc.value)
    assert "[train] warmup=200: schedule 'warmup_cosine' needs warmup below max_steps=100" in msg
    assert "lower warmup or raise max_steps" in msg and "total" not in msg
    with pytest.raises(AiaynError, match="train.warmup and train.max_steps"):
        warmup_cosine(warmup=200, total=100)


def test_task_sections_and_cross_checks(tmp_path: Path) -> None:
    lm = tmp_path / "lm.toml"
    (tmp_path / "text.txt").write_text("to be or not to be\n" * 20, encoding="utf-8")
    lm.write_text('task = "lm"\n[data]\npath = "text.txt"\nblock_size = 32\npacking = true\n[model]\nmax_len = 16\n'
                  '[decode]\nbeam = 2\n', encoding="utf-8")
    problems = recipe_problems(load_recipe(lm, ["data.eval_max_blocks=0", "tokenizer.kind=sentencepiece"]))
    assert problems == [
        "[data] eval_max_blocks=0: must be >= 1, or none (every block)",
        "[data] packing=true: needs path to be a folder with one *.txt file per document, but 'text.txt' is a file; "
        "give a folder, or set packing = false",
        "[tokenizer] kind='sentencepiece': unknown; choose one of bpe, char, word, pretrained",
        "[model] max_len=16: shorter than data.block_size=32; raise max_len or lower data.block_size",
        "[decode]: lm recipes do not read this section; remove it",
    ]
    recipe = load_recipe(_recipe(tmp_path), ["tokenizer.dropout=0.1", "data.train_src=none"])
    assert recipe_problems(recipe) == [
        "[data]: no training data; set train_src and train_tgt (two aligned files) or train_tsv",
        "[tokenizer] dropout=0.1: BPE-dropout skips BPE merges, so it needs kind = \"bpe\", not 'word'; set "
        "dropout = 0 or kind = \"bpe\"",
    ]


def test_model_check_lists_problems_without_building() -> None:
    assert ModelConfig.check({"d_model": 64, "n_heads": 4}) == []
    assert ModelConfig.check({"bias": "yes", "n_layers": 0, "d_modle": 3}) == [
        "d_modle=3: unknown key; did you mean 'd_model'?",
        "bias='yes': must be true or false, e.g. bias = true",
        "n_layers=0: must be a whole number >= 1",
    ]


# ---------------------------------------------------------------------------------------- over-long pairs
def test_over_long_pair_is_reported_at_its_file_line_under_error(tmp_path: Path) -> None:
    recipe = load_recipe(_recipe(tmp_path, "error", long_line=20))
    with pytest.raises(AiaynError) as exc:
        TranslationTask(recipe)
    msg = str(exc.value)
    assert msg.startswith(f"{tmp_path / 'train.src'}:20 / {tmp_path / 'train.tgt'}:20: pair longer than 15 tokens")
    assert "data.max_tokens_per_side" in msg and "data.policy" in msg


def test_over_long_pair_is_reported_at_its_file_line_under_warn(tmp_path: Path) -> None:
    recipe = load_recipe(_recipe(tmp_path, "warn", long_line=20, blank_line=3))  # pair 18 of those kept
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        TranslationTask(recipe)
    messages = [str(w.message) for w in record if issubclass(w.category, DataWarning)]
    src, tgt = tmp_path / "train.src", tmp_path / "train.tgt"
    assert messages == [
        f"{src}:3 / {tgt}:3: empty source and target sentence; skipping the pair",
        f"{src} + {tgt}: skipped 1 empty of 25 pairs read",
        f"{src}:20 / {tgt}:20: pair longer than 15 tokens (30 source, 30 target); skipping the pair",
        f"{src} + {tgt}: skipped 1 over-length of 24 pairs read",
    ]


# ---------------------------------------------------------------------------------------- the command line
def test_cli_prints_one_line_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    recipe = _recipe(tmp_path)
    assert main(["train", str(recipe), "train.lr=fast"]) == 2
    err = capsys.readouterr().err
    assert err == f"aiayn train: error: {recipe}: [train] lr='fast': must be a number, e.g. lr = 1.0\n"
    assert not (tmp_path / "run").exists()
