"""Hugging Face interop for BERT (masked LM and classifier), T5 v1.0 and v1.1, BART and Marian, held to transformers.

Each family is a tiny random transformers model built from its config class and saved with ``save_pretrained``
beside a tiny tokenizer (never downloaded), then read back with ``from_pretrained`` as the reference. ``from_hf``
converts the folder; the converted checkpoint must give transformers' logits at 1e-5 in fp32 (with source padding
and an attention mask; seq2seq decoding step by step through the KV cache against transformers' full pass), the
same greedy and beam-search outputs as ``generate`` (with the settings that make the two searches the same), and the
same logits again after ``to_hf`` and ``from_pretrained``. ``aiayn translate``, ``aiayn classify`` and ``aiayn
evaluate`` read the converted checkpoints and agree with transformers.

The searches agree exactly with: aiayn's ``alpha=0`` and transformers' ``length_penalty=0.0`` (both then rank by
the summed log-probabilities, EOS included), transformers' default ``early_stopping=False`` (its "cannot beat the
worst finished" test is then exact, as aiayn's is), ``forced_eos_token_id`` (transformers forces EOS as its last
token; aiayn forces it after ``max_len_b`` tokens, so ``max_new_tokens = max_len_b + 1``) and ``suppress_tokens`` of
the ids aiayn never outputs (pad and BOS). With a length penalty the two differ by design: GNMT's ``((5 + |Y|) /
6) ** alpha`` against transformers' ``|Y| ** length_penalty``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402
from tokenizers import Tokenizer as HFTokenizer  # noqa: E402
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

from aiayn.accel import compile_decoding  # noqa: E402
from aiayn.cli.main import main  # noqa: E402
from aiayn.errors import AiaynError  # noqa: E402
from aiayn.generate.common import length_penalty  # noqa: E402
from aiayn.generate.steppers import Seq2SeqStepper, eval_mode  # noqa: E402
from aiayn.generate.translate import banned_output_ids, greedy_translate, max_output_length, translate  # noqa: E402
from aiayn.hf import from_hf, to_hf  # noqa: E402
from aiayn.pretrained import Pretrained, load_pretrained  # noqa: E402

ATOL = 1e-5
D, H, FF, MAX = 32, 4, 48, 64
NEW = 24  # most tokens transformers generates (the last one a forced EOS)
EOS_RATE = 0.5  # EOS is made the best token at this share of random decoder positions
TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "Two young, white males are outside near many bushes.",
    "Several men in hard hats are operating a giant pulley system.",
    "A little girl climbing into a wooden playhouse.",
    "Ein kleines Mädchen klettert in ein Spielhaus aus Holz.",
    "Zwei Männer stehen am Herd und bereiten Essen zu.",
    "it's, can't, won't, they're, I'm, we've!",
] * 3
LABELS = {0: "negative", 1: "neutral", 2: "positive"}
FAMILIES = ("bert-mlm", "bert-classifier", "t5-v1.0", "t5-v1.1", "bart", "marian")
SEQ2SEQ = ("t5-v1.0", "t5-v1.1", "bart", "marian")


# ---------------------------------------------------------------------------------------------- tiny tokenizers
def _merges(tok: HFTokenizer) -> list[tuple[str, str]]:
    merges = json.loads(tok.to_str())["model"]["merges"]
    return [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in merges]  # type: ignore[misc]


def _bert_tokenizer(folder: Path) -> None:
    """WordPiece, lower-cased; [PAD]=0 and [CLS], [SEP] away from the built-in ids (4 and 5)."""
    tok = HFTokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(TEXT, trainers.WordPieceTrainer(
        vocab_size=200, special_tokens=["[PAD]", "[unused0]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
        show_progress=False))
    transformers.BertTokenizerFast(vocab=tok.get_vocab(), clean_up_tokenization_spaces=True).save_pretrained(folder)


def _unigram(specials: list[str]) -> list[tuple[str, float]]:
    tok = HFTokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.train_from_iterator(TEXT, trainers.UnigramTrainer(vocab_size=160, special_tokens=specials, unk_token="<unk>",
                                                          show_progress=False))
    return [(piece, score) for piece, score in json.loads(tok.to_str())["model"]["vocab"]]


def _t5_tokenizer(folder: Path) -> None:
    """SentencePiece unigram: <pad>=0, </s>=1, <unk>=2, sentinel tokens last; every text ends with </s>."""
    transformers.T5TokenizerFast(vocab=_unigram(["<pad>", "</s>", "<unk>"]), extra_ids=3).save_pretrained(folder)


def _bart_tokenizer(folder: Path) -> None:
    """Byte-level BPE: <s>=0, <pad>=1, </s>=2, <unk>=3, <mask> last; texts framed as <s> ... </s>."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(TEXT, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    vocab = tok.get_vocab(with_added_tokens=False)
    vocab["<mask>"] = len(vocab)
    transformers.BartTokenizerFast(vocab=vocab, merges=_merges(tok)).save_pretrained(folder)


def _marian_tokenizer(folder: Path) -> None:
    """Marian's layout: </s>=0, <unk>=1, the pieces, <pad> last; every text ends with </s>."""
    vocab = [*_unigram(["</s>", "<unk>"]), ("<pad>", 0.0)]
    tok = HFTokenizer(models.Unigram(vocab, unk_id=1))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A $B </s>",
                                                       special_tokens=[("</s>", 0)])
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>",
                                         pad_token="<pad>").save_pretrained(folder)


# ---------------------------------------------------------------------------------------------- tiny models
def _hf_config(family: str, tok: Any) -> Any:
    v = len(tok)
    if family.startswith("bert"):
        cfg = dict(vocab_size=v, hidden_size=D, num_hidden_layers=2, num_attention_heads=H, intermediate_size=FF,
                   max_position_embeddings=MAX, type_vocab_size=2, pad_token_id=tok.pad_token_id)
        if family == "bert-mlm":
            return transformers.BertConfig(**cfg, hidden_act="gelu")
        return transformers.BertConfig(**cfg, hidden_act="gelu_new", num_labels=len(LABELS), id2label=LABELS,
                                       label2id={x: i for i, x in LABELS.items()})
    if family.startswith("t5"):  # more encoder layers than decoder layers; v1.0: a vocabulary padded past the
        v1_0 = family == "t5-v1.0"  # tokenizer's, as T5's 32128 rows for 32100 tokens
        return transformers.T5Config(vocab_size=v + 5 if v1_0 else v, d_model=D, d_kv=D // H, d_ff=FF, num_layers=3,
                                     num_decoder_layers=2, num_heads=H, relative_attention_num_buckets=8,
                                     relative_attention_max_distance=20, pad_token_id=0, eos_token_id=1,
                                     decoder_start_token_id=0, feed_forward_proj="relu" if v1_0 else "gated-gelu",
                                     tie_word_embeddings=v1_0)
    seq2seq = dict(vocab_size=v, d_model=D, encoder_layers=3, decoder_layers=2, encoder_attention_heads=H,
                   decoder_attention_heads=H, encoder_ffn_dim=FF, decoder_ffn_dim=FF, max_position_embeddings=MAX)
    if family == "bart":
        return transformers.BartConfig(**seq2seq, activation_function="gelu", scale_embedding=False, pad_token_id=1,
                                       bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
                                       forced_eos_token_id=2)
    pad = tok.pad_token_id
    return transformers.MarianConfig(**seq2seq, decoder_vocab_size=v, activation_function="swish",
                                     scale_embedding=True, pad_token_id=pad, eos_token_id=0,
                                     decoder_start_token_id=pad, forced_eos_token_id=0)


HF_CLASSES = {"bert-mlm": "BertForMaskedLM", "bert-classifier": "BertForSequenceClassification",
              "t5-v1.0": "T5ForConditionalGeneration", "t5-v1.1": "T5ForConditionalGeneration",
              "bart": "BartForConditionalGeneration", "marian": "MarianMTModel"}
TOKENIZERS = {"bert": _bert_tokenizer, "t5": _t5_tokenizer, "bart": _bart_tokenizer, "marian": _marian_tokenizer}


def _randomize(model: nn.Module, family: str, eos: int) -> None:
    """Embedding tables N(0, 0.3), every other matrix N(0, 1 / fan_in) (a sublayer keeps its input's scale), norm
    weights near 1 and biases near 0 (frozen tables such as Marian's sinusoidal positions stay); BART's and Marian's
    output bias N(0, 0.5)."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not p.requires_grad:
                continue
            if p.dim() == 1:
                p.normal_(1.0 if name.endswith("weight") else 0.0, 0.2)
            elif "embed" in name or "shared" in name or "relative_attention_bias" in name:
                p.normal_(0.0, 0.3)
            else:
                p.normal_(0.0, p.shape[1] ** -0.5)
        if family == "t5-v1.1":  # an output layer of its own, as T5 v1.1 checkpoints store it
            model.lm_head.weight = nn.Parameter(D**-0.5 * torch.randn_like(model.lm_head.weight))
        if hasattr(model, "final_logits_bias"):
            model.final_logits_bias.normal_(0.0, 0.5)
        if model.config.is_encoder_decoder:
            _favour_eos(model, eos)


@torch.no_grad()
def _favour_eos(model: nn.Module, eos: int) -> None:
    """Move EOS's output row along the mean of the decoder's final states, so that EOS is the best token at
    ``EOS_RATE`` of random positions: hypotheses then end at different lengths, most before the length limit."""
    model.eval()
    v = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    src, tgt = torch.randint(4, v - 1, (8, 9), generator=gen), torch.randint(4, v - 1, (8, 12), generator=gen)
    tgt[:, 0] = model.config.decoder_start_token_id
    out = model(input_ids=src, decoder_input_ids=tgt, output_hidden_states=True)
    logits = out.logits.flatten(0, 1)  # (N, V)
    h = out.decoder_hidden_states[-1].flatten(0, 1) * (D**-0.5 if getattr(model.config, "scale_decoder_outputs",
                                                                            False) else 1.0)  # (N, D)
    u = h.mean(0) / h.mean(0).square().sum()  # h @ u is about 1
    others = logits.clone()
    others[:, eos] = float("-inf")
    margin, along = others.max(-1).values - logits[:, eos], h @ u  # EOS wins where c * along > margin
    c = (margin / along)[along > 0.2].quantile(EOS_RATE)
    model.get_output_embeddings().weight[eos] += c * u


def _save(family: str, folder: Path) -> None:
    """A random model of ``family`` and its tokenizer, saved together into ``folder``."""
    TOKENIZERS[family.split("-")[0]](folder)
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = getattr(transformers, HF_CLASSES[family])(_hf_config(family, tok))
    _randomize(model, family, tok.eos_token_id if tok.eos_token_id is not None else tok.sep_token_id)
    model.save_pretrained(folder)
    if family == "t5-v1.1":  # transformers may store the output layer under the embedding's name only
        state = load_file(folder / "model.safetensors")
        if "lm_head.weight" not in state:
            state["lm_head.weight"] = model.lm_head.weight.detach().clone()
            save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})


@dataclass
class Case:
    """One family: transformers' model read back from its folder, its tokenizer, the folder, the aiayn checkpoint
    converted from it, and that checkpoint loaded with the reference modules."""

    ref: nn.Module
    tok: Any
    folder: Path
    ckpt: Path
    pre: Pretrained


def _hf_load(folder: Path, family: str) -> nn.Module:
    cls = getattr(transformers, HF_CLASSES[family])
    return cls.from_pretrained(str(folder), attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Case]:
    out = {}
    for family in FAMILIES:
        root = tmp_path_factory.mktemp(family)
        _save(family, root / "hf")
        ckpt = from_hf(root / "hf", root / "aiayn")
        out[family] = Case(_hf_load(root / "hf", family), transformers.AutoTokenizer.from_pretrained(str(root / "hf")),
                           root / "hf", ckpt, load_pretrained(ckpt, accel="none"))
    return out


def _close(got: Tensor, want: Tensor) -> None:
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def _content_ids(tok: Any) -> Tensor:
    """The ids of ordinary tokens (no special ones), to draw inputs from."""
    special = set(tok.all_special_ids)
    return torch.tensor([i for i in range(len(tok)) if i not in special])


def _source(tok: Any, lengths: tuple[int, ...], seed: int = 1) -> tuple[Tensor, Tensor]:
    """Right-padded ids (B, S) of ordinary tokens, each row ending in EOS as the tokenizers frame a text, and their
    attention mask."""
    content, s = _content_ids(tok), max(lengths)
    gen = torch.Generator().manual_seed(seed)
    ids = content[torch.randint(0, len(content), (len(lengths), s), generator=gen)]
    mask = torch.arange(s)[None, :] < torch.tensor(lengths)[:, None]
    ids[torch.arange(len(lengths)), torch.tensor(lengths) - 1] = tok.eos_token_id if tok.eos_token_id is not None \
        else tok.sep_token_id
    ids[~mask] = tok.pad_token_id
    return ids, mask


def _target(case: Case, batch: int, length: int) -> Tensor:
    """Decoder inputs (B, T): the decoder start, then ordinary tokens."""
    content = _content_ids(case.tok)
    gen = torch.Generator().manual_seed(2)
    tgt = content[torch.randint(0, len(content), (batch, length), generator=gen)]
    tgt[:, 0] = case.pre.tokenizers["tgt"].decoder_start_id
    return tgt


# ------------------------------------------------------------------------------------- checkpoint and tokenizer
def test_checkpoints_have_the_families_tasks_and_ids(cases: dict[str, Case]) -> None:
    want = {"bert-mlm": "mlm", "bert-classifier": "classification", "t5-v1.0": "translation",
            "t5-v1.1": "translation", "bart": "translation", "marian": "translation"}
    for family, case in cases.items():
        pre, tok = case.pre, case.tok
        assert pre.task == want[family], family
        roles = ("src", "tgt") if pre.task == "translation" else ("text",)
        assert sorted(pre.tokenizers) == sorted(roles)
        ours = pre.tokenizers[roles[-1]]
        assert (ours.pad_id, ours.vocab_size) == (tok.pad_token_id, len(tok))
        assert ours.eos_id == (tok.eos_token_id if tok.eos_token_id is not None else tok.sep_token_id)
        assert pre.config.pad_id == tok.pad_token_id
    starts = {"t5-v1.0": 0, "t5-v1.1": 0, "bart": 2, "marian": cases["marian"].tok.pad_token_id}
    for family, start in starts.items():
        assert cases[family].pre.tokenizers["tgt"].decoder_start_id == start == \
            cases[family].ref.generation_config.decoder_start_token_id
    c = cases["t5-v1.0"].pre.config, cases["t5-v1.1"].pre.config
    assert (c[0].tie_embeddings, c[0].tied_output_scale, c[0].activation) == (True, True, "relu")
    assert (c[1].tie_embeddings, c[1].tied_output_scale, c[1].activation, c[1].gelu_approximate) == (
        False, False, "geglu", "tanh")
    assert (c[0].encoder_layers, c[0].n_layers) == (3, 2)
    meta = cases["bert-classifier"].pre.meta
    assert (meta["labels"], meta["label_names"], meta["max_len"]) == (["0", "1", "2"], list(LABELS.values()), MAX)


@pytest.mark.parametrize("family", FAMILIES)
def test_tokenizer_encodes_and_decodes_as_transformers(family: str, cases: dict[str, Case]) -> None:
    case = cases[family]
    ours = case.pre.tokenizers["tgt" if case.pre.task == "translation" else "text"]
    for text in TEXT[:7]:
        assert ours.encode(text) == case.tok.encode(text, add_special_tokens=False), text
        assert ours.encode_with_special(text) == case.tok.encode(text), text
        ids = case.tok.encode(text)
        assert ours.decode(ids) == case.tok.decode(ids, skip_special_tokens=True)


# ---------------------------------------------------------------------------------------------- logits
@pytest.mark.parametrize("family", ("bert-mlm", "bert-classifier"))
@pytest.mark.parametrize("accel", ("none", "auto"))
def test_bert_logits_equal_transformers_with_padding_and_segments(family: str, accel: str,
                                                                  cases: dict[str, Case]) -> None:
    case = cases[family]
    model = case.pre.model if accel == "none" else load_pretrained(case.ckpt, accel=accel).model
    ids, mask = _source(case.tok, (10, 7, 4))
    ids[:, 0] = case.tok.cls_token_id
    types = (torch.arange(10)[None, :] >= 3).long() * mask
    task = "mlm" if family == "bert-mlm" else "classify"
    with torch.no_grad():
        want = case.ref(input_ids=ids, attention_mask=mask.long(), token_type_ids=types).logits
        one = case.ref(input_ids=ids[2:, :4]).logits
        scope = getattr(model, "decoding_scope", None)
        with scope() if scope is not None else torch.no_grad():
            got = model(ids, is_token=mask, token_type_ids=types, task=task).logits
            got_one = model(ids[2:, :4], task=task).logits
    if task == "mlm":
        _close(got[mask], want[mask])
    else:
        _close(got, want)
    _close(got_one, one)  # a row alone, without padding or segments


@pytest.mark.parametrize("family", SEQ2SEQ)
def test_seq2seq_logits_equal_transformers_with_source_padding(family: str, cases: dict[str, Case]) -> None:
    case = cases[family]
    src, mask = _source(case.tok, (9, 6, 3))
    tgt = _target(case, 3, 7)
    with torch.no_grad():
        want = case.ref(input_ids=src, attention_mask=mask.long(), decoder_input_ids=tgt).logits
        _close(case.pre.model(src, tgt).logits, want)
        alone = case.ref(input_ids=src[2:, :3], decoder_input_ids=tgt[2:]).logits
        _close(case.pre.model(src[2:, :3], tgt[2:]).logits, alone)


@pytest.mark.parametrize("family", SEQ2SEQ)
@pytest.mark.parametrize("accel", ("none", "auto", "compiled"))
@pytest.mark.filterwarnings("error::RuntimeWarning")  # a compiled step that fell back to eager fails
def test_cached_decoding_equals_transformers_full_pass(family: str, accel: str, cases: dict[str, Case]) -> None:
    """aiayn's incremental decoding (the source encoded once, one target token per step through the KV cache) against
    transformers' teacher-forced pass over the whole target; "compiled": the step compiled over a static cache."""
    case = cases[family]
    model = load_pretrained(case.ckpt, accel=accel if accel != "compiled" else "none").model
    capacity = 4  # the cache grows
    if accel == "compiled":
        torch._dynamo.reset()
        compile_decoding(model, backend="aot_eager")
        capacity = 8  # a static cache holds every step
    src, mask = _source(case.tok, (9, 6, 3))
    tgt = _target(case, 3, 8)
    with torch.no_grad():
        want = case.ref(input_ids=src, attention_mask=mask.long(), decoder_input_ids=tgt).logits
    with eval_mode(model):
        stepper = Seq2SeqStepper(model, src, capacity=capacity, bos_id=int(tgt[0, 0]), src_is_token=mask)
        got = [stepper.first()]
        got += [stepper.step(tgt[:, t]) for t in range(1, tgt.shape[1])]
    _close(torch.stack(got, 1), want)


# ---------------------------------------------------------------------------------------------- greedy and beam search
def _ids(case: Case) -> tuple[int | None, int, int, int]:
    """(BOS, EOS, pad, decoder start) of the converted target vocabulary."""
    t = case.pre.tokenizers["tgt"]
    return t.bos_id, t.eos_id, t.pad_id, t.decoder_start_id


def _hf_generate(case: Case, src: Tensor, mask: Tensor, new: int, **kw: Any) -> Any:
    bos, eos, pad, _ = _ids(case)
    with torch.no_grad():
        return case.ref.generate(input_ids=src, attention_mask=mask.long(), do_sample=False, max_new_tokens=new,
                                 forced_eos_token_id=eos, suppress_tokens=banned_output_ids(pad, bos, eos),
                                 return_dict_in_generate=True, output_scores=True, **kw)


def _hf_tokens(row: Tensor, eos: int) -> list[int]:
    """A generated row without the decoder start, up to its first EOS."""
    out = []
    for t in row[1:].tolist():
        if t == eos:
            return out
        out.append(t)
    raise AssertionError(f"no EOS in {row.tolist()}")


@pytest.mark.parametrize("family", SEQ2SEQ)
def test_greedy_equals_generate(family: str, cases: dict[str, Case]) -> None:
    case = cases[family]
    bos, eos, pad, start = _ids(case)
    src, mask = _source(case.tok, (9, 7, 5, 3, 8, 2), seed=3)
    want = _hf_generate(case, src, mask, NEW, num_beams=1).sequences
    got = greedy_translate(case.pre.model, src, max_len_a=0.0, max_len_b=NEW - 1, bos_id=bos, eos_id=eos, pad_id=pad,
                           start_id=start)
    assert [h.tokens for h in got] == [_hf_tokens(row, eos) for row in want]


def _sources(case: Case, n: int, seed: int) -> tuple[Tensor, Tensor, list[int]]:
    """``n`` right-padded sources of 2 to 9 tokens, their attention mask and their lengths."""
    lengths = [int(x) for x in torch.randint(2, 10, (n,), generator=torch.Generator().manual_seed(seed))]
    return *_source(case.tok, tuple(lengths), seed=seed), lengths


def _beams(case: Case, src: Tensor, mask: Tensor, new: int, alpha: float, lp: float,
           n: int = 4) -> tuple[list[list[Any]], list[list[int]], Tensor]:
    """aiayn's ``n`` best of four beams (alpha) and transformers' (length_penalty ``lp``, early_stopping=False), with
    at most ``new`` tokens, EOS included: (aiayn's hypotheses per sentence, transformers' token lists, their
    scores)."""
    bos, eos, pad, start = _ids(case)
    hyps = translate(case.pre.model, src, beam_size=4, alpha=alpha, max_len_a=0.0, max_len_b=new - 1, n_best=n,
                     bos_id=bos, eos_id=eos, pad_id=pad, start_id=start)
    out = _hf_generate(case, src, mask, new, num_beams=4, num_return_sequences=n, length_penalty=lp,
                       early_stopping=False)
    return hyps, [_hf_tokens(row, eos) for row in out.sequences], out.sequences_scores


@pytest.mark.parametrize("family", SEQ2SEQ)
def test_beam_search_equals_generate_without_length_penalty(family: str, cases: dict[str, Case]) -> None:
    """Four beams, all four finished hypotheses of a sentence compared in order, with their summed log-probabilities,
    for every sentence none of whose hypotheses is cut at the length limit (where the two conventions differ: see
    the next test); most sentences are such."""
    case = cases[family]
    src, mask, _ = _sources(case, 12, seed=4)
    hyps, want, scores = _beams(case, src, mask, NEW, alpha=0.0, lp=0.0)
    compared = 0
    for i, sent in enumerate(hyps):
        theirs = want[4 * i:4 * i + 4]
        if max(len(t) for t in [*theirs, *(h.tokens for h in sent)]) == NEW - 1:
            continue
        compared += 1
        assert [h.tokens for h in sent] == theirs, i
        torch.testing.assert_close(torch.tensor([h.logprob for h in sent]), scores[4 * i:4 * i + 4], atol=1e-4,
                                   rtol=0)
    assert compared >= len(hyps) // 2, f"only {compared} of {len(hyps)} sentences end before the limit"


def _logprob(case: Case, src: Tensor, tokens: list[int], eos: bool = True) -> float:
    """aiayn's summed log-probability of ``tokens`` (and EOS after them) given one source row (1, S)."""
    _, eos_id, _, start = _ids(case)
    tgt = torch.tensor([[start, *tokens]])
    with torch.no_grad():
        logp = case.pre.model(src, tgt).logits.float().log_softmax(-1)[0]  # (T, V)
    scored = torch.tensor([*tokens, eos_id] if eos else tokens, dtype=torch.long)
    return float(logp[: len(scored)].gather(1, scored[:, None]).sum())


@pytest.mark.parametrize("family", ("t5-v1.0", "marian"))
def test_at_the_length_limit_transformers_leaves_out_the_forced_eos(family: str, cases: dict[str, Case]) -> None:
    """A hypothesis cut at the length limit ends in EOS in both; aiayn scores that EOS (log p(EOS)), transformers
    does not (its forced EOS scores 0, as an unfinished beam at ``max_length`` does). So when hypotheses reach the
    limit, the two may rank them differently: each such difference involves a hypothesis at the limit."""
    case = cases[family]
    new = 4
    src, mask, lengths = _sources(case, 24, seed=7)
    hyps, want, scores = _beams(case, src, mask, new, alpha=0.0, lp=0.0, n=1)
    at_limit = differ = 0
    for i, (theirs, score) in enumerate(zip(want, scores.tolist())):
        row = src[i:i + 1, :lengths[i]]
        cut = len(theirs) == new - 1
        at_limit += cut
        assert score == pytest.approx(_logprob(case, row, theirs, eos=not cut), abs=1e-4)
        ours = hyps[i][0].tokens
        if ours != theirs:
            differ += 1
            assert cut or len(ours) == new - 1, (i, ours, theirs)
    print(f"{family}: {at_limit} of {len(want)} of transformers' best hypotheses reach the limit of {new} tokens; "
          f"{differ} of {len(want)} differ from aiayn's")
    assert at_limit


@pytest.mark.parametrize("family", ("bart", "marian"))
def test_length_penalty_differences_come_from_lengths_only(family: str, cases: dict[str, Case]) -> None:
    """With a length penalty, aiayn (GNMT ``((5 + |Y|) / 6) ** 0.6``) and transformers (``|Y| ** 0.6`` and ``** 1.0``,
    early_stopping=False) may choose different best hypotheses: wherever they do (and neither is cut at the length
    limit), the two differ in length, and each is the better one under its own penalty."""
    case = cases[family]
    src, mask, lengths = _sources(case, 24, seed=6)
    for lp in (0.6, 1.0):
        hyps, want, _ = _beams(case, src, mask, NEW, alpha=0.6, lp=lp, n=1)
        differ = [i for i, (h, w) in enumerate(zip(hyps, want)) if h[0].tokens != w]
        print(f"{family}: alpha=0.6 against length_penalty={lp}: {len(differ)} of {len(want)} best hypotheses differ")
        for i in differ:
            ours, theirs = hyps[i][0].tokens, want[i]
            if max(len(ours), len(theirs)) == NEW - 1:
                continue
            assert len(ours) != len(theirs), (i, ours, theirs)
            row = src[i:i + 1, :lengths[i]]
            mine, other = _logprob(case, row, ours), _logprob(case, row, theirs)
            assert mine / length_penalty(len(ours) + 1, 0.6) >= other / length_penalty(len(theirs) + 1, 0.6) - 1e-5
            assert other / (len(theirs) + 1) ** lp >= mine / (len(ours) + 1) ** lp - 1e-5


# ---------------------------------------------------------------------------------------------- round trip
@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip_gives_transformers_the_same_model(family: str, cases: dict[str, Case], tmp_path: Path) -> None:
    case = cases[family]
    out = to_hf(case.ckpt, tmp_path / "back")
    back = _hf_load(out, family)
    assert type(back) is type(case.ref)
    ours, theirs = load_file(out / "model.safetensors"), load_file(case.folder / "model.safetensors")
    assert set(ours) == set(theirs)
    for key, value in theirs.items():
        torch.testing.assert_close(ours[key], value, atol=0, rtol=0, msg=key)
    src, mask = _source(case.tok, (9, 6, 3))
    with torch.no_grad():
        if case.pre.task == "translation":
            tgt = _target(case, 3, 5)
            args = dict(input_ids=src, attention_mask=mask.long(), decoder_input_ids=tgt)
        else:
            args = dict(input_ids=src, attention_mask=mask.long())
        _close(back(**args).logits, case.ref(**args).logits)
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    for text in TEXT[:7]:
        ids = case.tok.encode(text)
        assert tok.encode(text) == ids
        assert tok.decode(ids, skip_special_tokens=True) == case.tok.decode(ids, skip_special_tokens=True)
    config = json.loads((out / "config.json").read_text())
    assert config["pad_token_id"] == case.tok.pad_token_id
    if case.pre.task == "translation":
        assert config["decoder_start_token_id"] == case.ref.generation_config.decoder_start_token_id
    if family == "bert-classifier":
        assert {int(k): v for k, v in config["id2label"].items()} == LABELS


def test_an_interleaved_sinusoidal_model_exports_to_marian_with_its_width_reordered(cases: dict[str, Case],
                                                                                    tmp_path: Path) -> None:
    """A model with the paper's interleaved sinusoidal table (aiayn's default; ``make demo`` trains one) is Marian's
    model with the D features of its residual stream in another order: made here from the Marian case by the
    inverse reordering, it computes Marian's logits, and ``to_hf`` writes a MarianMTModel that computes them too."""
    import shutil

    from aiayn.checkpoint import read_state_dict, save_checkpoint
    from aiayn.hf.bart import halves_order, width_reordered

    case = cases["marian"]
    meta = json.loads((case.ckpt / "config.json").read_text())
    for key in ("hf_config", "converted_from"):  # as a model trained here has it
        meta.pop(key, None)
    meta["model"]["sinusoidal_layout"] = "interleaved"
    order = halves_order(meta["model"]["d_model"])
    state = width_reordered(read_state_dict(case.ckpt), torch.argsort(order))
    kept = [f for f in case.ckpt.iterdir() if f.name not in ("config.json", "model.safetensors", "manifest.json")]
    interleaved = save_checkpoint(tmp_path / "interleaved", state, meta,
                                  tokenizer_writer=lambda d: [shutil.copy(f, d / f.name) for f in kept])
    pre = load_pretrained(interleaved)
    assert pre.model.config.sinusoidal_layout == "interleaved"
    src, mask = _source(case.tok, (9, 6, 3))
    tgt = _target(case, 3, 7)
    with torch.no_grad():
        want = case.ref(input_ids=src, attention_mask=mask.long(), decoder_input_ids=tgt).logits
        _close(pre.model(src, tgt).logits, want)
        out = to_hf(interleaved, tmp_path / "hf")
        assert json.loads((out / "config.json").read_text())["model_type"] == "marian"
        _close(_hf_load(out, "marian")(input_ids=src, attention_mask=mask.long(), decoder_input_ids=tgt).logits, want)
    exported = load_file(out / "model.safetensors")
    torch.testing.assert_close(exported["model.shared.weight"], load_file(case.folder / "model.safetensors")[
        "model.shared.weight"], atol=0, rtol=0)  # the reordering undone exactly
    unknown = {**state, "decoder.layers.0.ffn.w_gate.weight": state["decoder.layers.0.ffn.w_in.weight"]}
    with pytest.raises(AiaynError, match=r"w_gate.weight.*sinusoidal_layout = \"halves\""):
        width_reordered(unknown, order)


def test_older_layouts_convert_alike(cases: dict[str, Case], tmp_path: Path) -> None:
    """BERT weights named ``gamma``/``beta`` (the original checkpoints), BART without the ``model.`` prefix and
    without ``final_logits_bias`` (a ``BartModel``), and a T5 v1.1 folder without ``lm_head.weight`` (transformers 5
    then ties it) convert to the same aiayn weights as the folders transformers writes today."""
    import shutil

    from aiayn.checkpoint import read_state_dict

    def variant(family: str, change: Any) -> dict[str, Tensor]:
        folder = tmp_path / family
        shutil.copytree(cases[family].folder, folder)
        state = change(load_file(folder / "model.safetensors"))
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return read_state_dict(from_hf(folder, tmp_path / f"{family}-aiayn"))

    def same(got: dict[str, Tensor], family: str, **expected: Tensor) -> None:
        want = read_state_dict(cases[family].ckpt)
        assert set(got) == set(want)
        for key in want:
            torch.testing.assert_close(got[key], expected.get(key, want[key]), atol=0, rtol=0, msg=key)

    same(variant("bert-mlm", lambda st: {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
        "LayerNorm.bias", "LayerNorm.beta"): v for k, v in st.items()}), "bert-mlm")
    bart = read_state_dict(cases["bart"].ckpt)
    same(variant("bart", lambda st: {k.removeprefix("model."): v for k, v in st.items() if k != "final_logits_bias"}),
         "bart", **{"lm_head.proj.bias": torch.zeros_like(bart["lm_head.proj.bias"])})
    t5 = read_state_dict(cases["t5-v1.1"].ckpt)
    same(variant("t5-v1.1", lambda st: {k: v for k, v in st.items() if k != "lm_head.weight"}), "t5-v1.1",
         **{"lm_head.proj.weight": t5["src_embed.weight"]})


def test_refused_settings_are_named(tmp_path: Path) -> None:
    from aiayn.hf.family import family_for_hf

    t5 = family_for_hf({"model_type": "t5"})
    wide = t5.config_from_hf({"model_type": "t5", "d_model": 512, "num_heads": 6, "d_kv": 64})[0]
    assert wide["head_dim"] == 64  # heads of d_kv, not d_model / num_heads (tests/parity/test_head_dim.py)
    with pytest.raises(AiaynError, match="gated-relu"):
        t5.config_from_hf({"model_type": "t5", "feed_forward_proj": "gated-relu", "d_model": 32, "num_heads": 4,
                           "d_kv": 8})
    marian = family_for_hf({"model_type": "marian"})
    with pytest.raises(AiaynError, match="share_encoder_decoder_embeddings"):
        marian.config_from_hf({"model_type": "marian", "share_encoder_decoder_embeddings": False, "pad_token_id": 5,
                               "vocab_size": 10})
    bert = family_for_hf({"model_type": "bert", "architectures": ["BertForSequenceClassification"]})
    with pytest.raises(AiaynError, match="position_embedding_type"):
        bert.config_from_hf({"model_type": "bert", "position_embedding_type": "relative_key"})
    with pytest.raises(AiaynError, match="num_labels=1"):
        bert.config_from_hf({"model_type": "bert", "num_labels": 1})
    with pytest.raises(AiaynError, match="BertForTokenClassification.*BertModel"):
        family_for_hf({"model_type": "bert", "architectures": ["BertForTokenClassification"]})


# ---------------------------------------------------------------------------------------------- the aiayn command
def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{x}\n" for x in lines), encoding="utf-8")
    return path


@pytest.mark.parametrize("family", ("t5-v1.1", "bart", "marian"))
def test_translate_and_evaluate_commands_read_converted_checkpoints(family: str, cases: dict[str, Case],
                                                                    tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    """``aiayn translate --beam 1`` prints what transformers' greedy generate gives for the source as the tokenizer
    frames it (T5 and Marian ``... </s>``, BART ``<s> ... </s>``); ``aiayn evaluate`` scores the same output."""
    case = cases[family]
    texts = [TEXT[3], "", TEXT[1], TEXT[4]]
    src = _write(tmp_path / "src.txt", texts)
    out = tmp_path / "hyp.txt"
    assert main(["translate", "--checkpoint", str(case.ckpt), "-i", str(src), "-o", str(out), "--beam", "1"]) == 0
    got = out.read_text(encoding="utf-8").split("\n")[:-1]
    _, eos, _, _ = _ids(case)
    want = []
    for text in texts:
        ids = case.tok.encode(text)
        if not text.strip():
            want.append("")
            continue
        x = torch.tensor([ids])
        new = max_output_length(case.pre.model, len(ids), 1.0, 50) + 1
        row = _hf_generate(case, x, torch.ones_like(x, dtype=torch.bool), new, num_beams=1).sequences[0]
        want.append(case.tok.decode(_hf_tokens(row, eos), skip_special_tokens=True))
    assert got == want
    assert main(["translate", "--checkpoint", str(case.ckpt), "-i", str(src), "-o", str(out)]) == 0  # beam 4
    assert len(out.read_text(encoding="utf-8").split("\n")[:-1]) == len(texts)
    ref = _write(tmp_path / "ref.txt", [TEXT[2]] * len(texts))
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(case.ckpt), "--src", str(src), "--ref", str(ref), "--beam", "1",
                 "--hyp-out", str(tmp_path / "eval.txt")]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["sentences"] == len(texts) and result["sacrebleu"] >= 0.0
    assert (tmp_path / "eval.txt").read_text(encoding="utf-8").split("\n")[:-1] == want


def test_classify_and_evaluate_commands_read_a_converted_classifier(cases: dict[str, Case], tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    """``aiayn classify`` frames a text as BERT does ([CLS] text [SEP]) and names the class by ``id2label``."""
    case = cases["bert-classifier"]
    texts = TEXT[:7]
    with torch.no_grad():
        probs = torch.stack([case.ref(**case.tok(t, return_tensors="pt")).logits[0].softmax(-1) for t in texts])
    capsys.readouterr()
    assert main(["classify", "--checkpoint", str(case.ckpt), "-i", str(_write(tmp_path / "x.txt", texts))]) == 0
    lines = capsys.readouterr().out.strip().split("\n")
    best_p, best = probs.max(-1)
    assert [x.split("\t")[0] for x in lines] == [LABELS[int(k)] for k in best]
    torch.testing.assert_close(torch.tensor([float(x.split("\t")[1]) for x in lines]), best_p, atol=1e-4, rtol=0)
    gold = [i % 3 for i in range(len(texts))]
    data = _write(tmp_path / "dev.tsv", ["sentence\tlabel"] + [f"{t}\t{g}" for t, g in zip(texts, gold)])
    assert main(["evaluate", "--checkpoint", str(case.ckpt), "--data", str(data)]) == 0
    out = capsys.readouterr().out
    result = json.loads(out[out.index("{"):])
    assert result["examples"] == len(texts)
    assert result["accuracy"] == pytest.approx(sum(int(b) == g for b, g in zip(best, gold)) / len(texts))
    assert set(result["per_class"]) == set(LABELS.values())
