"""The paper's tokenized BLEU: tensor2tensor's compound rule, 13a tokens, the counts on those tokens, and sacreBLEU
beside it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from sacrebleu.metrics import BLEU

from aiayn.checkpoint import save_checkpoint
from aiayn.cli.main import main
from aiayn.config import ModelConfig
from aiayn.errors import AiaynError
from aiayn.evaluate.paper_bleu import paper_and_sacrebleu, paper_bleu, paper_tokens, split_compounds
from aiayn.models.build import build_model
from aiayn.tokenize import WordTokenizer

HYPS = ["Die Zwei-Staaten-Lösung ist nicht tot, sagte er.", "Das Haus ist sehr groß."]
REFS = ["Die Zwei-Staaten-Lösung ist tot, sagte er.", "Das Haus ist groß."]


@pytest.mark.parametrize(("line", "split"), [
    ("Zwei-Staaten-Lösung", "Zwei ##AT##-##AT## Staaten ##AT##-##AT## Lösung"),
    ("a-b-c", "a ##AT##-##AT## b-c"),  # Perl's s///g does not overlap its matches: the middle letter is taken
    ("ein - Strich", "ein - Strich"),  # a free-standing dash is no compound
    ("-5 und 5-", "-5 und 5-"),
])
def test_compound_splitting_is_the_rule_of_get_ende_bleu(line: str, split: str) -> None:
    assert split_compounds(line) == split


def test_a_sentence_is_tokenized_then_split() -> None:
    assert paper_tokens(HYPS[0], compound_split=True) == \
        "Die Zwei ##AT##-##AT## Staaten ##AT##-##AT## Lösung ist nicht tot , sagte er ."
    assert paper_tokens(HYPS[0], compound_split=False) == "Die Zwei-Staaten-Lösung ist nicht tot , sagte er ."


def test_the_score_counts_the_split_tokens() -> None:
    """The same as sacrebleu counting hand-split text as it stands, and higher than without the split here (the
    compound's parts match n-grams the whole word cannot)."""
    by_hand = ["Die Zwei ##AT##-##AT## Staaten ##AT##-##AT## Lösung ist nicht tot , sagte er .",
               "Das Haus ist sehr groß ."]
    refs = ["Die Zwei ##AT##-##AT## Staaten ##AT##-##AT## Lösung ist tot , sagte er .", "Das Haus ist groß ."]
    expected = BLEU(tokenize="none", force=True).corpus_score(by_hand, [refs]).score
    split = paper_bleu(HYPS, REFS, compound_split=True)
    assert split.score == pytest.approx(expected, abs=1e-9)
    assert split.score == pytest.approx(65.98, abs=0.01)
    assert paper_bleu(HYPS, REFS, compound_split=False).score == pytest.approx(49.62, abs=0.01)
    assert split.signature.startswith("pre:13a+compound-split|") and "tok:none" in split.signature


def test_identical_output_scores_100_and_sacrebleu_comes_with_its_signature() -> None:
    assert paper_bleu(REFS, REFS, compound_split=True).score == pytest.approx(100.0)
    both = paper_and_sacrebleu(HYPS, REFS, "de")
    assert both["paper_bleu"] == pytest.approx(65.98, abs=0.01)
    assert both["sacrebleu"] == pytest.approx(49.62, abs=0.01)
    assert "tok:13a" in both["sacrebleu_signature"]
    assert paper_and_sacrebleu(HYPS, REFS, "fr")["paper_bleu_signature"].startswith("pre:13a|")


def test_unaligned_files_are_refused() -> None:
    with pytest.raises(AiaynError, match="2 hypotheses but 1 references"):
        paper_bleu(HYPS, REFS[:1], compound_split=True)


def test_evaluate_prints_the_papers_bleu_of_its_own_translations(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``aiayn evaluate --paper-bleu de`` scores the translations it writes as :func:`paper_bleu` does."""
    tok = WordTokenizer("the a cat dog sees runs big-house small tree".split())
    torch.manual_seed(0)
    model = build_model(ModelConfig.preset("tiny", vocab_size=tok.vocab_size, max_len=16))
    ckpt = save_checkpoint(tmp_path / "mt", model, {"task": "translation", "model": model.config.to_dict(),
                                                   "tokenizers": {"src": "tokenizer.json", "tgt": "tokenizer.json"}},
                           tokenizer_writer=lambda d: tok.save(d / "tokenizer.json"))
    src, ref, hyp = tmp_path / "src.txt", tmp_path / "ref.txt", tmp_path / "hyp.txt"
    src.write_text("the cat sees a dog\nthe big-house runs\n")
    ref.write_text("the cat sees the big-house\na small tree runs\n")
    assert main(["evaluate", "--checkpoint", str(ckpt), "--src", str(src), "--ref", str(ref), "--hyp-out", str(hyp),
                 "--paper-bleu", "de"]) == 0
    printed = json.loads(capsys.readouterr().out)
    hyps, refs = hyp.read_text().splitlines(), ref.read_text().splitlines()
    assert printed["paper_bleu"] == round(paper_bleu(hyps, refs, compound_split=True).score, 2)
    assert printed["paper_bleu_signature"].startswith("pre:13a+compound-split|")
    assert "tok:13a" in printed["sacrebleu_signature"]
