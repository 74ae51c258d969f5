"""BLEU as *Attention Is All You Need* reports it on WMT 2014: tokenized, cased, and for English -> German with
compound splitting, as tensor2tensor's ``get_ende_bleu.sh`` computes it (the Moses tokenizer, then
``perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'``, then ``multi-bleu.perl``).

Here the tokenizer is sacrebleu's ``13a`` (the mteval-v13a rules WMT scores with) standing in for Moses'
``tokenizer.perl``; the compound rule is the script's, applied to both sides; the n-gram counts are sacrebleu's on
the tokens as they stand (``tokenize="none"``), which is what ``multi-bleu.perl`` counts. The figure is not
comparable to sacreBLEU's, which is reported beside it with its signature (:func:`paper_and_sacrebleu`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from sacrebleu.metrics import BLEU
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

from aiayn.evaluate.bleu import Score, bleu_score, corpus_bleu

_COMPOUND = re.compile(r"(\S)-(\S)")
_TOKENIZE = Tokenizer13a()


def split_compounds(line: str) -> str:
    """``Zwei-Staaten`` -> ``Zwei ##AT##-##AT## Staaten``: the rule of tensor2tensor's ``get_ende_bleu.sh``, matches
    not overlapping as in Perl (``a-b-c`` -> ``a ##AT##-##AT## b-c``)."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def paper_tokens(line: str, compound_split: bool) -> str:
    """One sentence as the paper's scorer sees it: 13a-tokenized, compounds split when ``compound_split``."""
    tokens = _TOKENIZE(line.strip())
    return split_compounds(tokens) if compound_split else tokens


def paper_bleu(hyps: Sequence[str], refs: Sequence[str], compound_split: bool) -> Score:
    """Tokenized cased BLEU of detokenized ``hyps`` against ``refs`` (one each), compound-split for En -> De.

    Returns:
        A :class:`~aiayn.evaluate.bleu.Score` whose signature names the tokenization and the splitting before
        sacrebleu's own signature of the counting.

    Raises:
        AiaynError: the counts differ, or there is nothing to score.
    """
    tok_hyps = [paper_tokens(h, compound_split) for h in hyps]
    tok_refs = [paper_tokens(r, compound_split) for r in refs]
    metric = BLEU(tokenize="none", force=True)  # force: the text is tokenized on purpose
    score = bleu_score(tok_hyps, tok_refs, metric, "paper_bleu")
    pre = f"pre:13a{'+compound-split' if compound_split else ''}"
    return Score(score.name, score.score, f"{pre}|{score.signature}", score.details)


def paper_and_sacrebleu(hyps: Sequence[str], refs: Sequence[str], target_language: str) -> dict[str, object]:
    """The paper's tokenized BLEU (compound-split when the target is German, ``"de"``) and sacreBLEU, each with
    its signature, as ``aiayn evaluate`` prints them."""
    tokenized = paper_bleu(hyps, refs, compound_split=target_language == "de")
    sacre = corpus_bleu(hyps, refs)
    return {"paper_bleu": round(tokenized.score, 2), "paper_bleu_signature": tokenized.signature,
            "sacrebleu": round(sacre.score, 2), "sacrebleu_signature": sacre.signature}
