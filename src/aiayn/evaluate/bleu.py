"""BLEU and chrF through sacrebleu, each score with the signature that makes it reproducible.

Two BLEU conventions are in use, and they give different numbers for the same output:

* :func:`corpus_bleu` is the standard one (Post, 2018): **detokenized**, cased text goes in and
  sacrebleu applies its own ``13a`` tokenizer (the one of mteval-v13a.pl, WMT's official scorer).
  Report this one.
* :func:`tokenized_lowercase_bleu` is the convention of many Multi30k papers: ``multi-bleu.perl
  -lc`` on tokenized, lower-cased text. Here: ``lowercase=True`` and, by default, sacrebleu's
  ``13a`` tokenizer, which on detokenized text approximates the Moses tokenizer those papers ran
  first. If the text is *already* tokenized (space-separated tokens, e.g. straight from a word-level
  model), pass ``tokenize="none"`` to reproduce ``multi-bleu.perl -lc`` exactly.

Note that the *Attention Is All You Need* WMT numbers are tokenized, **cased** BLEU with compound
splitting, comparable to neither convention.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sacrebleu.metrics import BLEU, CHRF

from aiayn.errors import AiaynError

_TOKENIZERS = ("13a", "intl", "none", "char", "zh")  # those that need no extra package


@dataclass(frozen=True)
class Score:
    """A corpus-level score.

    Attributes:
        name: "BLEU" or "chrF2".
        score: the score, 0-100.
        signature: sacrebleu's signature string (references, case, tokenizer, version, ...).
        details: metric-specific parts: for BLEU ``precisions`` (1- to 4-gram, %), ``bp`` (brevity
            penalty), ``ratio``, ``sys_len``, ``ref_len``, ``counts``, ``totals``; for chrF
            ``char_order``, ``word_order``, ``beta``.
    """

    name: str
    score: float
    signature: str
    details: dict[str, object] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.name} = {self.score:.2f} ({self.signature})"


def _check(hyps: Sequence[str], refs: Sequence[str], metric: str) -> None:
    if isinstance(hyps, str) or isinstance(refs, str):
        raise AiaynError(f"{metric}: pass lists of sentences, not a single string")
    if len(hyps) != len(refs):
        raise AiaynError(
            f"{metric}: got {len(hyps)} hypotheses but {len(refs)} references; the two files must "
            "have one sentence per line, line for line"
        )
    if not hyps:
        raise AiaynError(f"{metric}: got no sentences to score; check that the test set is not empty")


def bleu_score(hyps: Sequence[str], refs: Sequence[str], metric: BLEU, name: str) -> Score:
    """Corpus BLEU of ``hyps`` against ``refs`` (one reference each) as sacrebleu's ``metric`` counts it, with its
    signature; ``name`` names the caller in errors.

    Raises:
        AiaynError: if the counts differ or there is nothing to score.
    """
    _check(hyps, refs, name)
    s = metric.corpus_score(list(hyps), [list(refs)])
    details: dict[str, object] = {
        "precisions": list(s.precisions),
        "bp": s.bp,
        "ratio": s.ratio,
        "sys_len": s.sys_len,
        "ref_len": s.ref_len,
        "counts": list(s.counts),
        "totals": list(s.totals),
    }
    return Score("BLEU", float(s.score), str(metric.get_signature()), details)


def corpus_bleu(hyps: Sequence[str], refs: Sequence[str]) -> Score:
    """Standard sacreBLEU: cased, ``13a``-tokenized by sacrebleu, on detokenized text.

    Args:
        hyps: system outputs, one detokenized sentence each.
        refs: one reference per hypothesis, detokenized.

    Raises:
        AiaynError: if the counts differ or there is nothing to score.
    """
    return bleu_score(hyps, refs, BLEU(), "corpus_bleu")


def tokenized_lowercase_bleu(hyps: Sequence[str], refs: Sequence[str], tokenize: str = "13a") -> Score:
    """Lower-cased BLEU on tokenized text, the ``multi-bleu.perl -lc`` convention (see the module
    note).

    Args:
        hyps: system outputs, one sentence each.
        refs: one reference per hypothesis.
        tokenize: sacrebleu tokenizer: ``"13a"`` (default) for detokenized text, ``"none"`` for
            text that is already space-tokenized, or any other sacrebleu tokenizer (``"intl"``).

    Raises:
        AiaynError: if the counts differ or there is nothing to score.
    """
    if tokenize not in _TOKENIZERS:
        raise AiaynError(
            f"tokenized_lowercase_bleu: unknown tokenizer {tokenize!r}; use one of {', '.join(_TOKENIZERS)}"
        )
    return bleu_score(hyps, refs, BLEU(lowercase=True, tokenize=tokenize), "tokenized_lowercase_bleu")


def corpus_chrf(hyps: Sequence[str], refs: Sequence[str]) -> Score:
    """chrF2 (character 6-grams, beta = 2) on detokenized text.

    Raises:
        AiaynError: if the counts differ or there is nothing to score.
    """
    _check(hyps, refs, "corpus_chrf")
    metric = CHRF()
    s = metric.corpus_score(list(hyps), [list(refs)])
    details: dict[str, object] = {
        "char_order": metric.char_order,
        "word_order": metric.word_order,
        "beta": metric.beta,
    }
    return Score(s.name, float(s.score), str(metric.get_signature()), details)
