"""Command-line mistakes that once ended in a traceback, a hang, a wrong exit code or a silently wrong result; each
now gives one ``aiayn COMMAND: error: ...`` naming the option, key or file, and exit code 2.

(tests/reliability/test_cli_bad_input.py tries such mistakes by the hundred; these are the ones it found.)
"""

from __future__ import annotations

import math
import threading
from pathlib import Path

import pytest
import torch

from aiayn import ModelConfig, build_model
from aiayn.checkpoint import save_checkpoint
from aiayn.cli.main import main
from aiayn.errors import AiaynError
from aiayn.tokenize import CharTokenizer, WordTokenizer

TEXT = ["the small dog runs .", "a red bird sings over the house .", "the cat sleeps near the river ,"]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny random checkpoints as training writes them: task -> checkpoint folder."""
    root = tmp_path_factory.mktemp("ckpts")
    word, char = WordTokenizer.train(TEXT), CharTokenizer.train(TEXT)
    base = dict(d_model=16, n_heads=2, d_ff=32, max_len=32, dropout=0.0, n_layers=1)
    setups = {
        "translation": (word, dict(arch="encoder-decoder", n_encoder_layers=1),
                        {"tokenizers": {"src": "tokenizer.json", "tgt": "tokenizer.json"},
                         "decode": {"beam": 2, "alpha": 0.6, "max_len_a": 1.0, "max_len_b": 4}, "lowercase": False}),
        "lm": (char, dict(arch="decoder"), {"tokenizers": {"text": "tokenizer.json"}, "block_size": 16,
                                            "newline_symbol": None, "packing": False}),
        "classification": (word, dict(arch="encoder", n_encoder_layers=1, n_classes=2),
                           {"tokenizers": {"text": "tokenizer.json"}, "labels": ["0", "1"], "max_len": 16}),
    }
    out = {}
    for task, (tok, fields, meta) in setups.items():
        config = ModelConfig(vocab_size=tok.vocab_size, **base, **fields)
        torch.manual_seed(0)
        out[task] = save_checkpoint(root / task / "best", build_model(config).eval(),
                                    {"task": task, "model": config.to_dict(), **meta},
                                    tokenizer_writer=lambda d, tok=tok: tok.save(d / "tokenizer.json"))
    (root / "in.txt").write_text("the dog runs .\n", encoding="utf-8")
    out["input"] = root / "in.txt"
    return out


def _cli(capsys: pytest.CaptureFixture, argv: list[str]) -> tuple[int, str]:
    """Exit code and stderr of ``aiayn argv``."""
    rc = main([*argv, "--threads", "1"])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err


def test_a_parse_error_returns_2_and_names_the_command(capsys: pytest.CaptureFixture) -> None:
    """main() returns argparse's exit code instead of raising SystemExit, and an unknown option is said by the
    command (it was ``aiayn: error: unrecognized arguments``)."""
    assert main(["translate"]) == 2
    assert "aiayn translate: error: the following arguments are required: --checkpoint" in capsys.readouterr().err
    assert main(["translate", "--checkpoint", "x", "--bogus"]) == 2
    assert "aiayn translate: error: unrecognized arguments: --bogus" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ numeric options
@pytest.mark.parametrize("task, argv, flag", [
    ("lm", ["generate", "--temperature", "-1"], "--temperature"),  # was ValueError from make_sampler
    ("lm", ["generate", "--temperature", "nan"], "--temperature"),  # was RuntimeError from torch.multinomial
    ("lm", ["generate", "--max-new-tokens", "-5"], "--max-new-tokens"),  # was exit 0
    ("lm", ["generate", "--max-new-tokens", "0"], "--max-new-tokens"),  # was exit 0, nothing generated
    ("lm", ["generate", "--top-k", "0"], "--top-k"),  # was ValueError
    ("lm", ["generate", "--top-p", "1.5"], "--top-p"),  # was accepted
    ("lm", ["generate", "--top-p", "0"], "--top-p"),  # was ValueError
    ("lm", ["generate", "--seed", str(10**23)], "--seed"),  # was ValueError (overflow)
    ("translation", ["translate", "--batch-size", "0"], "--batch-size"),  # was ValueError from range()
    ("translation", ["translate", "--batch-size", "-1"], "--batch-size"),  # was TypeError
    ("translation", ["translate", "--beam", "0"], "--beam"),  # was silently the checkpoint's beam
    ("translation", ["translate", "--alpha", "nan"], "--alpha"),  # was IndexError
    ("translation", ["translate", "--alpha", "-1"], "--alpha"),  # was accepted
    ("classification", ["classify", "--batch-size", "-3"], "--batch-size"),  # was exit 0 and blank labels
    ("lm", ["evaluate", "--context", "0"], "--context"),  # was silently the default
    ("lm", ["evaluate", "--stride", "0"], "--stride"),  # was silently the default
])
def test_a_bad_number_is_refused_naming_the_option(ckpts: dict[str, Path], capsys: pytest.CaptureFixture,
                                                    task: str, argv: list[str], flag: str) -> None:
    where = ["--data", str(ckpts["input"])] if argv[0] == "evaluate" else \
        ["-i", str(ckpts["input"])] if argv[0] in ("translate", "classify") else []
    rc, err = _cli(capsys, [argv[0], "--checkpoint", str(ckpts[task]), *where, *argv[1:]])
    assert rc == 2
    assert f"aiayn {argv[0]}: error: argument {flag}" in err


def test_a_beam_wider_than_the_vocabulary_is_refused(ckpts: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    """It gave empty translations (every beam but one ended at once), and a huge one would not fit in memory."""
    rc, err = _cli(capsys, ["translate", "--checkpoint", str(ckpts["translation"]), "-i", str(ckpts["input"]),
                            "--beam", "100000"])
    assert rc == 2 and "aiayn translate: error: --beam 100000: more than the" in err


def test_n_best_above_the_beam_names_the_option(ckpts: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    rc, err = _cli(capsys, ["translate", "--checkpoint", str(ckpts["translation"]), "-i", str(ckpts["input"]),
                            "--n-best", "3"])
    assert rc == 2 and "--n-best 3: more than the beam (2)" in err


def test_any_finite_temperature_samples(ckpts: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    """1e308 and 1e-300 made inf / inf or 0 / 0 in float32 (RuntimeError from torch.multinomial)."""
    from aiayn.generate.sampling import make_sampler

    scores = torch.log_softmax(torch.randn(3, 11), -1)
    scores[:, 0] = float("-inf")  # a banned id
    for t in (1e308, 1e30, 1.0, 1e-30, 1e-300, 5e-324):
        tokens = make_sampler(t, generator=torch.Generator().manual_seed(0))(scores)
        assert ((tokens > 0) & (tokens < 11)).all()
    assert (make_sampler(1e-300)(scores) == scores.argmax(-1)).all()  # a tiny temperature is greedy
    for t in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="temperature"):
            make_sampler(t)
    rc, _ = _cli(capsys, ["generate", "--checkpoint", str(ckpts["lm"]), "--temperature", "1e308",
                          "--max-new-tokens", "3"])
    assert rc == 0


# ------------------------------------------------------------------------------------------------ devices, outputs
@pytest.mark.parametrize("name", ["nope", "cuda:99"])
def test_a_bad_device_is_refused(ckpts: dict[str, Path], capsys: pytest.CaptureFixture, name: str) -> None:
    """It was a RuntimeError from torch.device, or an AssertionError ("Torch not compiled with CUDA enabled")."""
    rc, err = _cli(capsys, ["generate", "--checkpoint", str(ckpts["lm"]), "--device", name])
    assert rc == 2 and f"aiayn generate: error: --device {name}:" in err
    rc, err = _cli(capsys, ["check", "--preset", "tiny", "--no-resume", "--device", name])
    assert rc == 2 and f"aiayn check: error: --device {name}:" in err


@pytest.mark.parametrize("flag", ["--output", "--attention"])
def test_an_output_that_is_a_folder_is_refused_before_decoding(ckpts: dict[str, Path], tmp_path: Path,
                                                               capsys: pytest.CaptureFixture, flag: str) -> None:
    """It was an IsADirectoryError from the atomic write, after all the decoding."""
    rc, err = _cli(capsys, ["translate", "--checkpoint", str(ckpts["translation"]), "-i", str(ckpts["input"]),
                            flag, str(tmp_path)])
    assert rc == 2 and f"aiayn translate: error: {flag} {tmp_path}: is a folder" in err


def test_inspect_html_into_a_folder_is_refused(ckpts: dict[str, Path], tmp_path: Path,
                                               capsys: pytest.CaptureFixture) -> None:
    rc, err = _cli(capsys, ["inspect", "--checkpoint", str(ckpts["lm"]), "--html", str(tmp_path)])
    assert rc == 2 and f"--html {tmp_path}: is a folder" in err


# ------------------------------------------------------------------------------------------------ checkpoints
def test_a_run_folder_is_named_as_one(ckpts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """It said ``runs/demo/config.json: checkpoint has no config.json; the checkpoint is incomplete``."""
    import shutil

    run = tmp_path / "demo"
    shutil.copytree(ckpts["translation"], run / "best")
    shutil.copytree(ckpts["translation"], run / "last")
    rc, err = _cli(capsys, ["translate", "--checkpoint", str(run), "-i", str(ckpts["input"])])
    assert rc == 2
    assert f"aiayn translate: error: {run}: a training run's folder, not a checkpoint; pass one of its " \
           f"checkpoints: {run / 'best'}, {run / 'last'}" in err
    rc, err = _cli(capsys, ["average", str(run), "--out", str(tmp_path / "avg")])
    assert rc == 2 and f"{run}: a training run's folder" in err


@pytest.mark.parametrize("key, value", [("tokenizers", "x"), ("tokenizers", {"text": 5}), ("block_size", "x"),
                                        ("labels", 5), ("label_names", 3), ("model", [])])
def test_a_config_json_entry_of_the_wrong_type_is_named(ckpts: dict[str, Path], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture, key: str, value) -> None:
    """They were AttributeError, TypeError or IndexError far from the file."""
    import json
    import shutil

    task = "classification" if key.startswith("label") else "lm"
    ckpt = tmp_path / "ckpt"
    shutil.copytree(ckpts[task], ckpt)
    (ckpt / "manifest.json").unlink()  # a deliberate edit
    meta = json.loads((ckpt / "config.json").read_text(encoding="utf-8"))
    meta[key] = value
    (ckpt / "config.json").write_text(json.dumps(meta), encoding="utf-8")
    argv = ["classify", "-i", str(ckpts["input"])] if task == "classification" else ["generate"]
    rc, err = _cli(capsys, [argv[0], "--checkpoint", str(ckpt), *argv[1:]])
    assert rc == 2 and f"{ckpt / 'config.json'}: {key}=" in err


# ------------------------------------------------------------------------------------------------ recipes and data
def test_a_recipe_that_is_not_utf8_is_named_with_its_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """It was a UnicodeDecodeError."""
    path = tmp_path / "latin1.toml"
    path.write_bytes('task = "lm"\n# caf\xe9\n'.encode("latin-1"))
    rc, err = _cli(capsys, ["train", str(path)])
    assert rc == 2 and f"aiayn train: error: {path}:2: the recipe is not UTF-8 text" in err


def test_a_folder_given_as_the_recipe_is_named_as_one(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rc, err = _cli(capsys, ["train", str(tmp_path)])
    assert rc == 2 and f"{tmp_path}: is a folder, not a recipe" in err


def test_a_stray_word_label_among_whole_number_labels_is_an_error(tmp_path: Path) -> None:
    """``positive`` in a 0/1 file silently made a third class."""
    from aiayn.data.classification import load_labeled_text

    path = tmp_path / "train.tsv"
    path.write_text("label\tsentence\n0\tgood film\n1\tbad film\npositive\tok film\n1\tdull\n", encoding="utf-8")
    with pytest.raises(AiaynError, match=rf"{path}:4: label 'positive' is not a whole number like the other labels"):
        load_labeled_text(path)
    words = tmp_path / "words.tsv"
    words.write_text("label\tsentence\npositive\tgood film\nnegative\tbad film\n", encoding="utf-8")
    assert load_labeled_text(words).label_names == ["negative", "positive"]  # all words: fine
    assert len(load_labeled_text(path, texts_only=True).texts) == 4  # masked-LM pretraining reads texts only


def _translation_recipe(tmp_path: Path, src: str, tgt: str) -> dict:
    from aiayn.train.recipe import load_recipe

    path = tmp_path / "r.toml"
    path.write_text(f'task = "translation"\n[data]\ntrain_src = "{src}"\ntrain_tgt = "{tgt}"\n[tokenizer]\n'
                    'kind = "word"\n[model]\npreset = "tiny"\n', encoding="utf-8")
    return load_recipe(path)


def test_empty_parallel_corpora_are_an_error_not_a_hang(tmp_path: Path) -> None:
    """Training on them never finished its first epoch."""
    from aiayn.tasks.translation import TranslationTask

    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    result: list[BaseException | None] = []

    def build() -> None:
        try:
            TranslationTask(_translation_recipe(tmp_path, str(empty), str(empty)))
            result.append(None)
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            result.append(e)

    worker = threading.Thread(target=build, daemon=True)
    worker.start()
    worker.join(60)
    assert result and isinstance(result[0], AiaynError)
    assert f"{empty} and {empty}: the files are empty" in str(result[0])


def test_parallel_corpora_of_only_unusable_pairs_are_an_error(tmp_path: Path) -> None:
    from aiayn.tasks.translation import TranslationTask

    src, tgt = tmp_path / "a.txt", tmp_path / "b.txt"
    src.write_text("\n  \nword\n", encoding="utf-8")
    tgt.write_text("x\ny\n\n", encoding="utf-8")
    with pytest.warns(UserWarning), pytest.raises(AiaynError, match="none of the 3 training pairs can be used"):
        TranslationTask(_translation_recipe(tmp_path, str(src), str(tgt)))


def test_a_huge_length_penalty_is_no_overflow(ckpts: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    """``--alpha 1e9`` was an OverflowError in the length penalty ((7/6) ** 1e9)."""
    from aiayn.generate.common import length_penalty

    assert length_penalty(3, 1e9) == math.inf and length_penalty(1, 1e9) == 1.0
    rc, _ = _cli(capsys, ["translate", "--checkpoint", str(ckpts["translation"]), "-i", str(ckpts["input"]),
                          "--alpha", "1e9"])
    assert rc == 0


def test_an_option_given_the_value_double_dash_is_refused(ckpts: dict[str, Path],
                                                          capsys: pytest.CaptureFixture) -> None:
    """``--beam=--`` reached the command as an empty list (TypeError: '>' between list and int)."""
    rc, err = _cli(capsys, ["translate", "--checkpoint", str(ckpts["translation"]), "-i", str(ckpts["input"]),
                            "--beam=--"])
    assert rc == 2 and "aiayn translate: error: argument --beam: expected one argument" in err


def test_text_that_was_not_utf8_on_the_command_line_is_refused(ckpts: dict[str, Path], tmp_path: Path,
                                                               capsys: pytest.CaptureFixture) -> None:
    """An undecodable byte in ``--text`` (a lone surrogate in Python) was a UnicodeEncodeError writing the page."""
    rc, err = _cli(capsys, ["inspect", "--checkpoint", str(ckpts["translation"]), "--text", "ab\udcffcd", "--html",
                            str(tmp_path / "page.html")])
    assert rc == 2 and "aiayn inspect: error: argument --text: not valid UTF-8 text (byte 0xff)" in err
    assert not (tmp_path / "page.html").exists()


@pytest.mark.parametrize("override, named", [("model.d_ff=1000000000000", "d_ff=1000000000000"),
                                             ("model.n_layers=1000000000", "n_layers=1000000000"),
                                             ("data.batch_size=100000000000", "[data] batch_size=100000000000")])
def test_a_model_or_batch_no_machine_holds_is_refused_before_allocating(tmp_path: Path, override: str, named: str,
                                                                         capsys: pytest.CaptureFixture) -> None:
    """They were a RuntimeError from torch's allocator (``can't allocate memory: you tried to allocate ...``), or
    minutes of building layers first."""
    (tmp_path / "text.txt").write_text("\n".join(TEXT * 10) + "\n", encoding="utf-8")
    recipe = tmp_path / "lm.toml"
    recipe.write_text(f'task = "lm"\n[data]\npath = "{tmp_path / "text.txt"}"\nblock_size = 16\nbatch_size = 4\n'
                      f'[tokenizer]\nkind = "char"\n[model]\nd_model = 16\nn_heads = 2\nn_layers = 1\nd_ff = 32\n'
                      f'[train]\nout_dir = "{tmp_path / "run"}"\nmax_steps = 2\n', encoding="utf-8")
    rc, err = _cli(capsys, ["train", str(recipe), override])
    assert rc == 2 and named in err and "more than this machine's" in err
    assert not (tmp_path / "run").exists()


def test_a_checkpoint_config_no_machine_holds_is_refused(ckpts: dict[str, Path], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    import json
    import shutil

    ckpt = tmp_path / "ckpt"
    shutil.copytree(ckpts["lm"], ckpt)
    (ckpt / "manifest.json").unlink()
    meta = json.loads((ckpt / "config.json").read_text(encoding="utf-8"))
    meta["model"]["d_ff"] = 10**12
    (ckpt / "config.json").write_text(json.dumps(meta), encoding="utf-8")
    rc, err = _cli(capsys, ["generate", "--checkpoint", str(ckpt)])
    assert rc == 2 and f"{ckpt / 'config.json'}: model d_model=16, d_ff=1000000000000" in err


@pytest.mark.parametrize("override", ["=1", "data.=1", "data..path=x"])
def test_an_override_with_an_empty_name_is_refused(override: str) -> None:
    """``=1`` was "unknown top-level key(s) ['']" and ``data..path=x`` a nested table ``{'path': 'x'}``."""
    from aiayn.train.recipe import apply_overrides

    with pytest.raises(AiaynError, match=f"override '{override}': an empty name"):
        apply_overrides({"data": {}}, [override])


def test_evaluating_an_empty_source_file_names_it(ckpts: dict[str, Path], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    """It said ``corpus_bleu: got no sentences to score``, naming no file."""
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    rc, err = _cli(capsys, ["evaluate", "--checkpoint", str(ckpts["translation"]), "--src", str(empty), "--ref",
                            str(empty)])
    assert rc == 2 and f"aiayn evaluate: error: {empty}: the file is empty" in err


def test_a_validation_set_of_only_over_long_pairs_is_an_error(tmp_path: Path) -> None:
    """Training went on validating nothing (``val_loss=nan`` at every evaluation)."""
    from aiayn.tasks.translation import TranslationTask
    from aiayn.train.recipe import load_recipe

    good, long = tmp_path / "good.txt", tmp_path / "long.txt"
    good.write_text("a b\nc d\n", encoding="utf-8")
    long.write_text(" ".join(["w"] * 500) + "\n", encoding="utf-8")
    path = tmp_path / "r.toml"
    path.write_text(f'task = "translation"\n[data]\ntrain_src = "{good}"\ntrain_tgt = "{good}"\nvalid_src = "{long}"\n'
                    f'valid_tgt = "{long}"\n[tokenizer]\nkind = "word"\nmin_frequency = 1\n[model]\npreset = "tiny"\n',
                    encoding="utf-8")
    with pytest.warns(UserWarning), pytest.raises(AiaynError, match="every pair is longer than"):
        TranslationTask(load_recipe(path))
