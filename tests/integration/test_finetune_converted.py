"""Fine-tuning converted checkpoints: ``[model] init_from`` for language modeling, translation and classification,
with the pretrained tokenizer kept and ``[train] freeze``.

Tiny random transformers models (GPT-2, BART, a BERT classifier) are built from their config classes beside tiny
tokenizers, saved with ``save_pretrained`` and converted with ``from_hf``; a recipe then starts from each converted
checkpoint and trains a few steps on generated text. The first step's loss is the converted model's loss on that
batch (its weights are loaded), the validation loss goes down, the saved checkpoint keeps the pretrained tokenizer
and its special ids, frozen parameters stay as they were while the others move, and a bad ``init_from`` is one
clear error.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")
from tokenizers import Tokenizer as HFTokenizer  # noqa: E402
from tokenizers import models, normalizers, pre_tokenizers, trainers  # noqa: E402

from aiayn.checkpoint import read_state_dict  # noqa: E402
from aiayn.cli.main import main  # noqa: E402
from aiayn.errors import AiaynError  # noqa: E402
from aiayn.hf import from_hf  # noqa: E402
from aiayn.models.losses import IGNORE_INDEX  # noqa: E402
from aiayn.pretrained import load_pretrained  # noqa: E402
from aiayn.tasks.classification import ClassificationTask  # noqa: E402
from aiayn.tasks.lm import LMTask  # noqa: E402
from aiayn.tasks.registry import run_recipe  # noqa: E402
from aiayn.tasks.translation import TranslationTask  # noqa: E402
from aiayn.train.recipe import load_recipe, validate_recipe  # noqa: E402

D, H, FF, MAX = 32, 4, 48, 64
WORDS = "the a small big red blue dog cat bird runs sleeps jumps sings over under near house tree river".split()


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 7))) for _ in range(n)]


def _merges(tok: HFTokenizer) -> list[tuple[str, str]]:
    merges = json.loads(tok.to_str())["model"]["merges"]
    return [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in merges]  # type: ignore[misc]


def _byte_bpe(specials: list[str]) -> HFTokenizer:
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(_sentences(200, 9), trainers.BpeTrainer(
        vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    return tok


def _gpt2(folder: Path) -> None:
    tok = _byte_bpe(["<|endoftext|>"])
    transformers.GPT2TokenizerFast(vocab=tok.get_vocab(with_added_tokens=False), merges=_merges(tok)).save_pretrained(
        folder)
    eos = tok.token_to_id("<|endoftext|>")
    cfg = transformers.GPT2Config(vocab_size=tok.get_vocab_size(), n_positions=MAX, n_embd=D, n_layer=2, n_head=H,
                                  n_inner=FF, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=eos,
                                  eos_token_id=eos)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(folder)


def _bart(folder: Path) -> None:
    tok = _byte_bpe(["<s>", "<pad>", "</s>", "<unk>"])
    vocab = tok.get_vocab(with_added_tokens=False)
    vocab["<mask>"] = len(vocab)
    transformers.BartTokenizerFast(vocab=vocab, merges=_merges(tok)).save_pretrained(folder)
    cfg = transformers.BartConfig(vocab_size=len(vocab), d_model=D, encoder_layers=2, decoder_layers=2,
                                  encoder_attention_heads=H, decoder_attention_heads=H, encoder_ffn_dim=FF,
                                  decoder_ffn_dim=FF, max_position_embeddings=MAX, dropout=0.0, attention_dropout=0.0,
                                  activation_dropout=0.0, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                  decoder_start_token_id=2, forced_eos_token_id=2)
    torch.manual_seed(0)
    transformers.BartForConditionalGeneration(cfg).save_pretrained(folder)


def _bert_classifier(folder: Path) -> None:
    tok = HFTokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(_sentences(200, 9), trainers.WordPieceTrainer(
        vocab_size=120, special_tokens=["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
        show_progress=False))
    transformers.BertTokenizerFast(vocab=tok.get_vocab()).save_pretrained(folder)
    cfg = transformers.BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=D, num_hidden_layers=2,
                                  num_attention_heads=H, intermediate_size=FF, max_position_embeddings=MAX,
                                  type_vocab_size=2, pad_token_id=0, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0, num_labels=2)
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(cfg).save_pretrained(folder)


BUILDERS = {"gpt2": _gpt2, "bart": _bart, "bert": _bert_classifier}


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """family -> its converted aiayn checkpoint, and "family-hf" -> the transformers folder it came from."""
    out = {}
    for name, build in BUILDERS.items():
        folder = tmp_path_factory.mktemp(f"hf-{name}")
        build(folder)
        out[name] = from_hf(folder, tmp_path_factory.mktemp("converted") / name)
        out[f"{name}-hf"] = folder
    return out


TRAIN = """
[train]
out_dir = "{out}"
max_steps = {steps}
optimizer = "adam"
lr = {lr}
schedule = "constant_warmup"
warmup = 0
label_smoothing = 0.0
eval_every = {steps}
log_every = 1
progress = false
threads = 1
device = "cpu"
"""


def _write(tmp: Path, name: str, text: str, steps: int = 5, lr: float = 3e-3, train: str = "") -> Path:
    path = tmp / f"{name}.toml"
    path.write_text(text + TRAIN.format(out=(tmp / name).as_posix(), steps=steps, lr=lr) + train, encoding="utf-8")
    return path


def _lm_recipe(tmp: Path, checkpoint: Path, name: str = "lm", model: str = "", **kw) -> Path:
    (tmp / "text.txt").write_text("\n".join(_sentences(300, 1)) + "\n", encoding="utf-8")
    text = (f'task = "lm"\n[data]\npath = "{(tmp / "text.txt").as_posix()}"\nblock_size = 24\nbatch_size = 8\n'
            f'val_fraction = 0.1\n[model]\ninit_from = "{checkpoint.as_posix()}"\ndropout = 0.0\n{model}')
    return _write(tmp, name, text, **kw)


def _translation_recipe(tmp: Path, checkpoint: Path, name: str = "mt", **kw) -> Path:
    for split, n, seed in (("train", 200, 2), ("valid", 20, 3)):  # "translate" = reverse the words
        rows = [f"{s}\t{' '.join(reversed(s.split()))}" for s in _sentences(n, seed)]
        (tmp / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    text = (f'task = "translation"\n[data]\ntrain_tsv = "{(tmp / "train.tsv").as_posix()}"\n'
            f'valid_tsv = "{(tmp / "valid.tsv").as_posix()}"\nbatch_tokens = 300\n'
            f'[model]\ninit_from = "{checkpoint.as_posix()}"\n[eval]\nbleu = false\n')
    return _write(tmp, name, text, **kw)


def _classification_recipe(tmp: Path, checkpoint: Path, name: str = "cls", **kw) -> Path:
    for split, n, seed in (("train", 200, 4), ("valid", 40, 5)):  # label: does a dog occur?
        rows = ["label\tsentence"] + [f"{int('dog' in s.split())}\t{s}" for s in _sentences(n, seed)]
        (tmp / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    text = (f'task = "classification"\n[data]\ntrain = "{(tmp / "train.tsv").as_posix()}"\n'
            f'valid = "{(tmp / "valid.tsv").as_posix()}"\nmax_len = 24\nbatch_size = 16\n'
            f'[model]\ninit_from = "{checkpoint.as_posix()}"\n')
    return _write(tmp, name, text, **kw)


def _rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def _first_loss(run: Path) -> float:
    return next(r["train_loss"] for r in _rows(run) if r.get("step") == 1 and "train_loss" in r)


def _final_val(run: Path) -> float:
    return [r["val_loss"] for r in _rows(run) if "val_loss" in r][-1]


def _assert_kept_tokenizer(run: Path, checkpoint: Path, role: str) -> None:
    before, after = load_pretrained(checkpoint).tokenizers[role], load_pretrained(run / "last").tokenizers[role]
    assert after.kind == "pretrained" and after.vocab_size == before.vocab_size
    for attr in ("pad_id", "bos_id", "eos_id", "unk_id", "mask_id", "decoder_start_id"):
        assert getattr(after, attr) == getattr(before, attr), attr
    assert after.encode("the red dog runs") == before.encode("the red dog runs")


def _moved(run: Path, checkpoint: Path) -> dict[str, bool]:
    """Each tensor of the checkpoint: whether training changed it."""
    before, after = read_state_dict(checkpoint), read_state_dict(run / "last")
    return {k: not torch.equal(before[k], after[k]) for k in before}


# ---------------------------------------------------------------------------------------------- language modeling
def test_lm_from_converted_gpt2(tmp_path: Path, converted: dict[str, Path]) -> None:
    checkpoint = converted["gpt2"]
    recipe = _lm_recipe(tmp_path, checkpoint)
    task = LMTask(load_recipe(recipe))
    tok = task.codec.tokenizer
    assert tok.kind == "pretrained" and tok.pads_with_eos
    before_val = task.evaluate()["loss"]
    batch, _ = next(task.batches(None))
    pre = load_pretrained(checkpoint)
    with torch.no_grad():
        logits = pre.model(batch["ids"]).logits  # (B, T, V)
    expected = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten()).item()

    run_recipe(recipe, [])
    assert _first_loss(tmp_path / "lm") == pytest.approx(expected, rel=1e-4)
    assert _final_val(tmp_path / "lm") < before_val - 0.05
    _assert_kept_tokenizer(tmp_path / "lm", checkpoint, "text")
    meta = load_pretrained(tmp_path / "lm" / "last").meta
    assert meta["model"]["d_model"] == D and meta["model"]["max_len"] == MAX

    # init_from is a start: --resume continues from last/
    run_recipe(recipe, ["train.max_steps=7"], resume=True)
    assert [r["step"] for r in _rows(tmp_path / "lm") if "train_loss" in r] == list(range(1, 8))


def test_lm_freeze(tmp_path: Path, converted: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    checkpoint = converted["gpt2"]
    recipe = _lm_recipe(tmp_path, checkpoint, name="frozen", steps=3, train='freeze = ["decoder.layers.0.*"]\n')
    run_recipe(recipe, [])
    out = capsys.readouterr()
    assert "frozen: 12 parameter tensors (decoder.layers.0.*)" in out.out + out.err
    moved = _moved(tmp_path / "frozen", checkpoint)
    assert not any(v for k, v in moved.items() if k.startswith("decoder.layers.0."))
    assert all(v for k, v in moved.items() if k.startswith("decoder.layers.1.") and k.endswith("weight"))
    assert moved["embed.weight"]
    with pytest.raises(AiaynError, match=r"trained with train.freeze=\['decoder.layers.0.\*'\], this one has None"):
        run_recipe(recipe, ["train.freeze=none", "train.max_steps=4"], resume=True)
    run_recipe(recipe, ["train.max_steps=4"], resume=True)
    assert not any(v for k, v in _moved(tmp_path / "frozen", checkpoint).items() if k.startswith("decoder.layers.0."))

    bad = _lm_recipe(tmp_path, checkpoint, name="badfreeze", steps=2, train='freeze = ["encoder.*"]\n')
    with pytest.raises(AiaynError, match=r"'encoder\.\*' match\(es\) no parameter.*decoder\.layers\.0\."):
        run_recipe(bad, [])


# ---------------------------------------------------------------------------------------------- translation
def test_translation_from_converted_bart(tmp_path: Path, converted: dict[str, Path]) -> None:
    checkpoint = converted["bart"]
    recipe = _translation_recipe(tmp_path, checkpoint, lr=1e-3)
    task = TranslationTask(load_recipe(recipe))
    tok = task.tgt_tok
    assert tok.kind == "pretrained" and task.src_tok is tok and (tok.pad_id, tok.eos_id) == (1, 2)
    before_val = task.evaluate()["loss"]
    batch, _ = next(task.batches(None))
    assert (batch["tgt_in"][:, 0] == tok.decoder_start_id).all() and tok.decoder_start_id == 2  # BART starts at </s>
    assert (batch["src"] == 1).any()  # padded with BART's pad id
    # sources framed <s> ... </s> in training as in decoding (generate.translate.source_ids), as BART was trained
    assert all(ids[0] == tok.bos_id and ids[-1] == tok.eos_id for ids in task.train_ids[0])
    pre = load_pretrained(checkpoint)
    with torch.no_grad():
        logits = pre.model(batch["src"], batch["tgt_in"]).logits  # (B, T, V)
    expected = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE_INDEX).item()

    run_recipe(recipe, [])
    assert _first_loss(tmp_path / "mt") == pytest.approx(expected, rel=1e-4)
    assert _final_val(tmp_path / "mt") < before_val - 0.05
    _assert_kept_tokenizer(tmp_path / "mt", checkpoint, "src")
    _assert_kept_tokenizer(tmp_path / "mt", checkpoint, "tgt")

    frozen = _translation_recipe(tmp_path, checkpoint, name="mt-frozen", steps=2, train='freeze = ["encoder.*"]\n')
    run_recipe(frozen, [])
    moved = _moved(tmp_path / "mt-frozen", checkpoint)
    assert not any(v for k, v in moved.items() if k.startswith("encoder.layers."))
    assert any(v for k, v in moved.items() if k.startswith("decoder.layers."))


# ---------------------------------------------------------------------------------------------- classification
def test_classification_from_converted_bert(tmp_path: Path, converted: dict[str, Path]) -> None:
    checkpoint = converted["bert"]
    recipe = _classification_recipe(tmp_path, checkpoint, lr=1e-3)
    task = ClassificationTask(load_recipe(recipe))
    assert task.init_report == ([], [])  # every tensor, the classifier head included, from the checkpoint
    before_val = task.evaluate()["loss"]
    batch = next(task.batches(None))[0]
    tok = task.tok
    assert (batch["ids"][:, 0] == tok.bos_id).all() and tok.bos_id == 3  # BERT's [CLS], not aiayn's 1
    pre = load_pretrained(checkpoint)
    with torch.no_grad():
        logits = pre.model(batch["ids"], batch["is_token"], task="classify").logits  # (B, C)
    expected = F.cross_entropy(logits, batch["labels"]).item()

    run_recipe(recipe, [])
    assert _first_loss(tmp_path / "cls") == pytest.approx(expected, rel=1e-4)
    assert _final_val(tmp_path / "cls") < before_val
    _assert_kept_tokenizer(tmp_path / "cls", checkpoint, "text")

    frozen = _classification_recipe(tmp_path, checkpoint, name="cls-frozen", steps=2,
                                    train='freeze = ["embed.*", "encoder.*"]\n')
    run_recipe(frozen, [])
    moved = _moved(tmp_path / "cls-frozen", checkpoint)
    assert not any(v for k, v in moved.items() if k.startswith(("encoder.", "embed.")))
    assert moved["cls_head.out.weight"]


def test_classifier_with_other_labels_gets_a_fresh_output_layer(tmp_path: Path, converted: dict[str, Path]) -> None:
    recipe = load_recipe(_classification_recipe(tmp_path, converted["bert"]))
    rows = ["label\tsentence"] + [f"{i % 3}\t{s}" for i, s in enumerate(_sentences(60, 6))]
    (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (tmp_path / "valid.tsv").write_text("\n".join(rows[:21]) + "\n", encoding="utf-8")
    task = ClassificationTask(recipe)
    assert task.model_config.n_classes == 3
    assert sorted(task.init_report[0]) == ["cls_head.out.bias", "cls_head.out.weight"]
    saved = read_state_dict(converted["bert"])
    torch.testing.assert_close(task.model.state_dict()["cls_head.dense.weight"], saved["cls_head.dense.weight"])


# ---------------------------------------------------------------------------------------------- errors
def test_bad_init_from_is_one_clear_error(tmp_path: Path, converted: dict[str, Path],
                                          capsys: pytest.CaptureFixture) -> None:
    missing = _lm_recipe(tmp_path, tmp_path / "nowhere", name="missing")
    assert main(["train", str(missing)]) == 2
    err = capsys.readouterr().err
    assert "init_from" in err and str(tmp_path / "nowhere") in err and "Traceback" not in err

    mismatch = _lm_recipe(tmp_path, converted["bart"], name="mismatch")
    with pytest.raises(AiaynError, match="a 'translation' checkpoint cannot start a 'lm' run"):
        validate_recipe(load_recipe(mismatch))

    arch = _lm_recipe(tmp_path, converted["gpt2"], name="arch", model="d_model = 64\nn_layers = 3\n")
    with pytest.raises(AiaynError, match=r"\[model\] d_model, n_layers: init_from .* would change its "
                                         "architecture"):
        validate_recipe(load_recipe(arch))
    with pytest.raises(AiaynError, match="would change its architecture"):
        LMTask(load_recipe(arch))

    text = _translation_recipe(tmp_path, converted["bart"], name="tok").read_text() + '[tokenizer]\nkind = "bpe"\n'
    (tmp_path / "tok.toml").write_text(text, encoding="utf-8")
    with pytest.raises(AiaynError, match=r"\[tokenizer\] kind: init_from .* keeps that checkpoint's tokenizer"):
        validate_recipe(load_recipe(tmp_path / "tok.toml"))


# ---------------------------------------------------------------------------------------------- a pretrained vocabulary
def _fresh(recipe: Path, vocabulary: Path, extra: str = "") -> Path:
    """``recipe`` without init_from: a fresh model on the ``[tokenizer] kind = "pretrained"`` vocabulary."""
    text = recipe.read_text(encoding="utf-8").replace('init_from = "', 'name = "fresh"\n# was: "')
    text += f'[tokenizer]\nkind = "pretrained"\npath = "{vocabulary.as_posix()}"\n{extra}'
    recipe.write_text(text, encoding="utf-8")
    return recipe


def test_a_fresh_lm_trains_on_a_pretrained_vocabulary(tmp_path: Path, converted: dict[str, Path]) -> None:
    recipe = _fresh(_lm_recipe(tmp_path, converted["gpt2"], steps=3,
                               model="d_model = 32\nn_heads = 4\nn_layers = 1\nd_ff = 48\n"), converted["gpt2-hf"])
    task = LMTask(load_recipe(recipe))
    tok = task.codec.tokenizer
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(converted["gpt2-hf"]))
    assert tok.kind == "pretrained" and task.model_config.vocab_size == len(hf_tok)
    assert task.model_config.pad_id == tok.pad_id == hf_tok.eos_token_id  # GPT-2 pads with its EOS
    assert task.codec.newline_symbol is None  # line breaks are the vocabulary's own tokens
    assert task.model_config.d_model == 32  # the model is the recipe's, not the folder's
    run_recipe(recipe, [])
    saved = load_pretrained(tmp_path / "lm" / "last").tokenizers["text"]
    for text in ("the red dog runs", "two\nlines  and spaces", "\u00e9t\u00e9 \u2603"):
        assert saved.encode(text) == hf_tok.encode(text), text

    # an aiayn checkpoint's folder (what aiayn convert --from-hf writes) gives its tokenizer the same way
    recipe2 = _fresh(_lm_recipe(tmp_path, converted["gpt2"], name="lm2", steps=1), converted["gpt2"])
    assert LMTask(load_recipe(recipe2)).codec.tokenizer.encode("the red dog") == hf_tok.encode("the red dog")


def test_a_fresh_translation_model_on_a_pretrained_vocabulary(tmp_path: Path, converted: dict[str, Path]) -> None:
    model = "[model]\nd_model = 32\nn_heads = 4\nn_layers = 1\nd_ff = 48\n"
    recipe = _fresh(_translation_recipe(tmp_path, converted["bart"], steps=2), converted["bart-hf"])
    recipe.write_text(recipe.read_text(encoding="utf-8").replace("[model]\n", model), encoding="utf-8")
    task = TranslationTask(load_recipe(recipe))
    tok = task.tgt_tok
    assert task.src_tok is tok and tok.kind == "pretrained" and (tok.pad_id, tok.decoder_start_id) == (1, 2)
    assert task.model_config.vocab_size == tok.vocab_size and task.model_config.pad_id == 1
    assert all(ids[0] == tok.bos_id and ids[-1] == tok.eos_id for ids in task.train_ids[0])
    run_recipe(recipe, [])
    assert load_pretrained(tmp_path / "mt" / "last").tokenizers["tgt"].kind == "pretrained"


def test_pretrained_vocabulary_mistakes_are_named(tmp_path: Path, converted: dict[str, Path]) -> None:
    base = _lm_recipe(tmp_path, converted["gpt2"], name="v")
    text = base.read_text(encoding="utf-8").replace("init_from", "# init_from")

    def problems(tokenizer: str) -> str:
        (tmp_path / "v.toml").write_text(text + "[tokenizer]\n" + tokenizer, encoding="utf-8")
        with pytest.raises(AiaynError) as e:
            validate_recipe(load_recipe(tmp_path / "v.toml"))
        return str(e.value)

    assert 'give path = "DIR"' in problems('kind = "pretrained"\n')
    assert "needs kind = \"pretrained\"" in problems(f'path = "{converted["gpt2-hf"].as_posix()}"\n')
    assert "vocab_size: a pretrained vocabulary is read, not trained" in problems(
        f'kind = "pretrained"\npath = "{converted["gpt2-hf"].as_posix()}"\nvocab_size = 100\n')
    (tmp_path / "v.toml").write_text(text + f'[tokenizer]\nkind = "pretrained"\npath = "{tmp_path / "no"}"\n',
                                     encoding="utf-8")
    with pytest.raises(AiaynError, match="no such tokenizer folder"):
        LMTask(load_recipe(tmp_path / "v.toml"))
    from aiayn.tasks.vocabulary import pretrained_vocabulary

    with pytest.raises(AiaynError, match="no mask token, which masked-LM training needs"):
        pretrained_vocabulary({}, {"kind": "pretrained", "path": str(converted["gpt2-hf"])}, "mlm")
