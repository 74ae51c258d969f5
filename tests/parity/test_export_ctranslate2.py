"""Models trained here, exported to transformers (``aiayn convert --to-hf``) and from there to CTranslate2
(``ct2-transformers-converter --model FOLDER``): the exported folder computes aiayn's logits, its tokenizer gives
aiayn's ids and text, and CTranslate2's Translator and Generator give aiayn's decodes.

Translation: ``make demo``'s model shape (post-LN, the paper's interleaved sinusoidal table and LayerNorm epsilon
1e-6, aiayn's word tokenizer with pad 0 and decoding from ``<s>``) exports as a MarianMTModel in Marian's vocabulary
layout (:mod:`aiayn.hf.marian_vocab`). Language models (char and BPE tokenizers) export as GPT-2. Each model has
random weights; EOS's output row is moved so that hypotheses end at different lengths before the length limit, and
pad's and ``<s>``'s so that they are never likely, as after training (aiayn bans them after the softmax;
CTranslate2 can only ban before it, which renormalizes).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
ctranslate2 = pytest.importorskip("ctranslate2", reason="the CTranslate2 tests need the ctranslate2 package "
                                                        "(pip install ctranslate2; the dev extra has it)")

from aiayn import ModelConfig, build_model  # noqa: E402
from aiayn.checkpoint import save_checkpoint  # noqa: E402
from aiayn.cli.main import main  # noqa: E402
from aiayn.data.synthetic import generate_corpus  # noqa: E402
from aiayn.errors import AiaynError  # noqa: E402
from aiayn.generate.lm import generate  # noqa: E402
from aiayn.hf import from_hf, to_hf  # noqa: E402
from aiayn.hf.marian_vocab import RENAMED_PAD  # noqa: E402
from aiayn.pretrained import load_pretrained  # noqa: E402
from aiayn.tasks.translation import translate_texts  # noqa: E402
from aiayn.tokenize import BPETokenizer, CharTokenizer, WordTokenizer  # noqa: E402

ATOL = 1e-5
CORPUS = generate_corpus(300, 24, 0, seed=3)
SOURCES = [s for s, _ in CORPUS["valid"]]
TEXT = [line for pair in CORPUS["train"] for line in pair]


def _perturbed(config: ModelConfig) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))  # norms away from 1, biases away from 0
    return model


@torch.no_grad()
def _shape_outputs(model: torch.nn.Module, logits: torch.Tensor, hidden: torch.Tensor, tok: Any) -> None:
    """Move output rows along the mean final state ``u`` (``hidden @ u`` about 1): EOS up, so that it is the best
    token at 15% of the positions of ``logits`` (N, V); pad and BOS down, far below every other token."""
    weight = model.lm_head.proj.weight  # (V, D), tied to the embedding
    u = hidden.mean(0) / hidden.mean(0).square().sum()  # (D,)
    others = logits.clone()
    others[:, tok.eos_id] = float("-inf")
    margin, along = others.max(-1).values - logits[:, tok.eos_id], hidden @ u
    weight[tok.eos_id] += (margin / along)[along > 0.2].quantile(0.15) * u
    for banned in (tok.pad_id, tok.bos_id):
        weight[banned] -= 10.0 * u


def _final_states(model: torch.nn.Module, run: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, V) logits and (N, D) inputs of the output layer of ``run()``."""
    seen: dict[str, torch.Tensor] = {}
    hook = model.lm_head.register_forward_hook(lambda mod, args, out: seen.setdefault("h", args[0]))
    with torch.no_grad():
        logits = run().logits.flatten(0, 1)
    hook.remove()
    return logits, seen["h"].flatten(0, 1)


@pytest.fixture(scope="module")
def translator(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``make demo``'s model shape at width 32, its checkpoint, the MarianMTModel folder and the CTranslate2
    model that ``ct2-transformers-converter`` makes of it."""
    return _translator(tmp_path_factory.mktemp("translator"), WordTokenizer.train(TEXT, min_frequency=1))


@pytest.fixture(scope="module")
def pre_ln_translator(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The tiny Multi30k recipes' model shape (pre-LN, joint BPE with punctuation split) at width 32, exported as
    Pegasus and converted by CTranslate2. Its output bias (Pegasus's ``final_logits_bias``) keeps pad and ``<s>``
    unlikely, which moving their rows does not do in this random pre-LN model."""
    tok = BPETokenizer.train(TEXT, vocab_size=300, split_punctuation=True)
    return _translator(tmp_path_factory.mktemp("pre-ln"), tok, norm_position="pre", output_bias=True)


def _translator(root: Path, tok: Any, **fields: Any) -> dict[str, Any]:
    config = ModelConfig.preset("paper-base", vocab_size=tok.vocab_size, d_model=32, n_heads=4, d_ff=64, n_layers=2,
                                n_encoder_layers=2, dropout=0.0, max_len=64, **fields)
    model = _perturbed(config)
    gen = torch.Generator().manual_seed(0)
    src = torch.randint(5, tok.vocab_size, (8, 9), generator=gen)
    tgt = torch.randint(5, tok.vocab_size, (8, 12), generator=gen)
    tgt[:, 0] = tok.bos_id
    _shape_outputs(model, *_final_states(model, lambda: model(src, tgt)), tok)
    if config.output_bias:  # the same through the bias: EOS best at 8% of the positions, pad and <s> never
        logits, _ = _final_states(model, lambda: model(src, tgt))
        others = logits.clone()
        others[:, tok.eos_id] = float("-inf")
        with torch.no_grad():
            model.lm_head.proj.bias[tok.eos_id] += (others.max(-1).values - logits[:, tok.eos_id]).quantile(0.08)
            model.lm_head.proj.bias[[tok.pad_id, tok.bos_id]] = -30.0
    meta = {"task": "translation", "model": config.to_dict(), "tokenizers": {"src": "tokenizer.json",
                                                                             "tgt": "tokenizer.json"},
            "decode": {"beam": 4, "alpha": 0.0, "max_len_a": 1.0, "max_len_b": 50}, "lowercase": False}
    ckpt = save_checkpoint(root / "aiayn", model, meta, tokenizer_writer=lambda d: tok.save(d / "tokenizer.json"))
    hf = to_hf(ckpt, root / "hf")
    converter = shutil.which("ct2-transformers-converter") or str(Path(sys.executable).parent /
                                                                 "ct2-transformers-converter")
    run = subprocess.run([converter, "--model", str(hf), "--output_dir", str(root / "ct2")], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    return {"tok": tok, "ckpt": ckpt, "hf": hf, "ct2": root / "ct2", "model": model}


def _padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])  # (B, S)
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return ids, mask


def test_the_demo_translator_exports_to_marian_with_its_logits(translator: dict[str, Any]) -> None:
    tok, V = translator["tok"], translator["tok"].vocab_size
    hf = transformers.MarianMTModel.from_pretrained(str(translator["hf"])).eval()
    assert (hf.config.pad_token_id, hf.config.decoder_start_token_id, hf.config.vocab_size) == (V, V, V + 1)
    rows = [tok.encode(s) for s in SOURCES[:6]]
    tgt = torch.tensor([[tok.bos_id] + tok.encode(s)[:6] + [tok.eos_id] * (6 - len(tok.encode(s)[:6]))
                        for s in SOURCES[6:12]])  # (6, 7) aiayn's decoder input, starting from <s>
    with torch.no_grad():
        want = translator["model"](_padded(rows, tok.pad_id)[0], tgt).logits  # (6, 7, V)
        ids, mask = _padded(rows, V)  # the export pads with its own <pad>
        hf_tgt = torch.cat([torch.full((6, 1), V), tgt[:, 1:]], 1)  # ...and starts from it
        got = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=hf_tgt).logits  # (6, 7, V + 1)
    torch.testing.assert_close(got[..., :V], want, atol=ATOL, rtol=0)
    assert bool((got[..., V] == torch.finfo(torch.float32).min).all())  # the added <pad> is never likely


def test_the_tokenizer_goes_with_the_model_in_marian_layout(translator: dict[str, Any]) -> None:
    tok, V = translator["tok"], translator["tok"].vocab_size
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(translator["hf"]))
    assert len(hf_tok) == V + 1
    assert (hf_tok.pad_token, hf_tok.pad_token_id) == ("<pad>", V)
    assert hf_tok.convert_ids_to_tokens(tok.pad_id) == RENAMED_PAD
    assert (hf_tok.bos_token_id, hf_tok.eos_token_id, hf_tok.unk_token_id) == (tok.bos_id, tok.eos_id, tok.unk_id)
    for text in [*SOURCES[:8], "an unknown word , and a zebra !"]:
        ids = tok.encode(text)
        assert hf_tok.encode(text, add_special_tokens=False) == ids, text
        framed = [tok.bos_id, *ids, tok.eos_id, V]
        assert hf_tok.decode(framed, skip_special_tokens=True) == tok.decode(framed[:-1], skip_special=True)


def _ct2_translate(translator: dict[str, Any], beam: int, n_best: int) -> list[list[str]]:
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(translator["hf"]))
    engine = ctranslate2.Translator(str(translator["ct2"]), device="cpu", intra_threads=1)
    sources = [hf_tok.convert_ids_to_tokens(hf_tok.encode(s, add_special_tokens=False)) for s in SOURCES]
    results = engine.translate_batch(sources, beam_size=beam, num_hypotheses=n_best, length_penalty=0.0,
                                     min_decoding_length=0, max_decoding_length=64)
    return [[hf_tok.decode(hf_tok.convert_tokens_to_ids(h)) for h in r.hypotheses] for r in results]


@pytest.mark.parametrize("layout", ["translator", "pre_ln_translator"])
@pytest.mark.parametrize("beam", [1, 4])
def test_ctranslate2_translates_as_aiayn_translate(layout: str, beam: int, request: pytest.FixtureRequest,
                                                   tmp_path: Path) -> None:
    """CTranslate2's Translator on the converted folder (Marian for the demo's post-LN model, Pegasus for the
    Multi30k recipes' pre-LN one) gives ``aiayn translate``'s n-best lists: the same beam size, length penalty 0 on
    both sides (CTranslate2's ``length_penalty`` divides by length ** penalty, aiayn's alpha by GNMT's
    ((5 + length) / 6) ** alpha), no minimum length."""
    translator = request.getfixturevalue(layout)
    pre = load_pretrained(translator["ckpt"], accel="none")
    tok = pre.tokenizers["src"]
    ours = translate_texts(pre.model, tok, tok, SOURCES, beam=beam, alpha=0.0, n_best=beam)
    theirs = _ct2_translate(translator, beam, beam)
    assert [o if beam > 1 else [o] for o in ours] == theirs
    lengths = {len(tok.encode(hyp)) for hyps in theirs for hyp in hyps}
    assert len(lengths) > 3  # hypotheses of many lengths, none at the limit
    if beam == 4:  # the command itself, as a user runs it
        (tmp_path / "src.txt").write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
        assert main(["translate", "--checkpoint", str(translator["ckpt"]), "-i", str(tmp_path / "src.txt"),
                     "-o", str(tmp_path / "out.txt"), "--beam", "4", "--alpha", "0"]) == 0
        assert (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines() == [h[0] for h in theirs]


def test_the_pre_ln_translator_exports_to_pegasus_with_its_logits_and_tokenizer(
        pre_ln_translator: dict[str, Any]) -> None:
    """Pegasus starts its decoder from its pad token, so the export names ``<s>`` the pad token: the decoder's input
    is aiayn's, and every logit is."""
    tok, case = pre_ln_translator["tok"], pre_ln_translator
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(case["hf"])).eval()
    assert type(hf).__name__ == "PegasusForConditionalGeneration"
    assert (hf.config.pad_token_id, hf.config.decoder_start_token_id) == (tok.bos_id, tok.bos_id)
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(case["hf"]))
    assert (hf_tok.pad_token_id, hf_tok.eos_token_id, len(hf_tok)) == (tok.bos_id, tok.eos_id, tok.vocab_size)
    rows = [tok.encode(s) for s in SOURCES[:6]]
    assert [hf_tok.encode(s, add_special_tokens=False) for s in SOURCES[:6]] == rows
    tgt = torch.tensor([[tok.bos_id] + tok.encode(s)[:6] + [tok.eos_id] * (6 - len(tok.encode(s)[:6]))
                        for s in SOURCES[6:12]])  # (6, 7)
    ids, mask = _padded(rows, tok.pad_id)
    with torch.no_grad():
        want = case["model"](ids, tgt).logits  # (6, 7, V)
        got = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=tgt).logits
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def test_an_exported_folder_is_not_read_back_as_plain_marian(translator: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(AiaynError, match="embed_positions.weight: not the sinusoidal table"):
        from_hf(translator["hf"], tmp_path / "back")


LM = dict(arch="decoder", d_model=32, n_heads=4, n_layers=2, d_ff=64, max_len=64, dropout=0.0, activation="gelu",
          norm="layernorm", norm_position="pre", position="learned", scale_embeddings=False, tie_embeddings=True,
          init="gpt2")  # the shakespeare recipes' shape


LLAMA = {**LM, "n_kv_heads": 2, "activation": "swiglu", "norm": "rmsnorm", "norm_eps": 1e-6, "position": "rope",
         "bias": False, "tie_embeddings": False}  # the llama preset's shape
HF_CLASSES = {"char": "GPT2LMHeadModel", "bpe": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}


def _lm(tmp_path: Path, tok: Any, fields: dict[str, Any]) -> tuple[Path, Path]:
    """An aiayn LM checkpoint with ``tok``, its transformers folder and its CTranslate2 model."""
    config = ModelConfig(vocab_size=tok.vocab_size, **fields)
    model = _perturbed(config)
    with torch.no_grad():
        model.embed.weight.normal_(0.0, 1.0)  # logits that tell tokens apart (the output layer, tied or not)
        model.lm_head.proj.weight.normal_(0.0, 1.0)
    ids = torch.randint(5, tok.vocab_size, (8, 16), generator=torch.Generator().manual_seed(0))
    _shape_outputs(model, *_final_states(model, lambda: model(ids)), tok)
    meta = {"task": "lm", "model": config.to_dict(), "tokenizers": {"text": "tokenizer.json"}, "block_size": 64,
            "newline_symbol": None, "packing": False}
    ckpt = save_checkpoint(tmp_path / "aiayn", model, meta, tokenizer_writer=lambda d: tok.save(d / "tokenizer.json"))
    hf = to_hf(ckpt, tmp_path / "hf")
    ctranslate2.converters.TransformersConverter(str(hf)).convert(str(tmp_path / "ct2"))
    return ckpt, hf


@pytest.mark.parametrize("kind", ["char", "bpe", "llama"])
def test_ctranslate2_generates_as_aiayn_generate(kind: str, tmp_path: Path) -> None:
    """A char and a BPE language model of the Shakespeare recipes' shape exported as GPT-2, and a char model of the
    llama preset's shape as LLaMA: transformers' logits equal aiayn's, and CTranslate2's Generator continues each
    prompt greedily as ``aiayn generate --greedy`` does."""
    lines = [" ".join(pair) for pair in CORPUS["train"]]
    tok = BPETokenizer.train(lines, vocab_size=300) if kind == "bpe" else CharTokenizer.train(lines)
    ckpt, hf = _lm(tmp_path, tok, LLAMA if kind == "llama" else LM)
    pre = load_pretrained(ckpt, accel="none")
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(hf)).eval()
    assert type(ref).__name__ == HF_CLASSES[kind]
    prompts = [[tok.bos_id, *tok.encode(s)[:20]] for s in SOURCES[:6]]
    with torch.no_grad():
        for p in prompts:
            torch.testing.assert_close(ref(torch.tensor([p])).logits, pre.model(torch.tensor([p])).logits,
                                       atol=ATOL, rtol=0)
    ours = generate(pre.model, prompts, max_new_tokens=20, greedy=True, stop_ids=(tok.eos_id,), pad_id=tok.pad_id)
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(hf))
    engine = ctranslate2.Generator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
    results = engine.generate_batch([hf_tok.convert_ids_to_tokens(p) for p in prompts], max_length=20,
                                    sampling_topk=1, include_prompt_in_result=False)
    theirs = [hf_tok.convert_tokens_to_ids(r.sequences[0]) for r in results]
    assert theirs == ours
    assert len({tuple(o) for o in ours}) > 2  # continuations that differ


def test_a_bpe_vocabulary_goes_to_marian_layout_with_its_ids_and_text(tmp_path: Path) -> None:
    """The tiny Multi30k recipes' tokenizer (joint BPE, punctuation split) in Marian's layout: AutoTokenizer gives
    aiayn's ids and detokenized text, pad last."""
    from aiayn.hf.folder import write_tokenizer
    from aiayn.hf.marian_vocab import pad_last_tokenizer

    tok = BPETokenizer.train(TEXT, vocab_size=300, split_punctuation=True)
    assert write_tokenizer(tmp_path, tok, 64, lambda form: pad_last_tokenizer(form, tok))
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert (len(hf_tok), hf_tok.pad_token_id, hf_tok.convert_ids_to_tokens(tok.pad_id)) == (
        tok.vocab_size + 1, tok.vocab_size, RENAMED_PAD)
    for text in [*SOURCES[:8], "the zebra, and the dogs."]:
        ids = tok.encode(text)
        assert hf_tok.encode(text, add_special_tokens=False) == ids, text
        assert hf_tok.decode([tok.bos_id, *ids, tok.eos_id], skip_special_tokens=True) == tok.decode(ids), text


def _classifier(tmp_path: Path, **fields: Any) -> tuple[Path, torch.nn.Module, Any]:
    tok = WordTokenizer.train(TEXT[:40], min_frequency=1)
    preset = fields.pop("preset", None)
    base = dict(vocab_size=tok.vocab_size, d_model=32, n_heads=4, d_ff=64, n_layers=2, max_len=64, dropout=0.0,
                n_classes=2)
    config = ModelConfig.preset(preset, **base, **fields) if preset else ModelConfig(**base, **fields)
    model = _perturbed(config)
    meta = {"task": "classification", "model": config.to_dict(), "tokenizers": {"text": "tokenizer.json"},
            "labels": ["0", "1"], "label_names": ["negative", "positive"], "max_len": 64}
    ckpt = save_checkpoint(tmp_path / "aiayn", model, meta, tokenizer_writer=lambda d: tok.save(d / "tokenizer.json"))
    return ckpt, model, tok


def test_a_bert_shaped_classifier_exports_with_its_logits_and_the_recipe_shape_is_refused(tmp_path: Path) -> None:
    """A classifier of BERT's shape (post-LN, embedding norm, CLS pooling) is a BertForSequenceClassification with
    aiayn's class logits (CTranslate2 has no classifier); the sst2-scratch recipe's (pre-LN, mean pooling) is
    refused naming each setting and the value that would export."""
    ckpt, model, tok = _classifier(tmp_path, preset="bert-base")
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(str(to_hf(ckpt, tmp_path / "hf"))).eval()
    assert type(hf).__name__ == "BertForSequenceClassification"
    assert hf.config.id2label == {0: "negative", 1: "positive"}
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    rows = [[tok.bos_id, *tok.encode(s)] for s in SOURCES[:5]]
    assert [[tok.bos_id, *hf_tok.encode(s, add_special_tokens=False)] for s in SOURCES[:5]] == rows
    ids, mask = _padded(rows, tok.pad_id)
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=ids, attention_mask=mask).logits, model(ids, task="classify").logits,
                                   atol=ATOL, rtol=0)
    scratch, _, _ = _classifier(tmp_path / "scratch", arch="encoder", activation="gelu", norm_position="pre",
                                position="learned", scale_embeddings=False, init="gpt2", pooling="mean")
    with pytest.raises(AiaynError, match=r"(?s)norm_position='pre': BERT's classifier has 'post'.*"
                                         r"pooling='mean': BERT's classifier has 'cls'"):
        to_hf(scratch, tmp_path / "refused")


@pytest.mark.parametrize(("setting", "line"), [
    (dict(position="alibi"), "position='alibi': Marian has 'sinusoidal'"),
    (dict(position="t5"), "position='t5': Marian has 'sinusoidal'"),
    (dict(position="rope"), "position='rope': Marian has 'sinusoidal'"),
    (dict(deepnorm=True), "deepnorm=True: Marian has False"),
])
def test_translation_models_without_a_transformers_class_are_refused_by_setting(setting: dict[str, Any], line: str,
                                                                                tmp_path: Path) -> None:
    """ALiBi, T5 biases, RoPE and DeepNorm in a post-LN encoder-decoder: one error naming each family, the setting
    and the value that family has (the value a recipe sets to export)."""
    tok = WordTokenizer.train(TEXT[:20], min_frequency=1)
    config = ModelConfig.preset("paper-base", vocab_size=tok.vocab_size, d_model=32, n_heads=4, d_ff=64, n_layers=1,
                                n_encoder_layers=1, dropout=0.0, max_len=32, **setting)
    meta = {"task": "translation", "model": config.to_dict(), "tokenizers": {"src": "tokenizer.json",
                                                                             "tgt": "tokenizer.json"}}
    ckpt = save_checkpoint(tmp_path / "aiayn", build_model(config), meta,
                           tokenizer_writer=lambda d: tok.save(d / "tokenizer.json"))
    with pytest.raises(AiaynError, match=r"(?s)no transformers model type has this model's shape.*marian: cannot "
                                         r"convert:\n  - " + line.replace("(", r"\(")):
        to_hf(ckpt, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_pegasus_folders_convert_to_aiayn(tmp_path: Path) -> None:
    """A PegasusForConditionalGeneration that transformers made (pad 0, EOS 1, decoding from pad) converts with its
    logits; an export of a pre-LN model with epsilon 1e-5 reads back as the same model; one with the paper's 1e-6
    (its stored tables scaled) is refused."""
    from tokenizers import Tokenizer, models

    words = ["<pad>", "</s>", "<unk>", *sorted({w for line in TEXT[:30] for w in line.split()})]
    config = transformers.PegasusConfig(vocab_size=len(words), d_model=32, encoder_layers=2, decoder_layers=2,
                                        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                        decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=0,
                                        eos_token_id=1, decoder_start_token_id=0, scale_embedding=True)
    torch.manual_seed(0)
    ref = transformers.PegasusForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if p.dim() == 1:
                p.normal_(1.0 if name.endswith("weight") else 0.0, 0.2)
    ref.save_pretrained(str(tmp_path / "pegasus"))
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>")),
        pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(str(tmp_path / "pegasus"))
    pre = load_pretrained(from_hf(tmp_path / "pegasus", tmp_path / "aiayn"), accel="none")
    src = torch.randint(3, len(words), (3, 7), generator=torch.Generator().manual_seed(1))
    tgt = torch.cat([torch.zeros(3, 1, dtype=torch.long), src[:, :4]], 1)
    with torch.no_grad():
        torch.testing.assert_close(pre.model(src, tgt).logits,
                                   ref(input_ids=src, decoder_input_ids=tgt).logits, atol=ATOL, rtol=0)
    tok = BPETokenizer.train(TEXT, vocab_size=300, split_punctuation=True)
    plain = _translator(tmp_path / "plain", tok, norm_position="pre", norm_eps=1e-5)
    back = load_pretrained(from_hf(plain["hf"], tmp_path / "back"), accel="none")
    ids = torch.tensor([tok.encode(SOURCES[0])])
    dec = torch.tensor([[tok.bos_id, *tok.encode(SOURCES[1])[:5]]])
    with torch.no_grad():
        torch.testing.assert_close(back.model(ids, dec).logits, plain["model"](ids, dec).logits, atol=ATOL, rtol=0)
    scaled = _translator(tmp_path / "scaled", tok, norm_position="pre")
    with pytest.raises(AiaynError, match="embed_positions.weight: not the sinusoidal table"):
        from_hf(scaled["hf"], tmp_path / "refused")
