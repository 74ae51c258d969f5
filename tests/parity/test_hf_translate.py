"""``aiayn translate`` on converted T5, BART and Marian checkpoints prints what transformers' ``generate`` prints for
the same texts, each tokenized by transformers with its model's own framing (T5 and Marian ``... </s>``, BART ``<s>
... </s>``).

Three models that need more than the plain ids of a text:

* T5 v1.0 whose output layer has more rows than its tokenizer has tokens (t5-small: 32128 rows, 32100 tokens), the
  rows past the vocabulary made the best tokens wherever EOS scores well: aiayn never outputs those ids, so it
  compares with transformers told to suppress them;
* BART with ``forced_bos_token_id`` (bart-large-cnn, mBART-like models: every output begins with ``<s>``), which the
  converter writes into the checkpoint as ``decode.forced_bos_id``;
* Marian, whose texts end with ``</s>``.

Both searches are held to the settings under which they are the same (see test_hf_convert_seq2seq.py): greedy, and
four beams with aiayn's ``alpha=0`` against transformers' ``length_penalty=0.0`` and ``early_stopping=False``, EOS
forced after aiayn's output budget, pad and BOS never produced.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
from test_hf_convert_seq2seq import TEXT, _hf_load, _save, _write  # noqa: E402

from aiayn.cli.main import main  # noqa: E402
from aiayn.generate.translate import (  # noqa: E402
    max_output_length,
    source_ids,  # noqa: E402
    translate,
)
from aiayn.hf import from_hf  # noqa: E402
from aiayn.pretrained import Pretrained, load_pretrained  # noqa: E402

FAMILIES = ("t5-padded", "bart-forced-bos", "marian")
TEXTS = [*TEXT[:7], "", "a", TEXT[0] + " " + TEXT[2]]


@dataclass
class Case:
    """transformers' model and tokenizer, the converted checkpoint and that checkpoint loaded."""

    ref: Any
    tok: Any
    ckpt: Path
    pre: Pretrained


def _pad_rows_win(folder: Path) -> None:
    """T5 v1.0 (output layer tied to the embedding) with its rows past the tokenizer's vocabulary set to 1.2 times
    EOS's row: wherever EOS scores above zero, a padded id scores higher."""
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = transformers.T5ForConditionalGeneration.from_pretrained(str(folder))
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        assert emb.shape[0] > len(tok)
        emb[len(tok):] = 1.2 * emb[tok.eos_token_id]
    model.save_pretrained(folder)


def _force_bos(folder: Path) -> None:
    """BART whose config (and generation config) force ``<s>`` as the first output token."""
    for name in ("config.json", "generation_config.json"):
        path = folder / name
        if path.exists():
            config = json.loads(path.read_text())
            config["forced_bos_token_id"] = 0
            path.write_text(json.dumps(config))


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Case]:
    out = {}
    for family, base, change in (("t5-padded", "t5-v1.0", _pad_rows_win), ("bart-forced-bos", "bart", _force_bos),
                                 ("marian", "marian", None)):
        root = tmp_path_factory.mktemp(family)
        _save(base, root / "hf")
        if change is not None:
            change(root / "hf")
        ckpt = from_hf(root / "hf", root / "aiayn")
        out[family] = Case(_hf_load(root / "hf", base), transformers.AutoTokenizer.from_pretrained(str(root / "hf")),
                           ckpt, load_pretrained(ckpt, accel="none"))
    return out


def _reference(case: Case, texts: list[str], beams: int, n: int = 1) -> tuple[list[str], list[bool]]:
    """transformers' translations, one text at a time (no padding), with aiayn's output budget for the text's length
    and the ids aiayn never outputs suppressed: pad, BOS, and the output rows past the tokenizer's vocabulary. The
    model's own ``forced_bos_token_id`` applies (its forced token counts in ``max_new_tokens``). Returns the texts
    (the ``n`` best of each joined by `` ||| ``, as ``aiayn translate --n-best`` prints them) and, for each, whether
    one of its outputs was cut at the length limit (EOS forced)."""
    tok, config = case.tok, case.ref.config
    eos, pad, bos = tok.eos_token_id, tok.pad_token_id, tok.bos_token_id
    banned = [pad, *([bos] if bos is not None and bos != eos else []), *range(len(tok), config.vocab_size)]
    forced = case.ref.generation_config.forced_bos_token_id
    out, cut = [], []
    for text in texts:
        if not text.strip():
            out.append("")
            cut.append(False)
            continue
        limit = case.pre.config.max_len
        enc = tok(text, return_tensors="pt", truncation=True, max_length=limit)  # the model's own framing
        budget = max_output_length(case.pre.model, enc.input_ids.shape[1], 1.0, 50)
        if forced is not None and case.pre.config.position in ("learned", "sinusoidal"):
            budget = min(budget, limit - 2)  # the forced token takes one of the decoder's positions
        new = budget + 1 + (forced is not None)
        with torch.no_grad():  # bad_words_ids comes before the forced BOS (suppress_tokens would undo it)
            seq = case.ref.generate(**enc, do_sample=False, num_beams=beams, max_new_tokens=new,
                                    forced_eos_token_id=eos, bad_words_ids=[[i] for i in banned],
                                    length_penalty=0.0, early_stopping=False, num_return_sequences=n)
        assert forced is None or bool((seq[:, 1] == forced).all())
        out.append(" ||| ".join(tok.decode(row, skip_special_tokens=True) for row in seq))
        cut.append(any(eos not in row[1:-1].tolist() for row in seq))
    return out, cut


def _at_limit(case: Case, text: str) -> bool:
    """Whether one of aiayn's four-beam hypotheses for ``text`` is cut at its length limit."""
    tgt = case.pre.tokenizers["tgt"]
    forced = case.pre.meta["decode"].get("forced_bos_id")
    src = torch.tensor([source_ids(case.pre.tokenizers["src"], text, case.pre.config.max_len)])
    hyp = translate(case.pre.model, src, beam_size=4, alpha=0.0, bos_id=tgt.bos_id, eos_id=tgt.eos_id,
                    pad_id=tgt.pad_id, start_id=tgt.decoder_start_id, vocab_size=tgt.vocab_size,
                    n_best=4, forced_first_id=forced)[0]
    budget = max_output_length(case.pre.model, src.shape[1], 1.0, 50)
    if forced is not None and case.pre.config.position in ("learned", "sinusoidal"):
        budget = min(budget, case.pre.config.max_len - 2)
    return any(len(h.tokens) == budget for h in hyp)


def _translate(case: Case, tmp_path: Path, *options: str) -> list[str]:
    src, out = _write(tmp_path / "src.txt", TEXTS), tmp_path / "hyp.txt"
    assert main(["translate", "--checkpoint", str(case.ckpt), "-i", str(src), "-o", str(out), *options]) == 0
    return out.read_text(encoding="utf-8").split("\n")[:-1]


def test_the_checkpoints_say_what_decoding_needs(cases: dict[str, Case]) -> None:
    t5 = cases["t5-padded"]
    assert t5.pre.config.target_vocab_size > t5.pre.tokenizers["tgt"].vocab_size == len(t5.tok)
    assert cases["bart-forced-bos"].pre.meta["decode"]["forced_bos_id"] == 0
    assert "forced_bos_id" not in cases["marian"].pre.meta["decode"]


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_translate_prints_what_generate_gives_for_the_texts(family: str, cases: dict[str, Case],
                                                                   tmp_path: Path) -> None:
    case = cases[family]
    assert _translate(case, tmp_path, "--beam", "1") == _reference(case, TEXTS, beams=1)[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_beam_translate_prints_what_generate_gives_for_the_texts(family: str, cases: dict[str, Case],
                                                                 tmp_path: Path) -> None:
    """The four best of four beams for each text, in order. Where a hypothesis is cut at the length limit the two
    may rank differently by design (aiayn scores the forced EOS, transformers does not: see
    test_hf_convert_seq2seq.py); every other text gets the same four."""
    case = cases[family]
    got = _translate(case, tmp_path, "--beam", "4", "--alpha", "0", "--n-best", "4")
    want, cut = _reference(case, TEXTS, beams=4, n=4)
    differ = [i for i, (a, b) in enumerate(zip(got, want)) if a != b]
    assert len(got) == len(want) and len(differ) <= len(got) // 2, differ
    for i in differ:
        assert cut[i] or _at_limit(case, TEXTS[i]), (i, got[i], want[i])


def test_padded_output_rows_would_win_without_the_ban(cases: dict[str, Case]) -> None:
    """The T5 case tests the ban: transformers left alone outputs ids its tokenizer does not have."""
    case = cases["t5-padded"]
    enc = case.tok(TEXTS[:7], return_tensors="pt", padding=True)
    with torch.no_grad():
        seq = case.ref.generate(**enc, do_sample=False, num_beams=1, max_new_tokens=20)
    assert bool((seq >= len(case.tok)).any())


@pytest.mark.parametrize("family", FAMILIES)
def test_long_sources_keep_their_framing_when_cut(family: str, cases: dict[str, Case]) -> None:
    """A source cut to the model's limit keeps its framing tokens, as transformers' truncation does."""
    case = cases[family]
    text = " ".join(TEXT[:7])
    for limit in (3, 8, 20):
        assert source_ids(case.pre.tokenizers["src"], text, limit) == \
            case.tok(text, truncation=True, max_length=limit).input_ids
    assert source_ids(case.pre.tokenizers["src"], text) == case.tok(text).input_ids



def test_the_length_limit_counts_the_framing(cases: dict[str, Case], tmp_path: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    """A source of exactly the model's limit of text tokens is one token too long once ``</s>`` ends it."""
    case = cases["marian"]
    tok, limit = case.pre.tokenizers["src"], case.pre.config.max_len
    words = ["a"]
    while len(tok.encode(" ".join(words))) < limit:
        words.append("a")
    text = " ".join(words)
    assert len(tok.encode(text)) == limit and len(source_ids(tok, text)) == limit + 1
    capsys.readouterr()
    src, out = _write(tmp_path / "long.txt", [text]), tmp_path / "hyp.txt"
    assert main(["translate", "--checkpoint", str(case.ckpt), "-i", str(src), "-o", str(out), "--beam", "1"]) == 0
    assert f"{limit + 1} tokens, more than the model's limit of {limit} tokens" in capsys.readouterr().err
