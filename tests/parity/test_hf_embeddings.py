"""Sentence embeddings from converted models, held to transformers and sentence-transformers.

Each model is tiny and random, built from its transformers config class and saved with ``save_pretrained`` beside a
tiny tokenizer (never downloaded). A sentence-transformers folder is that plus hand-written ``modules.json``,
``1_Pooling/config.json`` (mean, cls or max) and, for some, a ``Normalize`` module. ``from_hf`` converts it; the
converted checkpoint's vectors (``aiayn.embed`` and ``aiayn embed``) must equal transformers' hidden states pooled by
sentence-transformers' formulas at 1e-5, padding never counted; and, where the ``sentence_transformers`` package is
installed, ``SentenceTransformer(folder).encode`` itself. ``to_hf`` writes the folder back: transformers loads it with
the same hidden states, sentence-transformers with the same vectors, and converting it again gives the same vectors.
Bare decoder backbones (``LlamaModel``, ``MistralModel``, ``Qwen2Model``) embed by their last token.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402
from tokenizers import Tokenizer as HFTokenizer  # noqa: E402
from tokenizers import models, normalizers, pre_tokenizers, trainers  # noqa: E402

import aiayn  # noqa: E402
from aiayn.cli.main import main  # noqa: E402
from aiayn.errors import AiaynError  # noqa: E402
from aiayn.hf import from_hf, to_hf  # noqa: E402
from aiayn.pretrained import load_pretrained  # noqa: E402

ATOL = 1e-5
D, H, FF, MAX = 32, 4, 48, 64
TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "Two young, white males are outside near many bushes.",
    "Several men in hard hats are operating a giant pulley system.",
    "A little girl climbing into a wooden playhouse.",
    "hi",
    "",
    "Zwei Männer stehen am Herd und bereiten Essen zu.",
    "it's, can't, won't, they're, I'm, we've!",
]
#: (pooling in sentence-transformers' config, normalised) for each sentence-transformers folder
VARIANTS = [(p, n) for p in ("mean", "cls", "max") for n in (False, True)]
ST_FLAGS = {"mean": "pooling_mode_mean_tokens", "cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens"}
HAS_ST = importlib.util.find_spec("sentence_transformers") is not None
NO_ST = "the sentence_transformers package is not installed (pip install --no-deps sentence-transformers)"


# ---------------------------------------------------------------------------------------------- folders
def _bert_tokenizer(folder: Path) -> None:
    """WordPiece, lower-cased, [PAD]=0; texts framed as [CLS] ... [SEP]."""
    tok = HFTokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(TEXT * 3, trainers.WordPieceTrainer(
        vocab_size=200, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False))
    transformers.BertTokenizerFast(vocab=tok.get_vocab()).save_pretrained(folder)


def _write_st_files(folder: Path, pooling: str, normalize: bool, max_seq_length: int | None = None,
                    extra_modules: list[dict[str, Any]] | None = None, pooling_config: dict | None = None) -> None:
    """The files sentence-transformers saves beside a transformers folder (in its legacy pooling format)."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    modules += extra_modules or []
    (folder / "modules.json").write_text(json.dumps(modules, indent=2))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    cfg = pooling_config or {"word_embedding_dimension": D, **{flag: p == pooling for p, flag in ST_FLAGS.items()},
                             "pooling_mode_mean_sqrt_len_tokens": False}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(cfg, indent=2))
    if max_seq_length is not None:
        (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length,
                                                                      "do_lower_case": False}))


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Any]:
    """A tiny random ``BertModel`` and its tokenizer saved into a folder (no sentence-transformers files)."""
    folder = tmp_path_factory.mktemp("bert") / "bare"
    _bert_tokenizer(folder)
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    cfg = transformers.BertConfig(vocab_size=len(tok), hidden_size=D, num_hidden_layers=2, num_attention_heads=H,
                                  intermediate_size=FF, max_position_embeddings=MAX, type_vocab_size=2,
                                  pad_token_id=tok.pad_token_id)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.BertModel(cfg).eval()
    with torch.no_grad():  # weights large enough that poolings and positions differ clearly
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    model.save_pretrained(folder)
    return folder, model, tok


def _variant(bert: tuple[Path, Any, Any], where: Path, **st: Any) -> Path:
    """A copy of the BERT folder with sentence-transformers files (none when ``st`` is empty)."""
    folder = where / "folder"
    shutil.copytree(bert[0], folder)
    if st:
        _write_st_files(folder, **st)
    return folder


@pytest.fixture(scope="module")
def converted(bert: tuple[Path, Any, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], Path]:
    """An aiayn checkpoint of each sentence-transformers variant of the BERT folder."""
    out = {}
    for pooling, normalize in VARIANTS:
        where = tmp_path_factory.mktemp(f"st-{pooling}-{normalize}")
        out[(pooling, normalize)] = from_hf(_variant(bert, where, pooling=pooling, normalize=normalize), where / "ck")
    return out


# ---------------------------------------------------------------------------------------------- the reference
def st_pool(h: Tensor, mask: Tensor, pooling: str, normalize: bool) -> Tensor:
    """sentence-transformers' ``Pooling`` (and ``Normalize``) on hidden states ``h`` (B, T, D), ``mask`` (B, T)."""
    m = mask.unsqueeze(-1).to(h.dtype)
    if pooling == "mean":
        out = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
    elif pooling == "max":
        out = h.masked_fill(m == 0, float("-inf")).max(1).values
    elif pooling == "cls":
        out = h[:, 0]
    else:  # lasttoken
        last = mask.sum(1) - 1
        out = h[torch.arange(h.shape[0]), last]
    return F.normalize(out, p=2, dim=1) if normalize else out


@torch.no_grad()
def reference(model: Any, tok: Any, texts: list[str], pooling: str, normalize: bool, **tok_args: Any) -> Tensor:
    """transformers' hidden states of a padded batch with its attention mask, pooled as sentence-transformers does."""
    enc = tok(texts, padding=True, return_tensors="pt", **tok_args)
    h = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).last_hidden_state
    return st_pool(h, enc["attention_mask"], pooling, normalize)


# ---------------------------------------------------------------------------------------------- parity
@pytest.mark.parametrize(("pooling", "normalize"), VARIANTS)
def test_embeddings_equal_transformers_pooled_as_sentence_transformers(pooling: str, normalize: bool, bert,
                                                                       converted) -> None:
    ckpt = converted[(pooling, normalize)]
    meta = json.loads((ckpt / "config.json").read_text())
    assert meta["task"] == "embedding"
    assert meta["embedding"] == {"pooling": pooling, "normalize": normalize, "lowercase": False,
                                 "from": "sentence-transformers"}
    got = aiayn.embed(ckpt, TEXT, batch_size=3)
    want = reference(bert[1], bert[2], TEXT, pooling, normalize)
    assert got.shape == (len(TEXT), D) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    if normalize:
        torch.testing.assert_close(got.norm(dim=1), torch.ones(len(TEXT)), atol=1e-6, rtol=0)


@pytest.mark.skipif(not HAS_ST, reason=NO_ST)
@pytest.mark.parametrize(("pooling", "normalize"), VARIANTS)
def test_embeddings_equal_sentence_transformers(pooling: str, normalize: bool, converted,
                                                tmp_path_factory: pytest.TempPathFactory) -> None:
    """``SentenceTransformer(folder).encode`` on the source folder and on the folder ``to_hf`` writes back."""
    from sentence_transformers import SentenceTransformer

    ckpt = converted[(pooling, normalize)]
    got = aiayn.embed(ckpt, TEXT)
    back = to_hf(ckpt, tmp_path_factory.mktemp("back") / "hf")
    source = json.loads((ckpt / "config.json").read_text())["converted_from"]["source"]
    for folder in (source, back):
        st = SentenceTransformer(str(folder), device="cpu")
        want = st.encode(TEXT, batch_size=3, convert_to_tensor=True)
        torch.testing.assert_close(got, want.float(), atol=ATOL, rtol=0)


def test_a_bare_bertmodel_pools_by_the_mean_unnormalised_with_or_without_the_bert_prefix(bert, tmp_path) -> None:
    """No sentence-transformers files: mean pooling, not normalised; keys saved with ``bert.`` read alike."""
    plain = from_hf(_variant(bert, tmp_path / "a"), tmp_path / "plain")
    meta = json.loads((plain / "config.json").read_text())
    assert meta["embedding"] == {"pooling": "mean", "normalize": False, "lowercase": False, "from": "default"}
    assert meta["max_len"] == MAX
    want = reference(bert[1], bert[2], TEXT, "mean", False)
    torch.testing.assert_close(aiayn.embed(plain, TEXT), want, atol=ATOL, rtol=0)

    prefixed = _variant(bert, tmp_path / "b", pooling="cls", normalize=True)
    state = load_file(str(prefixed / "model.safetensors"))
    save_file({f"bert.{k}": v for k, v in state.items()}, str(prefixed / "model.safetensors"),
              metadata={"format": "pt"})
    ckpt = from_hf(prefixed, tmp_path / "prefixed")
    torch.testing.assert_close(aiayn.embed(ckpt, TEXT), reference(bert[1], bert[2], TEXT, "cls", True), atol=ATOL,
                               rtol=0)


@pytest.mark.parametrize("pooling", ("mean", "cls", "max", "last"))
def test_padding_does_not_change_an_embedding(pooling: str, converted) -> None:
    """Each text alone (no padding) equals the same text in a padded batch of longer and shorter ones."""
    pre = load_pretrained(converted[("mean", False)])
    batched = aiayn.embed(pre, TEXT, batch_size=len(TEXT), pooling=pooling)
    single = torch.cat([aiayn.embed(pre, [t], pooling=pooling) for t in TEXT])
    torch.testing.assert_close(batched, single, atol=1e-6, rtol=0)


def test_accelerated_equals_reference(converted) -> None:
    for key in (("mean", True), ("max", False)):
        ref = aiayn.embed(load_pretrained(converted[key], accel="none"), TEXT)
        fast = aiayn.embed(load_pretrained(converted[key], accel="auto"), TEXT)
        torch.testing.assert_close(fast, ref, atol=ATOL, rtol=0)


def test_max_seq_length_cuts_as_transformers_truncates(bert, tmp_path) -> None:
    """``sentence_bert_config.json``'s ``max_seq_length`` is the checkpoint's limit; a longer text keeps [CLS] and
    [SEP] and loses its last words, as transformers' truncation does, and is named in a warning."""
    ckpt = from_hf(_variant(bert, tmp_path, pooling="mean", normalize=True, max_seq_length=8), tmp_path / "ck")
    assert json.loads((ckpt / "config.json").read_text())["max_len"] == 8
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = aiayn.embed(ckpt, TEXT)
    over = [i for i, t in enumerate(TEXT) if len(bert[2](t)["input_ids"]) > 8]
    assert over and [str(w.message).split(":")[0] for w in caught] == [f"texts[{i}]" for i in over]
    assert "more than the model's limit of 8 tokens" in str(caught[0].message)
    assert "on_long='truncate'" in str(caught[0].message) and "--on-long" not in str(caught[0].message)
    want = reference(bert[1], bert[2], TEXT, "mean", True, truncation=True, max_length=8)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    with pytest.raises(AiaynError, match=r"texts\[0\]: .* more than the model's limit of 8"):
        aiayn.embed(ckpt, TEXT, on_long="error")


def test_an_mlm_checkpoint_embeds_by_the_mean_of_its_encoder(bert, tmp_path) -> None:
    folder = tmp_path / "mlm"
    shutil.copytree(bert[0], folder, ignore=shutil.ignore_patterns("model.safetensors", "config.json"))
    torch.manual_seed(1)
    mlm = transformers.BertForMaskedLM(bert[1].config).eval()
    mlm.save_pretrained(folder)
    ckpt = from_hf(folder, tmp_path / "ck")
    assert json.loads((ckpt / "config.json").read_text())["task"] == "mlm"
    torch.testing.assert_close(aiayn.embed(ckpt, TEXT), reference(mlm.bert, bert[2], TEXT, "mean", False),
                               atol=ATOL, rtol=0)


# ---------------------------------------------------------------------------------------------- round trip
def test_round_trip_writes_a_sentence_transformers_bertmodel_folder(bert, converted, tmp_path) -> None:
    ckpt = converted[("max", True)]
    back = to_hf(ckpt, tmp_path / "hf")
    files = sorted(p.relative_to(back).as_posix() for p in back.rglob("*") if p.is_file())
    assert {"modules.json", "1_Pooling/config.json", "sentence_bert_config.json", "config.json",
            "model.safetensors", "tokenizer.json"} <= set(files)
    modules = json.loads((back / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "Pooling", "Normalize"]
    pooling = json.loads((back / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_max_tokens"] and not pooling["pooling_mode_mean_tokens"]
    assert json.loads((back / "config.json").read_text())["architectures"] == ["BertModel"]
    assert not any(k.startswith(("bert.", "pooler.")) for k in load_file(str(back / "model.safetensors")))

    reloaded = transformers.BertModel.from_pretrained(str(back), attn_implementation="eager").eval()
    theirs, mine = bert[1].state_dict(), reloaded.state_dict()
    assert all(torch.equal(theirs[k], mine[k]) for k in theirs if not k.startswith("pooler."))  # aiayn keeps no pooler
    enc = bert[2](TEXT, padding=True, return_tensors="pt")
    with torch.no_grad():
        want = bert[1](**enc).last_hidden_state
        have = reloaded(**enc).last_hidden_state
    torch.testing.assert_close(have, want, atol=0, rtol=0)
    again = from_hf(back, tmp_path / "again")
    assert torch.equal(aiayn.embed(again, TEXT), aiayn.embed(ckpt, TEXT))
    assert json.loads((again / "config.json").read_text())["embedding"]["pooling"] == "max"

    plain = to_hf(converted[("cls", False)], tmp_path / "plain")
    assert len(json.loads((plain / "modules.json").read_text())) == 2  # no Normalize module


# ---------------------------------------------------------------------------------------------- the command
def test_embed_command_writes_npy_and_jsonl(converted, tmp_path, capsys: pytest.CaptureFixture) -> None:
    ckpt = converted[("mean", True)]
    lines = [*TEXT, "word " * 80]  # the last line is longer than the model's 64 positions
    src = tmp_path / "in.txt"
    src.write_text("".join(f"{x}\n" for x in lines), encoding="utf-8")
    want = aiayn.embed(ckpt, lines, on_long="truncate")

    assert main(["embed", "--checkpoint", str(ckpt), "-i", str(src), "-o", str(tmp_path / "v.npy"),
                 "--batch-size", "4"]) == 0
    err = capsys.readouterr().err
    assert f"{src}:{len(lines)}: " in err and "more than the model's limit of 64 tokens" in err
    assert f"{src}:1:" not in err
    vectors = np.load(tmp_path / "v.npy")
    assert vectors.shape == (len(lines), D) and vectors.dtype == np.float32
    np.testing.assert_allclose(vectors, want.numpy(), atol=ATOL, rtol=0)
    np.testing.assert_allclose(vectors[5], aiayn.embed(ckpt, [""])[0].numpy(), atol=ATOL, rtol=0)  # the blank line

    assert main(["embed", "--checkpoint", str(ckpt), "-i", str(src), "-o", str(tmp_path / "v.jsonl"),
                 "--batch-size", "4", "--on-long", "truncate"]) == 0
    assert "warning" not in capsys.readouterr().err
    rows = [json.loads(x) for x in (tmp_path / "v.jsonl").read_text().splitlines()]
    assert len(rows) == len(lines) and all(len(r) == D for r in rows)
    np.testing.assert_array_equal(np.array(rows, dtype=np.float32), vectors)

    assert main(["embed", "--checkpoint", str(ckpt), "-i", str(src), "--pooling", "cls", "--no-normalize"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]  # JSON lines on stdout
    np.testing.assert_allclose(np.array(rows), aiayn.embed(ckpt, lines, pooling="cls", normalize=False,
                                                           on_long="truncate").numpy(), atol=ATOL, rtol=0)


def test_bad_inputs_are_one_clear_error(bert, converted, tmp_path, capsys: pytest.CaptureFixture) -> None:
    ckpt = converted[("mean", False)]
    src = tmp_path / "in.txt"
    src.write_text("hello\n" + "word " * 80 + "\n", encoding="utf-8")
    for args, message in (
            (["-o", str(tmp_path / "v.txt")], "ending in .npy (a numpy array) or .jsonl"),
            (["--on-long", "error"], f"{src}:2: "),
            (["-o", str(tmp_path)], "is a folder")):
        assert main(["embed", "--checkpoint", str(ckpt), "-i", str(src), *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith("aiayn embed: error: ") and message in err and "Traceback" not in err
        assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "v.txt").exists()

    bare = from_hf(_variant(bert, tmp_path / "no-tok"), tmp_path / "no-tok-ck", tokenizer=False)
    with pytest.raises(AiaynError, match="no tokenizer"):
        aiayn.embed(bare, TEXT)
    with pytest.raises(AiaynError, match=r"texts\[1\] is a int"):
        aiayn.embed(ckpt, ["fine", 3])  # type: ignore[list-item]
    pre = load_pretrained(ckpt)
    pre.meta = {**pre.meta, "task": "translation"}
    with pytest.raises(AiaynError, match="a 'translation' checkpoint; embed reads encoders and decoder-only models"):
        aiayn.embed(pre, TEXT)
    with pytest.raises(AiaynError, match="pooling 'sum': choose one of mean, cls, max, last"):
        aiayn.embed(ckpt, TEXT, pooling="sum")

    refused = {
        "Dense": dict(extra_modules=[{"idx": 3, "name": "3", "path": "3_Dense",
                                      "type": "sentence_transformers.models.Dense"}]),
        "2 poolings at once": dict(pooling_config={"word_embedding_dimension": D, "pooling_mode_mean_tokens": True,
                                                   "pooling_mode_max_tokens": True}),
        "mean_sqrt_len_tokens pooling": dict(pooling_config={"word_embedding_dimension": D,
                                                             "pooling_mode_mean_sqrt_len_tokens": True}),
        "word_embedding_dimension 384": dict(pooling_config={"word_embedding_dimension": 384,
                                                             "pooling_mode_mean_tokens": True}),
    }
    for i, (message, st) in enumerate(refused.items()):
        folder = _variant(bert, tmp_path / f"bad{i}", pooling="mean", normalize=False, **st)
        with pytest.raises(AiaynError, match=message) as info:
            from_hf(folder, tmp_path / f"bad{i}-ck")
        assert str(folder) in str(info.value)
        assert not (tmp_path / f"bad{i}-ck").exists()
    folder = _variant(bert, tmp_path / "corrupt", pooling="mean", normalize=False)
    (folder / "modules.json").write_text("[{")
    with pytest.raises(AiaynError, match=r"modules\.json: cannot read it as JSON"):
        from_hf(folder, tmp_path / "corrupt-ck")


# ---------------------------------------------------------------------------------------------- decoder backbones
def _byte_level(folder: Path) -> None:
    """Byte-level BPE with <|endoftext|> (Qwen2's and GPT-2's kind): no framing tokens."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(TEXT * 3, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    merges = json.loads(tok.to_str())["model"]["merges"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in merges]
    transformers.GPT2TokenizerFast(vocab=tok.get_vocab(with_added_tokens=False), merges=merges).save_pretrained(folder)


def _llama_tokenizer(folder: Path) -> None:
    """SentencePiece-style BPE with byte fallback, <unk>=0 <s>=1 </s>=2; texts framed as <s> ...."""
    tok = HFTokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    tok.train_from_iterator(TEXT * 3, trainers.BpeTrainer(
        vocab_size=380, special_tokens=["<unk>", "<s>", "</s>", *[f"<0x{i:02X}>" for i in range(256)]],
        show_progress=False))
    merges = json.loads(tok.to_str())["model"]["merges"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in merges]
    transformers.LlamaTokenizerFast(vocab=tok.get_vocab(), merges=merges, add_bos_token=True,
                                    add_eos_token=False).save_pretrained(folder)


BACKBONES = {"llama": "LlamaModel", "mistral": "MistralModel", "qwen2": "Qwen2Model", "gpt2": "GPT2Model"}


def _backbone(family: str, folder: Path) -> tuple[Any, Any]:
    if family in ("qwen2", "gpt2"):
        _byte_level(folder)
    else:
        _llama_tokenizer(folder)
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    ids = dict(vocab_size=len(tok), bos_token_id=tok.bos_token_id or tok.eos_token_id, eos_token_id=tok.eos_token_id)
    if family == "gpt2":
        cfg = transformers.GPT2Config(n_positions=MAX, n_embd=D, n_layer=2, n_head=H, n_inner=FF, **ids)
    else:
        common = dict(hidden_size=D, intermediate_size=FF, num_hidden_layers=2, num_attention_heads=H,
                      num_key_value_heads=2, max_position_embeddings=MAX, tie_word_embeddings=False, **ids)
        extra = {"mistral": dict(sliding_window=6)}.get(family, {})
        cfg = getattr(transformers, f"{BACKBONES[family].removesuffix('Model')}Config")(**common, **extra)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = getattr(transformers, BACKBONES[family])(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    model.save_pretrained(folder)
    return model, tok


@pytest.mark.parametrize("family", tuple(BACKBONES))
def test_decoder_backbones_embed_by_their_last_token(family: str, tmp_path: Path) -> None:
    model, tok = _backbone(family, tmp_path / "hf")
    texts = [t for t in TEXT if t]  # a byte-level vocabulary frames no text: "" would have no tokens
    tok.pad_token = tok.eos_token  # as decoder embedding models name one: sentence-transformers pads every batch
    tok.save_pretrained(tmp_path / "hf")
    tok.padding_side = "right"
    ckpt = from_hf(tmp_path / "hf", tmp_path / "ck")
    meta = json.loads((ckpt / "config.json").read_text())
    assert meta["task"] == ("lm" if family == "gpt2" else "embedding")  # GPT-2 ties its output layer: an lm
    want = reference(model, tok, texts, "last", False)
    torch.testing.assert_close(aiayn.embed(ckpt, texts, batch_size=3), want, atol=ATOL, rtol=0)
    if family == "gpt2":
        return
    assert meta["embedding"]["pooling"] == "last"
    back = to_hf(ckpt, tmp_path / "back")
    assert json.loads((back / "config.json").read_text())["architectures"] == [BACKBONES[family]]
    assert json.loads((back / "1_Pooling" / "config.json").read_text())["pooling_mode_lasttoken"]
    reloaded, info = getattr(transformers, BACKBONES[family]).from_pretrained(str(back), output_loading_info=True,
                                                                              attn_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"]
    torch.testing.assert_close(reference(reloaded.eval(), tok, texts, "last", False), want, atol=0, rtol=0)
    if HAS_ST:
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(str(back), device="cpu")
        torch.testing.assert_close(st.encode(texts, batch_size=3, convert_to_tensor=True).float(), want, atol=ATOL,
                                   rtol=0)
    if family == "qwen2":  # no framing: a blank text has no tokens, and its vector is zeros
        with pytest.warns(UserWarning, match=r"texts\[0\]: no tokens at all"):
            assert torch.equal(aiayn.embed(ckpt, [""]), torch.zeros(1, D))

