"""The decoding commands say what they do to their input: over-long lines (``--on-long``), blank lines, lines of
unknown words; ``classify`` prints label names; ``aiayn --version``. Tiny random models, saved as checkpoints."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import tomllib
import torch

import aiayn
from aiayn.checkpoint import save_checkpoint
from aiayn.cli.main import main
from aiayn.config import ModelConfig
from aiayn.errors import AiaynError
from aiayn.models.build import build_model
from aiayn.tasks.classification import name_labels
from aiayn.tokenize import CharTokenizer, WordTokenizer

WORDS = "the a cat dog sees runs big small house tree".split()
MAX_LEN = 16


def _save(directory: Path, model: torch.nn.Module, config: dict, tok) -> Path:  # noqa: ANN001
    return save_checkpoint(directory, model, {**config, "model": model.config.to_dict()},
                           tokenizer_writer=lambda d: tok.save(d / "tokenizer.json"))


@pytest.fixture(scope="module")
def translator(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    tok = WordTokenizer(WORDS)
    model = build_model(ModelConfig.preset("tiny", vocab_size=tok.vocab_size, max_len=MAX_LEN))
    with torch.no_grad():  # weights wider than the usual init, so different sources get different translations
        for w in model.parameters():
            if w.dim() > 1:
                w.normal_(0, 0.5)
    return _save(tmp_path_factory.mktemp("ckpt") / "translation", model,
                 {"task": "translation", "tokenizers": {"src": "tokenizer.json", "tgt": "tokenizer.json"},
                  "decode": {"beam": 2, "alpha": 0.6, "max_len_a": 1.0, "max_len_b": 4}}, tok)


def _classifier(directory: Path, **names: list[str]) -> Path:
    """A classification checkpoint whose training file had the labels 0 and 1 (``label_names=[...]``: named)."""
    torch.manual_seed(1)
    tok = WordTokenizer(WORDS)
    model = build_model(ModelConfig.preset("tiny", arch="encoder", vocab_size=tok.vocab_size, max_len=MAX_LEN,
                                           n_classes=2, position="learned"))
    return _save(directory, model, {"task": "classification", "tokenizers": {"text": "tokenizer.json"},
                                    "labels": ["0", "1"], "max_len": MAX_LEN, **names}, tok)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _classifier(tmp_path_factory.mktemp("ckpt") / "classifier", label_names=["negative", "positive"])


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(2)
    tok = CharTokenizer.train(["abcdefgh \n"])
    model = build_model(ModelConfig.preset("tiny", arch="decoder", vocab_size=tok.vocab_size, max_len=MAX_LEN,
                                           position="learned"))
    return _save(tmp_path_factory.mktemp("ckpt") / "lm", model,
                 {"task": "lm", "tokenizers": {"text": "tokenizer.json"}, "block_size": MAX_LEN,
                  "newline_symbol": None}, tok)


def _run(capsys: pytest.CaptureFixture, argv: list[str], stdin: str | None = None,
         monkeypatch: pytest.MonkeyPatch | None = None) -> tuple[int, list[str], list[str]]:
    """``aiayn ARGV`` -> (exit code, stdout lines, stderr lines)."""
    capsys.readouterr()
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    rc = main([*argv, "--accel", "none", "--threads", "1"])
    out, err = capsys.readouterr()
    return rc, out.splitlines(), err.splitlines()


def _lines(tmp_path: Path, *lines: str) -> Path:
    p = tmp_path / "in.txt"
    p.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    return p


SHORT_A, SHORT_B = "the cat sees a dog", "a big house"
LONG = " ".join(WORDS * 4)  # 40 tokens, over the limit of 16


def _translate_alone(capsys: pytest.CaptureFixture, ckpt: Path, tmp_path: Path, line: str) -> str:
    rc, out, _ = _run(capsys, ["translate", "--checkpoint", str(ckpt), "-i", str(_lines(tmp_path, line))])
    assert rc == 0 and len(out) == 1
    return out[0]


def test_long_line_warns_with_its_line_length_and_the_limit(translator: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture) -> None:
    src = _lines(tmp_path, SHORT_A, LONG, SHORT_B)
    rc, out, err = _run(capsys, ["translate", "--checkpoint", str(translator), "-i", str(src)])
    assert rc == 0 and len(out) == 3
    assert len(err) == 1
    assert err[0].startswith(f"aiayn translate: warning: {src}:2: 40 tokens, more than the model's limit of 16 ")
    assert "only its first 16 tokens are translated" in err[0] and "--on-long truncate" in err[0]

    rc, silent, err = _run(capsys, ["translate", "--checkpoint", str(translator), "-i", str(src),
                                    "--on-long", "truncate"])
    assert rc == 0 and err == [] and silent == out

    rc, out, err = _run(capsys, ["translate", "--checkpoint", str(translator), "-i", str(src), "--on-long", "error"])
    assert rc == 2 and out == [] and len(err) == 1
    assert err[0].startswith(f"aiayn translate: error: {src}:2: 40 tokens, more than the model's limit of 16 ")
    assert "split the line" in err[0] and "--on-long truncate" in err[0]


def test_stdin_lines_are_named_as_stdin(translator: Path, capsys: pytest.CaptureFixture,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    rc, out, err = _run(capsys, ["translate", "--checkpoint", str(translator)], f"{SHORT_A}\n{LONG}\n", monkeypatch)
    assert rc == 0 and len(out) == 2
    assert len(err) == 1 and "stdin:2: 40 tokens" in err[0]


def test_blank_lines_give_blank_lines_and_leave_the_others_alone(translator: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture) -> None:
    alone = [_translate_alone(capsys, translator, tmp_path, x) for x in (SHORT_A, SHORT_B)]
    assert alone[0] != alone[1] and all(alone)
    src = _lines(tmp_path, SHORT_A, "", "  \t ", SHORT_B)
    rc, out, err = _run(capsys, ["translate", "--checkpoint", str(translator), "-i", str(src), "--n-best", "2"])
    assert rc == 0 and err == []
    assert out[1:3] == ["", ""] and len(out) == 4
    rc, out, err = _run(capsys, ["translate", "--checkpoint", str(translator), "-i", str(src)])
    assert rc == 0 and err == [] and out == [alone[0], "", "", alone[1]]


def test_lines_of_unknown_words_are_named(translator: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    few_unknown = " ".join(WORDS) + " zebra"  # 1 of 11 unknown: under 10%, no warning
    src = _lines(tmp_path, "the zebra sees a quasar", few_unknown)
    rc, out, err = _run(capsys, ["translate", "--checkpoint", str(translator), "-i", str(src)])
    assert rc == 0 and len(out) == 2
    assert len(err) == 1 and f"{src}:1: 2 of 5 tokens (40%) are unknown to the tokenizer" in err[0]


def test_many_warnings_end_in_a_count(translator: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = _lines(tmp_path, *[LONG] * 12)
    rc, out, err = _run(capsys, ["translate", "--checkpoint", str(translator), "-i", str(src), "--beam", "1"])
    assert rc == 0 and len(out) == 12
    assert len(err) == 11 and f"{src}:10:" in err[9] and "2 more inputs over the limit of 16 tokens" in err[10]


def test_generate_names_a_prompt_longer_than_the_context(lm: Path, capsys: pytest.CaptureFixture) -> None:
    argv = ["generate", "--checkpoint", str(lm), "--prompt", "abc", "--prompt", "abcdefgh" * 5,
            "--max-new-tokens", "3", "--greedy"]
    rc, _, err = _run(capsys, argv)
    assert rc == 0 and len(err) == 1
    assert err[0].startswith("aiayn generate: warning: prompt 2: 40 tokens, more than the model's limit of 15 ")
    assert "last 8 tokens" in err[0]
    rc, _, err = _run(capsys, [*argv, "--on-long", "truncate"])
    assert rc == 0 and err == []
    rc, out, err = _run(capsys, [*argv, "--on-long", "error"])
    assert rc == 2 and out == [] and len(err) == 1 and "prompt 2: 40 tokens" in err[0]


def test_classify_prints_label_names_blank_lines_and_long_texts(classifier: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture) -> None:
    src = _lines(tmp_path, SHORT_A, "", LONG)
    rc, out, err = _run(capsys, ["classify", "--checkpoint", str(classifier), "-i", str(src)])
    assert rc == 0 and len(out) == 3 and out[1] == ""
    for line in (out[0], out[2]):
        label, p = line.split("\t")
        assert label in ("negative", "positive") and 0.5 <= float(p) <= 1
    assert len(err) == 1 and err[0].startswith(f"aiayn classify: warning: {src}:3: 40 tokens, more than the "
                                               "model's limit of 14 ")
    rc, out, err = _run(capsys, ["classify", "--checkpoint", str(classifier), "-i", str(src), "--on-long", "error"])
    assert rc == 2 and out == [] and f"{src}:3: 40 tokens" in err[0]


def test_classify_without_names_prints_the_file_labels(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    plain = _classifier(tmp_path / "plain")
    rc, out, _ = _run(capsys, ["classify", "--checkpoint", str(plain), "-i", str(_lines(tmp_path, SHORT_A))])
    assert rc == 0 and out[0].split("\t")[0] in ("0", "1")


def test_recipe_label_names_map_the_file_labels() -> None:
    assert name_labels(["0", "1"], {"1": "positive", "0": "negative"}, "r.toml") == ["negative", "positive"]
    assert name_labels(["0", "1"], None, "r.toml") is None
    for bad, match in [({"0": "negative"}, "missing \\['1'\\]"), ({"0": "a", "1": "b", "2": "c"}, "not in the file"),
                       ({"0": "same", "1": "same"}, "different"), (["negative", "positive"], "a table"),
                       ({"0": "", "1": "b"}, "non-empty")]:
        with pytest.raises(AiaynError, match=match):
            name_labels(["0", "1"], bad, "r.toml")


def test_version(capsys: pytest.CaptureFixture) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"aiayn {aiayn.__version__}"
    with pytest.raises(SystemExit) as e:  # after other options too, through argparse
        main(["--accel", "none", "--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"aiayn {aiayn.__version__}"
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    assert tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["version"] == aiayn.__version__
