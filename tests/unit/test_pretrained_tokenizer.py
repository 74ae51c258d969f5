"""Pretrained vocabularies: tiny GPT-2, BERT, T5, BART, LLaMA and Marian-style tokenizer folders, built offline
and saved with transformers, read back by aiayn and held equal to transformers' AutoTokenizer; their special ids
and decoder start; save/load round trips; broken folders; the tasks and decoding reading ids from the tokenizer."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="building reference tokenizer folders needs transformers")

from tokenizers import Tokenizer as HFTokenizer  # noqa: E402
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

from aiayn.errors import AiaynError  # noqa: E402
from aiayn.tokenize import PretrainedTokenizer, load_tokenizer  # noqa: E402

TRAIN_TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "Two young, white males are outside near many bushes.",
    "Several men in hard hats are operating a giant pulley system.",
    "A little girl climbing into a wooden playhouse.",
    "Ein kleines Mädchen klettert in ein Spielhaus aus Holz.",
    "Zwei Männer stehen am Herd und bereiten Essen zu.",
    "Café déjà vu, naïve façade: l'été à Paris.",
    "it's, can't, won't, they're, I'm, we've!",
    "日本語のテキスト。中文字符。",
    "emoji 😀 party 🎉",
    "numbers 12345 and 3.14159",
] * 3

# What every family must encode and decode exactly as transformers does. ``{specials}`` becomes the family's
# own special-token texts, to check that they are matched inside ordinary text.
CORPUS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Café déjà vu, naïve façade — ÀÉÎÕÜ ñ",
    "日本語のテキストと中文字符、한국어",
    "emoji 😀🎉 👍🏽 and 🇩🇪 flags",
    "multiple   spaces    here",
    "  leading and trailing spaces  ",
    "line one\nline two\n\nline four\n",
    "tab\tseparated\tvalues\t",
    "",
    " ",
    "it's can't won't they're I'm .",
    "punctuation!?,.;:()[]{} \"quoted\" 'single'",
    "numbers 12345 3.14159 ½ ﬁ Ω∑",
    "special tokens inside: {specials} and at the end{last}",
    "{specials}",
]

FAMILIES = ("gpt2", "bert", "t5", "bart", "llama", "marian")


# ---------------------------------------------------------------------------------------------- tiny folders
def _merges(tok: HFTokenizer) -> list[tuple[str, str]]:
    merges = json.loads(tok.to_str())["model"]["merges"]
    return [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in merges]  # type: ignore[misc]


def _byte_bpe(specials: list[str], size: int = 420) -> tuple[dict[str, int], list[tuple[str, str]]]:
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TRAIN_TEXT, trainers.BpeTrainer(
        vocab_size=size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    return tok.get_vocab(with_added_tokens=False), _merges(tok)


def _gpt2(folder: Path) -> None:
    vocab, merges = _byte_bpe(["<|endoftext|>"])
    transformers.GPT2TokenizerFast(vocab=vocab, merges=merges).save_pretrained(folder)


def _bart(folder: Path) -> None:
    vocab, merges = _byte_bpe(["<s>", "<pad>", "</s>", "<unk>"])
    vocab["<mask>"] = len(vocab)  # BART's <mask> is its last id
    transformers.BartTokenizerFast(vocab=vocab, merges=merges).save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(
        {"model_type": "bart", "bos_token_id": 0, "pad_token_id": 1, "eos_token_id": 2,
         "decoder_start_token_id": 2}), encoding="utf-8")


def _bert(folder: Path) -> None:
    tok = HFTokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    # Special tokens away from 0-4 roles: [CLS] (the BOS role) is 4 and [SEP] (EOS) is 5 here.
    tok.train_from_iterator(TRAIN_TEXT, trainers.WordPieceTrainer(
        vocab_size=300, special_tokens=["[PAD]", "[unused0]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
        show_progress=False))
    transformers.BertTokenizerFast(vocab=tok.get_vocab(), clean_up_tokenization_spaces=True).save_pretrained(folder)


def _unigram(specials: list[str], size: int = 260) -> list[tuple[str, float]]:
    tok = HFTokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.train_from_iterator(TRAIN_TEXT, trainers.UnigramTrainer(
        vocab_size=size, special_tokens=specials, unk_token="<unk>", show_progress=False))
    return [(piece, score) for piece, score in json.loads(tok.to_str())["model"]["vocab"]]


def _t5(folder: Path) -> None:
    vocab = _unigram(["<pad>", "</s>", "<unk>"])
    transformers.T5TokenizerFast(vocab=vocab, extra_ids=3).save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(
        {"model_type": "t5", "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0}), encoding="utf-8")


def _llama(folder: Path) -> None:
    tok = HFTokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
    tok.train_from_iterator(TRAIN_TEXT, trainers.BpeTrainer(
        vocab_size=520, special_tokens=["<unk>", "<s>", "</s>", *byte_tokens], show_progress=False))
    transformers.LlamaTokenizerFast(vocab=tok.get_vocab(), merges=_merges(tok), add_bos_token=True,
                                    add_eos_token=False).save_pretrained(folder)


def _marian(folder: Path) -> None:
    """Marian's layout: </s>=0, <unk>=1, the pieces, <pad> last; every sentence ends with </s>; the decoder starts
    from <pad>. (Real Marian folders ship SentencePiece files; this one holds the same vocabulary as tokenizer.json.)"""
    vocab = _unigram(["</s>", "<unk>"])
    vocab.append(("<pad>", 0.0))
    tok = HFTokenizer(models.Unigram(vocab, unk_id=1))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A $B </s>",
                                                       special_tokens=[("</s>", 0)])
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>",
                                         pad_token="<pad>").save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(
        {"model_type": "marian", "pad_token_id": len(vocab) - 1, "eos_token_id": 0,
         "decoder_start_token_id": len(vocab) - 1}), encoding="utf-8")


BUILDERS: dict[str, Callable[[Path], None]] = {
    "gpt2": _gpt2, "bert": _bert, "t5": _t5, "bart": _bart, "llama": _llama, "marian": _marian}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name, build in BUILDERS.items():
        out[name] = tmp_path_factory.mktemp(name)
        build(out[name])
    return out


@pytest.fixture(scope="module")
def refs(folders: dict[str, Path]) -> dict[str, object]:
    """transformers' own tokenizers, read back from the folders."""
    return {name: transformers.AutoTokenizer.from_pretrained(str(path)) for name, path in folders.items()}


@pytest.fixture(scope="module")
def toks(folders: dict[str, Path]) -> dict[str, PretrainedTokenizer]:
    return {name: PretrainedTokenizer.from_folder(path) for name, path in folders.items()}


def _corpus(ref) -> list[str]:
    specials = [str(t) for t in ref.all_special_tokens]
    return [t.replace("{specials}", " x ".join(specials)).replace("{last}", specials[-1]) for t in CORPUS]


# ---------------------------------------------------------------------------------------------- parity
@pytest.mark.parametrize("family", FAMILIES)
def test_encode_decode_equal_transformers(family: str, toks, refs) -> None:
    tok, ref = toks[family], refs[family]
    assert tok.vocab_size == len(ref)
    for text in _corpus(ref):
        raw = ref.encode(text, add_special_tokens=False)
        framed = ref.encode(text)
        assert tok.encode(text) == raw, text
        assert tok.encode_with_special(text) == framed, text
        assert tok.encode_batch([text, text]) == [raw, raw]
        for ids in (raw, framed):
            assert tok.decode(ids) == ref.decode(ids, skip_special_tokens=True), (text, ids)
            assert tok.decode(ids, skip_special=False) == ref.decode(ids, skip_special_tokens=False), (text, ids)
        assert tok.normalize(text) == ref.decode(raw, skip_special_tokens=True)


@pytest.mark.parametrize("family", FAMILIES)
def test_special_ids_are_the_models_own(family: str, toks, refs) -> None:
    tok, ref = toks[family], refs[family]
    assert tok.special_ids == frozenset(ref.all_special_ids)
    assert tok.eos_id == (ref.eos_token_id if ref.eos_token_id is not None else ref.sep_token_id)
    assert tok.pad_id == (ref.pad_token_id if ref.pad_token_id is not None else tok.eos_id)
    assert tok.bos_id == (ref.bos_token_id if ref.bos_token_id is not None else ref.cls_token_id)
    assert tok.unk_id == ref.unk_token_id
    assert tok.mask_id == ref.mask_token_id
    # decoding drops exactly the model's special ids, wherever they sit in the vocabulary
    assert tok.decode(sorted(tok.special_ids)) == ""


def test_family_special_ids_and_framing(toks) -> None:
    gpt2, bert, t5, bart, llama, marian = (toks[f] for f in FAMILIES)
    eot = gpt2.token_to_id("<|endoftext|>")
    assert (gpt2.bos_id, gpt2.eos_id, gpt2.unk_id, gpt2.pad_id, gpt2.mask_id) == (eot, eot, eot, eot, None)
    assert gpt2.pads_with_eos and gpt2.decoder_start_id == eot
    assert gpt2.encode_with_special("a b") == gpt2.encode("a b")  # GPT-2 adds nothing

    assert (bert.pad_id, bert.unk_id, bert.bos_id, bert.eos_id, bert.mask_id) == (0, 3, 4, 5, 6)  # [CLS], [SEP]
    assert bert.encode_with_special("a b") == [4, *bert.encode("a b"), 5]
    assert not bert.pads_with_eos

    assert (t5.pad_id, t5.eos_id, t5.unk_id, t5.bos_id, t5.mask_id) == (0, 1, 2, None, None)
    assert t5.decoder_start_id == t5.pad_id == 0
    assert t5.encode_with_special("a b") == [*t5.encode("a b"), 1]

    assert (bart.bos_id, bart.pad_id, bart.eos_id, bart.unk_id) == (0, 1, 2, 3)
    assert bart.mask_id == bart.vocab_size - 1
    assert bart.decoder_start_id == bart.eos_id == 2  # from the folder's config.json
    assert bart.encode_with_special("a b") == [0, *bart.encode("a b"), 2]

    assert (llama.unk_id, llama.bos_id, llama.eos_id, llama.pad_id, llama.mask_id) == (0, 1, 2, 2, None)
    assert llama.pads_with_eos and llama.decoder_start_id == 1
    assert llama.encode_with_special("a b") == [1, *llama.encode("a b")]

    pad = marian.vocab_size - 1
    assert (marian.eos_id, marian.unk_id, marian.pad_id, marian.bos_id) == (0, 1, pad, None)
    assert marian.decoder_start_id == pad
    assert marian.encode_with_special("a b") == [*marian.encode("a b"), 0]


def test_llama_byte_fallback_round_trips(toks) -> None:
    llama = toks["llama"]
    text = "Ω∑ 🇩🇪 한국어"  # characters never seen in training: bytes
    ids = llama.encode(text)
    assert any(llama.id_to_token(i).startswith("<0x") for i in ids)
    assert llama.decode(ids) == text


def test_decoder_start_argument_and_fallbacks(folders, tmp_path: Path) -> None:
    assert PretrainedTokenizer.from_folder(folders["bart"], decoder_start_id=0).decoder_start_id == 0
    bare = tmp_path / "bart-no-config"
    bare.mkdir()
    for f in folders["bart"].iterdir():
        if f.name != "config.json":
            (bare / f.name).write_bytes(f.read_bytes())
    assert PretrainedTokenizer.from_folder(bare).decoder_start_id == 0  # BOS without the model's config
    assert PretrainedTokenizer.from_folder(bare, decoder_start_id=2).decoder_start_id == 2
    with pytest.raises(AiaynError, match="out of range"):
        PretrainedTokenizer.from_folder(bare, decoder_start_id=10**6)
    assert PretrainedTokenizer.from_folder(folders["t5"] / "tokenizer.json").decoder_start_id == 0  # the file's folder


def test_builtin_tokenizers_keep_their_ids() -> None:
    from aiayn.tokenize import train_tokenizer

    tok = train_tokenizer("char", ["abc"])
    assert tok.decoder_start_id == tok.bos_id == 1
    assert tok.special_ids == frozenset(range(5))


# ---------------------------------------------------------------------------------------------- saving
@pytest.mark.parametrize("family", FAMILIES)
def test_save_load_round_trip(family: str, toks, refs, tmp_path: Path) -> None:
    tok = toks[family]
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    back = load_tokenizer(path)
    assert isinstance(back, PretrainedTokenizer)
    assert back.to_dict() == tok.to_dict()
    for attr in ("vocab_size", "pad_id", "bos_id", "eos_id", "unk_id", "mask_id", "decoder_start_id",
                 "special_ids", "special_tokens", "pads_with_eos"):
        assert getattr(back, attr) == getattr(tok, attr), attr
    for text in _corpus(refs[family]):
        ids = tok.encode_with_special(text)
        assert back.encode(text) == tok.encode(text) and back.encode_with_special(text) == ids
        assert back.decode(ids) == tok.decode(ids) and back.decode(ids, False) == tok.decode(ids, False)
    again = tmp_path / "again.json"
    back.save(again)
    assert again.read_bytes() == path.read_bytes()
    assert json.loads(path.read_text(encoding="utf-8"))["kind"] == "pretrained"


def test_folder_without_tokenizer_json_is_converted(folders, refs, tmp_path: Path) -> None:
    """GPT-2's older files (vocab.json + merges.txt): transformers builds the fast tokenizer."""
    old = tmp_path / "gpt2-old"
    old.mkdir()
    data = json.loads((folders["gpt2"] / "tokenizer.json").read_text(encoding="utf-8"))
    (old / "vocab.json").write_text(json.dumps(data["model"]["vocab"]), encoding="utf-8")
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    (old / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    (old / "tokenizer_config.json").write_bytes((folders["gpt2"] / "tokenizer_config.json").read_bytes())
    tok, ref = PretrainedTokenizer.from_folder(old), refs["gpt2"]
    assert tok.eos_id == ref.eos_token_id and tok.pads_with_eos
    for text in _corpus(ref):
        assert tok.encode(text) == ref.encode(text, add_special_tokens=False), text
        assert tok.decode(ref.encode(text)) == ref.decode(ref.encode(text), skip_special_tokens=True)


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def _same_as_transformers(folder: Path) -> PretrainedTokenizer:
    tok, ref = PretrainedTokenizer.from_folder(folder), transformers.AutoTokenizer.from_pretrained(str(folder))
    assert tok.special_ids == frozenset(ref.all_special_ids)
    assert (tok.eos_id, tok.unk_id) == (ref.eos_token_id, ref.unk_token_id)
    assert tok.pad_id == (ref.pad_token_id if ref.pad_token_id is not None else ref.eos_token_id)
    for text in _corpus(ref):
        assert tok.encode(text) == ref.encode(text, add_special_tokens=False), text
        assert tok.encode_with_special(text) == ref.encode(text), text
        ids = ref.encode(text)
        assert tok.decode(ids) == ref.decode(ids, skip_special_tokens=True), text
    return tok


def test_special_tokens_map_of_older_folders(folders, tmp_path: Path) -> None:
    """Folders written before tokenizer_config.json named the special tokens keep them in special_tokens_map.json."""
    old = _copy(folders["t5"], tmp_path / "t5-old")
    config = json.loads((old / "tokenizer_config.json").read_text(encoding="utf-8"))
    named = {k: config.pop(k) for k in ("eos_token", "unk_token", "pad_token") if k in config}
    config.pop("added_tokens_decoder", None)
    (old / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    (old / "special_tokens_map.json").write_text(json.dumps(
        {k: {"content": v, "lstrip": False, "rstrip": False, "normalized": False, "single_word": False}
         for k, v in named.items()}), encoding="utf-8")
    tok = _same_as_transformers(old)
    assert (tok.pad_id, tok.eos_id, tok.unk_id) == (0, 1, 2)


def test_named_special_tokens_missing_from_tokenizer_json_are_added(folders, tmp_path: Path) -> None:
    """A tokenizer.json that lists <|endoftext|> only in its vocabulary: transformers makes it special (so the text
    "<|endoftext|>" encodes to its id and decoding drops it); so does aiayn."""
    bare = _copy(folders["gpt2"], tmp_path / "gpt2-bare")
    data = json.loads((bare / "tokenizer.json").read_text(encoding="utf-8"))
    data["added_tokens"] = []
    (bare / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    tok = _same_as_transformers(bare)
    eot = tok.eos_id
    assert tok.encode("a<|endoftext|>b")[1:-1] == [eot] and tok.special_ids == {eot}


# ---------------------------------------------------------------------------------------------- broken folders
def test_missing_folder_names_it_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(AiaynError, match=r"no-such-folder: no such tokenizer folder.*save_pretrained"):
        PretrainedTokenizer.from_folder(tmp_path / "no-such-folder")


def test_folder_without_vocabulary_files_names_tokenizer_json(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "</s>"}', encoding="utf-8")
    with pytest.raises(AiaynError, match=r"tokenizer\.json: no such file.*save_pretrained") as e:
        PretrainedTokenizer.from_folder(tmp_path)
    assert str(tmp_path) in str(e.value)


def test_corrupt_tokenizer_json_names_the_file_and_the_fix(folders, tmp_path: Path) -> None:
    bad = _copy(folders["t5"], tmp_path / "t5")
    text = (bad / "tokenizer.json").read_text(encoding="utf-8")
    (bad / "tokenizer.json").write_text(text[: len(text) // 2], encoding="utf-8")
    with pytest.raises(AiaynError, match=r"tokenizer\.json: not a valid Hugging Face tokenizer file.*again") as e:
        PretrainedTokenizer.from_folder(bad)
    assert str(bad / "tokenizer.json") in str(e.value)


def test_corrupt_config_names_the_file_and_line(folders, tmp_path: Path) -> None:
    bad = _copy(folders["bert"], tmp_path / "bert")
    (bad / "tokenizer_config.json").write_text('{\n "pad_token": "[PAD]",\n oops\n}', encoding="utf-8")
    with pytest.raises(AiaynError, match=r"tokenizer_config\.json:3: not valid JSON.*save the tokenizer again"):
        PretrainedTokenizer.from_folder(bad)


def test_vocabulary_without_eos_is_refused(tmp_path: Path) -> None:
    tok = HFTokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(tmp_path)
    with pytest.raises(AiaynError, match="neither an eos_token nor a sep_token"):
        PretrainedTokenizer.from_folder(tmp_path)


def test_corrupt_saved_tokenizer_names_the_file(toks, tmp_path: Path) -> None:
    path = tmp_path / "tok.json"
    toks["t5"].save(path)
    data = json.loads(path.read_text(encoding="utf-8"))
    data["hf_tokenizer"]["model"] = {"type": "Nonsense"}
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(AiaynError, match=r"tok\.json: the embedded Hugging Face tokenizer is corrupt"):
        load_tokenizer(path)
    data = json.loads(json.dumps(toks["t5"].to_dict()))
    data["special_tokens"]["eos"] = "<not-in-vocab>"
    with pytest.raises(AiaynError, match=r"saved\.json: .*'<not-in-vocab>' is not in the vocabulary"):
        PretrainedTokenizer.from_dict(data, source="saved.json")


# ---------------------------------------------------------------------------------------- the code that uses the ids
def test_translation_training_input_starts_with_decoder_start(toks) -> None:
    from aiayn.tasks.translation import TranslationTask

    for family, start in (("t5", 0), ("bart", 2), ("marian", toks["marian"].pad_id)):
        tok = toks[family]
        task = object.__new__(TranslationTask)  # only the collation is under test
        task.tgt_tok, task.device = tok, torch.device("cpu")
        batch = task._collate([0, 1], [[5, 6], [7]], [[8, 9, 10], [11]])
        assert batch["tgt_in"][:, 0].tolist() == [start, start], family
        assert batch["tgt_in"][0].tolist() == [start, 8, 9, 10]
        assert batch["tgt_in"][1].tolist() == [start, 11, tok.pad_id, tok.pad_id]
        assert batch["labels"][0].tolist()[-1] == tok.eos_id
        assert batch["src"][1].tolist() == [7, tok.pad_id]


def test_translation_decoding_starts_from_decoder_start(toks, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    from aiayn.config import ModelConfig
    from aiayn.models.build import build_model
    from aiayn.tasks.translation import translate_texts

    gen = importlib.import_module("aiayn.generate.translate")  # the module (the package exports a function of its name)
    starts: list[int] = []

    class Spy(gen.Seq2SeqStepper):
        def __init__(self, *args, **kwargs) -> None:
            starts.append(kwargs["bos_id"])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(gen, "Seq2SeqStepper", Spy)
    for family in ("t5", "bart"):
        tok = toks[family]
        torch.manual_seed(0)
        model = build_model(ModelConfig.preset("tiny", vocab_size=tok.vocab_size, pad_id=tok.pad_id)).eval()
        starts.clear()
        for beam in (1, 3):
            out = translate_texts(model, tok, tok, ["the dog", "a little girl"], beam=beam, max_len_b=4)
            assert len(out) == 2 and all(isinstance(x, str) for x in out)
        assert starts == [tok.decoder_start_id] * 2, family


def test_banned_output_ids_never_ban_eos() -> None:
    from aiayn.generate.translate import banned_output_ids

    assert banned_output_ids(0, 1, 2) == [0, 1]  # built-in tokenizers: unchanged
    assert banned_output_ids(0, None, 1) == [0]  # T5: no BOS
    assert banned_output_ids(7, 7, 7) == []  # pad = BOS = EOS (a GPT-2 vocabulary)
    assert banned_output_ids(1, 0, 2) == [0, 1]  # BART


def test_encoder_inputs_use_the_vocabularys_cls_and_sep(toks) -> None:
    from aiayn.tasks.classification import encode_for_classifier
    from aiayn.tasks.mlm import wrap

    bert, t5 = toks["bert"], toks["t5"]
    ids = bert.encode("a little girl")
    assert wrap(ids, bert, 64) == bert.encode_with_special("a little girl") == [4, *ids, 5]
    assert wrap(t5.encode("a b"), t5, 64) == t5.encode_with_special("a b")  # no BOS: text then </s>
    assert encode_for_classifier(bert, ["a little girl"]) == [[*ids, 5]]


def test_lm_generation_stops_at_the_vocabularys_eos(toks, monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    import aiayn.generate.lm as gen_lm
    from aiayn.tasks.lm import TextCodec, generate_text

    tok = toks["gpt2"]  # pad = EOS: EOS must still end a row
    seen: dict[str, object] = {}

    def fake_generate(model, prompts, **kw):
        seen.update(kw, prompts=prompts)
        return [[] for _ in prompts]  # every row met EOS at once

    monkeypatch.setattr(gen_lm, "generate", fake_generate)
    model = SimpleNamespace(config=SimpleNamespace(max_len=32))  # only its length limit is read here
    assert generate_text(model, TextCodec(tok), ["Hello", ""], max_new_tokens=3, greedy=True) == ["", ""]
    assert seen["stop_ids"] == (tok.eos_id,) and seen["pad_id"] == tok.pad_id == tok.eos_id
    assert seen["prompts"][0] == tok.encode("Hello")


def test_unknown_word_warnings_need_an_unk_id() -> None:
    from aiayn.generate.inputs import check_unknown

    assert check_unknown([[5, 5, 5]], None, ["line 1"]) == []
    assert len(check_unknown([[5, 5, 5]], 5, ["line 1"])) == 1
