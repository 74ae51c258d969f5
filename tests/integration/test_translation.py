"""Translation end to end on a tiny model: recipe -> training -> checkpoint -> translate/evaluate commands,
exact resume, checkpoint averaging, and the errors users hit (mismatched corpora, bad paths, bad overrides)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from aiayn.checkpoint import load_config, load_training_state
from aiayn.cli.main import main
from aiayn.data.download import MULTI30K_SHA256, download_multi30k
from aiayn.errors import AiaynError
from aiayn.pretrained import load_pretrained
from aiayn.tasks.registry import run_recipe
from aiayn.tasks.translation import TranslationTask
from aiayn.train.metrics_log import read_metrics
from aiayn.train.recipe import load_recipe

RECIPE = """
task = "translation"
[data]
train_src = "{d}/train.src"
train_tgt = "{d}/train.tgt.gz"
valid_src = "{d}/valid.src"
valid_tgt = "{d}/valid.tgt"
batch_tokens = 400
[tokenizer]
kind = "word"
vocab_size = 400
min_frequency = 1
[model]
preset = "tiny"
d_model = 32
n_heads = 4
d_ff = 64
dropout = 0.1
[train]
out_dir = "{out}"
max_steps = 12
lr = 1.0
warmup = 4
eval_every = 6
save_every = 3
average_last = 3
log_every = 1
progress = false
threads = 1
[eval]
bleu_sentences = 8
"""


def _recipe(tmp: Path, corpus: Path, name: str = "r.toml") -> Path:
    p = tmp / name
    p.write_text(RECIPE.format(d=corpus, out=tmp / "run"), encoding="utf-8")
    return p


def test_train_translate_evaluate(tmp_path: Path, corpus_dir: Path, capsys: pytest.CaptureFixture) -> None:
    result = run_recipe(_recipe(tmp_path, corpus_dir))
    run = tmp_path / "run"
    assert result.steps == 12 and result.averaged_dir == str(run / "averaged")
    assert "averaged 3 checkpoints (step-6 .. step-12)" in capsys.readouterr().out
    for sub in ("best", "last", "averaged"):
        assert (run / sub / "model.safetensors").is_file()
    assert (run / "last" / "training_state.pt").is_file()
    assert sorted(p.name for p in run.glob("step-*")) == ["step-12", "step-3", "step-6", "step-9"]
    records = read_metrics(run / "metrics.jsonl")
    assert any("val_bleu" in r for r in records) and any("avg_loss" in r for r in records)
    assert (run / "learning_curve.png").stat().st_size > 0

    pre = load_pretrained(run / "best")
    assert pre.task == "translation" and pre.tokenizers["src"] is pre.tokenizers["tgt"]
    capsys.readouterr()
    src = tmp_path / "in.txt"
    src.write_text("the dog sleeps\nthe women see the ball\n", encoding="utf-8")
    assert main(["translate", "--checkpoint", str(run / "best"), "-i", str(src), "--beam", "2", "--n-best", "2"]) == 0
    lines = capsys.readouterr().out.rstrip("\n").split("\n")  # an empty best hypothesis starts with " ||| "
    assert len(lines) == 2 and all(" ||| " in line for line in lines)

    assert main(["evaluate", "--checkpoint", str(run / "best"), "--src", str(corpus_dir / "valid.src"),
                 "--ref", str(corpus_dir / "valid.tgt")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {"sacrebleu", "sacrebleu_signature", "tokenized_lowercase_bleu", "chrf"} <= set(report)
    assert report["sentences"] == 20 and "nrefs:1" in report["sacrebleu_signature"]
    # int8 and bf16 inference are checked against fp32 below, on a model that has learned something


# A model whose fp32 score means something: 300 steps of a 64-wide model reach chrF ~60 on the toy grammar's
# validation sentences (the 12-step model above scores chrF 0, which any broken inference path would match too).
LEARNED = ["model.d_model=64", "model.d_ff=128", "model.dropout=0.0", "train.max_steps=300", "train.lr=3e-3",
           "train.schedule=warmup_cosine", "train.warmup=20", "train.eval_every=1000", "train.save_every=1000",
           "train.average_last=0"]
FP32_CHRF_FLOOR = 40.0  # seen: 59-64 over seeds; an untrained or broken model scores 0-10
CHRF_TOLERANCE = 5.0  # seen: int8 and bf16 within 2 of fp32


def test_int8_and_bf16_inference_score_close_to_fp32(tmp_path: Path, corpus_dir: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    run_recipe(_recipe(tmp_path, corpus_dir), [*LEARNED, "eval.bleu_sentences=20", "eval.bleu_beam=4"])
    best = str(tmp_path / "run" / "best")
    validation = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "val_bleu" in r][-1]
    evaluate = ["evaluate", "--checkpoint", best, "--src", str(corpus_dir / "valid.src"),
                "--ref", str(corpus_dir / "valid.tgt")]
    src = tmp_path / "in.txt"
    src.write_text("the dog sleeps\nthe women see the ball\n", encoding="utf-8")
    chrf, lines = {}, {}
    for name, flags in (("fp32", []), ("int8", ["--int8"]), ("bf16", ["--dtype", "bfloat16", "--device", "cpu"])):
        capsys.readouterr()
        assert main([*evaluate, *flags]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["sentences"] == 20
        chrf[name] = report["chrf"]
        if name == "fp32":
            bleu_fp32, signature = report["sacrebleu"], report["sacrebleu_signature"]
        assert main(["translate", "--checkpoint", best, "-i", str(src), *flags]) == 0
        lines[name] = capsys.readouterr().out.rstrip("\n").split("\n")
    assert chrf["fp32"] > FP32_CHRF_FLOOR, chrf  # first: the comparison below is between real translations
    # BLEU has one scale and one signature: the score logged in training is the one `evaluate` prints (the same 20
    # sentences, beam 4; the training model's and the loaded model's float rounding may flip a rare token)
    assert abs(validation["val_bleu"] - bleu_fp32) < 2.0 and bleu_fp32 > 5.0, (validation, bleu_fp32)
    assert validation["bleu_signature"] == signature == load_config(best)["metrics"]["bleu_signature"]
    assert abs(chrf["int8"] - chrf["fp32"]) < CHRF_TOLERANCE, chrf
    assert abs(chrf["bf16"] - chrf["fp32"]) < CHRF_TOLERANCE, chrf
    for name, out in lines.items():  # one non-empty translation per input line
        assert len(out) == 2 and all(line.strip() for line in out), (name, out)
    assert main(["translate", "--checkpoint", best, "-i", str(src), "--int8", "--dtype", "bfloat16"]) == 2
    assert "--int8 or --dtype" in capsys.readouterr().err


def test_ensemble_translate_and_evaluate(tmp_path: Path, corpus_dir: Path, capsys: pytest.CaptureFixture) -> None:
    """``--checkpoint`` given twice decodes with an ensemble; members that do not match are named."""
    run_recipe(_recipe(tmp_path, corpus_dir))
    best, step6 = str(tmp_path / "run" / "best"), str(tmp_path / "run" / "step-6")
    src = tmp_path / "in.txt"
    src.write_text("the dog sleeps\nthe women see the ball\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["translate", "--checkpoint", best, "-i", str(src), "--beam", "2"]) == 0
    alone = capsys.readouterr().out
    assert main(["translate", "--checkpoint", best, "--checkpoint", best, "-i", str(src), "--beam", "2"]) == 0
    assert capsys.readouterr().out == alone  # the mean of one distribution twice is that distribution
    assert main(["evaluate", "--checkpoint", best, "--checkpoint", step6, "--src", str(corpus_dir / "valid.src"),
                 "--ref", str(corpus_dir / "valid.tgt")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["checkpoints"] == [best, step6] and report["sentences"] == 20

    other = tmp_path / "other"
    shutil.copytree(best, other)
    meta = json.loads((other / "config.json").read_text(encoding="utf-8"))
    tok_file = other / meta["tokenizers"]["tgt"]
    tok = json.loads(tok_file.read_text(encoding="utf-8"))
    tok["words"] = tok["words"][::-1]  # the same words, other ids
    tok_file.write_text(json.dumps(tok), encoding="utf-8")
    (other / "manifest.json").unlink()  # a deliberate edit: accepted once the checksums are gone
    assert main(["translate", "--checkpoint", best, "--checkpoint", str(other), "-i", str(src)]) == 2
    err = capsys.readouterr().err
    assert str(other) in err and "tokenizers differ" in err and "Traceback" not in err


def _full_and_resumed(tmp_path: Path, corpus_dir: Path, overrides: list[str]) -> tuple[Path, Path]:
    """Train 12 steps straight through, and 8 + a resumed 4; return the two run directories."""
    common = [*overrides, "train.eval_every=100", "train.save_every=4", "train.average_last=0"]
    full, part = tmp_path / "full", tmp_path / "part"
    full.mkdir()
    part.mkdir()
    run_recipe(_recipe(full, corpus_dir), common)
    recipe = _recipe(part, corpus_dir)
    run_recipe(recipe, [*common, "train.max_steps=8"])
    run_recipe(recipe, common, resume=True)
    a = [r["train_loss"] for r in read_metrics(full / "run" / "metrics.jsonl") if "train_loss" in r]
    b = [r["train_loss"] for r in read_metrics(part / "run" / "metrics.jsonl") if "train_loss" in r]
    assert len(a) == len(b) == 12
    assert a == pytest.approx(b, abs=1e-6)
    return full / "run", part / "run"


def test_resume_matches_uninterrupted(tmp_path: Path, corpus_dir: Path) -> None:
    full, part = _full_and_resumed(tmp_path, corpus_dir, [])
    wa = load_pretrained(full / "last").model.state_dict()
    wb = load_pretrained(part / "last").model.state_dict()
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_mixed_precision_trains_and_resumes_exactly(tmp_path: Path, corpus_dir: Path, dtype: str,
                                                    device: str) -> None:
    """Autocast training learns; float16 runs with dynamic loss scaling, whose state a resume restores."""
    full, part = _full_and_resumed(tmp_path, corpus_dir, [f"train.dtype={dtype}", f"train.device={device}"])
    steps = [r for r in read_metrics(full / "metrics.jsonl") if "train_loss" in r]
    losses = [r["train_loss"] for r in steps]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    state = load_training_state(part / "last")
    if dtype == "float16":
        assert all(r["loss_scale"] > 0 for r in steps)
        assert state["grad_scaler"]["scale"] == steps[-1]["loss_scale"]
    else:
        assert all("loss_scale" not in r for r in steps) and "grad_scaler" not in state


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_trained_on_cuda_translates_the_same_on_cpu(tmp_path: Path, corpus_dir: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    """A checkpoint written by a CUDA run loads on the CPU; both devices give the same translations."""
    run_recipe(_recipe(tmp_path, corpus_dir), ["train.device=cuda", "train.max_steps=30"])
    src = tmp_path / "in.txt"
    src.write_text("the dog sleeps\nthe women see the ball\nbecause the man sees the dog\n", encoding="utf-8")
    outputs = []
    for device in ("cpu", "cuda"):
        capsys.readouterr()
        assert main(["translate", "--checkpoint", str(tmp_path / "run" / "last"), "-i", str(src), "--beam", "4",
                     "--device", device]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] and outputs[0].count("\n") == 3


# 2000-token batches: 6 per epoch, so the 12 steps span two epochs and the resumed run restarts inside epoch 1
BPE_DROPOUT = ["tokenizer.kind=bpe", "tokenizer.vocab_size=120", "tokenizer.dropout=0.1", "data.batch_tokens=2000"]


def test_bpe_dropout_resegments_each_epoch_and_resumes_exactly(tmp_path: Path, corpus_dir: Path) -> None:
    _full_and_resumed(tmp_path, corpus_dir, BPE_DROPOUT)
    recipe = tmp_path / "part" / "r.toml"
    task = TranslationTask(load_recipe(recipe, BPE_DROPOUT))
    (src0, tgt0), lengths0 = task._epoch_train_data(0)
    (src1, _), _ = task._epoch_train_data(1)
    plain_src, plain_tgt = task.train_ids
    assert src0 != src1 and src0 != plain_src  # a new segmentation every epoch, unlike the plain one
    assert [task.src_tok.decode(x) for x in src0] == [task.src_tok.decode(x) for x in plain_src]
    assert [task.tgt_tok.decode(x) for x in tgt0] == [task.tgt_tok.decode(x) for x in plain_tgt]
    assert lengths0 == [(len(s), len(t) + 1) for s, t in zip(src0, tgt0)]


def test_bpe_dropout_needs_bpe(tmp_path: Path, corpus_dir: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["train", str(_recipe(tmp_path, corpus_dir)), "tokenizer.dropout=0.1"]) != 0
    err = capsys.readouterr().err
    assert 'needs kind = "bpe"' in err and "'word'" in err and "Traceback" not in err


def test_restart_without_resume_refuses_to_overwrite(tmp_path: Path, corpus_dir: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    recipe = _recipe(tmp_path, corpus_dir)
    run_recipe(recipe, ["train.max_steps=2", "train.eval_every=100", "eval.bleu=false"])
    assert main(["train", str(recipe), "train.max_steps=2"]) == 2
    assert "--resume" in capsys.readouterr().err


def test_mismatched_corpora_is_a_clear_error(tmp_path: Path, corpus_dir: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "corpus"
    shutil.copytree(corpus_dir, bad)
    lines = (bad / "train.src").read_text(encoding="utf-8").splitlines()
    (bad / "train.src").write_text("\n".join(lines[:-5]) + "\n", encoding="utf-8")
    assert main(["train", str(_recipe(tmp_path, bad))]) == 2
    err = capsys.readouterr().err
    assert "train.src" in err and "train.tgt.gz" in err and "295" in err and "300" in err
    assert "Traceback" not in err


def test_user_errors_name_the_problem(tmp_path: Path, corpus_dir: Path, capsys: pytest.CaptureFixture) -> None:
    recipe = _recipe(tmp_path, corpus_dir)
    assert main(["train", str(recipe), "model.d_modle=64"]) == 2
    assert "did you mean 'd_model'" in capsys.readouterr().err
    assert main(["train", str(recipe), "train.max_step=3"]) == 2
    assert "max_steps" in capsys.readouterr().err
    assert main(["train", str(tmp_path / "nope.toml")]) == 2
    assert "nope.toml" in capsys.readouterr().err
    assert main(["translate", "--checkpoint", str(tmp_path / "missing")]) == 2
    assert "checkpoint directory not found" in capsys.readouterr().err
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("the dog\nthe caf\xe9 sleeps\n".encode("latin-1"))
    with pytest.raises(AiaynError, match=r"latin1.txt:2"):
        from aiayn.data.text_io import read_lines

        read_lines(latin)


def test_download_checks_sha256_against_a_local_mirror(tmp_path: Path, shared_data: Path) -> None:
    mirror = shared_data / "multi30k"
    got = download_multi30k(tmp_path / "m30k", base_url=mirror.as_uri())
    assert sorted(p.name for p in got) == sorted(MULTI30K_SHA256)
    bad_mirror = tmp_path / "bad"
    bad_mirror.mkdir()
    for name in MULTI30K_SHA256:
        (bad_mirror / name).write_bytes(b"not the file")
    with pytest.raises(AiaynError, match="sha256"):
        download_multi30k(tmp_path / "other", base_url=bad_mirror.as_uri())
    assert not list((tmp_path / "other").glob("*.gz"))  # nothing half-written is left behind
