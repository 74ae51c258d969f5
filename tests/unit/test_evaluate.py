"""Evaluation metrics against hand-computed numbers and brute-force loops."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from aiayn.errors import AiaynError
from aiayn.evaluate import (
    accuracy,
    bits_per_character,
    confusion_matrix,
    corpus_bleu,
    corpus_chrf,
    format_confusion,
    perplexity,
    precision_recall_f1,
    sliding_window_nll,
    tokenized_lowercase_bleu,
)

# ------------------------------------------------------------------------------------------- BLEU

HYP = "the cat sat on the mat today"
REF = "the cat sat on a mat today"
# Clipped n-gram precisions 6/7, 4/6, 2/5, 1/4 and no brevity penalty (equal lengths).
HAND_BLEU = 100 * (6 / 7 * 4 / 6 * 2 / 5 * 1 / 4) ** 0.25


def test_bleu_matches_hand_computation() -> None:
    s = corpus_bleu([HYP], [REF])
    assert s.score == pytest.approx(HAND_BLEU, abs=1e-9)
    assert s.details["precisions"] == pytest.approx([600 / 7, 400 / 6, 40.0, 25.0])
    assert s.details["bp"] == 1.0 and s.details["sys_len"] == 7 and s.details["ref_len"] == 7
    assert "case:mixed" in s.signature and "tok:13a" in s.signature and "nrefs:1" in s.signature
    assert corpus_bleu([REF, HYP], [REF, REF]).score > s.score
    assert corpus_bleu([REF], [REF]).score == pytest.approx(100.0)


def test_brevity_penalty() -> None:
    s = corpus_bleu(["the cat sat on the mat"], ["the cat sat on the mat today"])
    assert s.details["bp"] == pytest.approx(math.exp(1 - 7 / 6))
    assert s.score == pytest.approx(100 * math.exp(1 - 7 / 6))


def test_case_and_tokenization_conventions() -> None:
    upper = HYP.upper()
    assert corpus_bleu([upper], [REF]).score == 0.0  # cased
    lc = tokenized_lowercase_bleu([upper], [REF])
    assert lc.score == pytest.approx(HAND_BLEU) and "case:lc" in lc.signature
    # 13a splits the full stop off, so "mat." matches "mat ."; tokenize="none" does not.
    assert tokenized_lowercase_bleu(
        ["a cat sat on the mat."], ["a cat sat on the mat ."]
    ).score == pytest.approx(100.0)
    none = tokenized_lowercase_bleu(["a cat sat on the mat."], ["a cat sat on the mat ."], tokenize="none")
    assert none.score < 100.0 and "tok:none" in none.signature
    with pytest.raises(AiaynError, match="unknown tokenizer"):
        tokenized_lowercase_bleu([HYP], [REF], tokenize="moses")


def test_chrf() -> None:
    same = corpus_chrf([HYP], [HYP])
    assert same.score == pytest.approx(100.0) and same.name.startswith("chrF")
    assert "nc:6" in same.signature and same.details["beta"] == 2
    assert corpus_chrf(["xyz"], ["abc"]).score == 0.0
    assert 0 < corpus_chrf([HYP], [REF]).score < 100


@pytest.mark.parametrize("metric", [corpus_bleu, tokenized_lowercase_bleu, corpus_chrf])
def test_mismatched_counts_name_both(metric) -> None:  # noqa: ANN001
    with pytest.raises(AiaynError, match="3 hypotheses but 2 references"):
        metric(["a", "b", "c"], ["a", "b"])
    with pytest.raises(AiaynError, match="no sentences"):
        metric([], [])


# --------------------------------------------------------------------------------------- LM metrics


def test_perplexity_and_bpc() -> None:
    assert perplexity(10 * math.log(5.0), 10) == pytest.approx(5.0)
    assert bits_per_character(8 * math.log(2.0), 8) == pytest.approx(1.0)
    assert bits_per_character(math.log(2.0), 4) == pytest.approx(0.25)
    with pytest.raises(AiaynError):
        perplexity(1.0, 0)
    with pytest.raises(AiaynError):
        bits_per_character(1.0, 0)


V = 11


class Bigram(torch.nn.Module):
    """Logits at position i depend only on token i: history beyond one token does not matter."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(V, 8)
        self.out = torch.nn.Linear(8, V)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (1, L) -> (1, L, V)
        return self.out(self.emb(x))


class CausalConv(torch.nn.Module):
    """Logits at position i depend on tokens i-k+1..i (zero-padded at the left)."""

    def __init__(self, k: int) -> None:
        super().__init__()
        self.k = k
        self.emb = torch.nn.Embedding(V, 8)
        self.conv = torch.nn.Conv1d(8, V, k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x).transpose(1, 2)  # (1, 8, L)
        return self.conv(F.pad(h, (self.k - 1, 0))).transpose(1, 2)  # (1, L, V)


class Positional(torch.nn.Module):
    """Logits depend on the token and its position inside the window (absolute positions)."""

    def __init__(self, context: int) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(V, 8)
        self.pos = torch.nn.Embedding(context, 8)
        self.out = torch.nn.Linear(8, V)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.emb(x) + self.pos(torch.arange(x.shape[1]))[None])


def full_history_nll(model: torch.nn.Module, ids: torch.Tensor) -> float:
    """Brute force: score every token t >= 1 given all of ids[:t]."""
    total = 0.0
    for t in range(1, ids.numel()):
        logits = model(ids[:t][None])[0, -1]
        total -= torch.log_softmax(logits.double(), -1)[ids[t]].item()
    return total


def hf_reference_nll(model: torch.nn.Module, ids: torch.Tensor, max_length: int, stride: int) -> float:
    """The loop of Hugging Face's 'Perplexity of fixed-length models' guide, with -100 labels."""
    seq_len, prev_end, total = ids.numel(), 0, 0.0
    for begin in range(0, seq_len, stride):
        end = min(begin + max_length, seq_len)
        trg_len = end - prev_end
        input_ids = ids[begin:end][None]
        target_ids = input_ids.clone()
        target_ids[:, :-trg_len] = -100
        logits = model(input_ids)
        total += F.cross_entropy(
            logits[0, :-1].double(), target_ids[0, 1:], ignore_index=-100, reduction="sum"
        ).item()
        prev_end = end
        if end == seq_len:
            break
    return total


def checked(model: torch.nn.Module, context: int):  # noqa: ANN201
    def fn(x: torch.Tensor) -> torch.Tensor:
        assert x.dim() == 2 and x.shape[0] == 1 and 1 <= x.shape[1] <= context
        return model(x)

    return fn


@pytest.mark.parametrize(
    ("n", "context", "stride"),
    [(40, 8, 3), (40, 8, 7), (40, 8, 1), (37, 10, 4), (5, 8, 3), (8, 8, 3), (2, 8, 3), (9, 8, 7)],
)
def test_each_token_scored_once_history_free_model(n: int, context: int, stride: int) -> None:
    torch.manual_seed(n + context + stride)
    model, ids = Bigram(), torch.randint(0, V, (n,))
    total, scored = sliding_window_nll(checked(model, context), ids, context, stride)
    assert scored == n - 1
    assert total == pytest.approx(full_history_nll(model, ids), rel=1e-6)


@pytest.mark.parametrize(("n", "context", "stride"), [(50, 12, 4), (50, 12, 8), (7, 12, 4), (30, 9, 1)])
def test_matches_full_history_when_receptive_field_fits(n: int, context: int, stride: int) -> None:
    k = 4  # needs context - stride >= k: each scored token sees k - 1 real tokens before it
    torch.manual_seed(n)
    model, ids = CausalConv(k), torch.randint(0, V, (n,))
    total, scored = sliding_window_nll(checked(model, context), ids, context, stride)
    assert scored == n - 1
    assert total == pytest.approx(full_history_nll(model, ids), rel=1e-6)


def test_too_large_stride_loses_history() -> None:
    """With context - stride < k some tokens see padding instead of their history: the result is
    no longer the full-history one (so the test above can fail)."""
    torch.manual_seed(0)
    model, ids = CausalConv(4), torch.randint(0, V, (50,))
    total, _ = sliding_window_nll(model, ids, context=12, stride=11)
    assert total != pytest.approx(full_history_nll(model, ids), rel=1e-6)


@pytest.mark.parametrize(("n", "context", "stride"), [(50, 12, 5), (50, 12, 11), (13, 12, 5), (6, 12, 5)])
def test_matches_hugging_face_loop_with_position_dependent_model(n: int, context: int, stride: int) -> None:
    torch.manual_seed(n * stride)
    model, ids = Positional(context), torch.randint(0, V, (n,))
    total, _ = sliding_window_nll(checked(model, context), ids, context, stride)
    assert total == pytest.approx(hf_reference_nll(model, ids, context, stride), rel=1e-6)


def test_sliding_window_edge_cases() -> None:
    model = Bigram()
    assert sliding_window_nll(model, torch.tensor([3]), 8, 4) == (0.0, 0)
    assert sliding_window_nll(model, torch.tensor([], dtype=torch.long), 8, 4) == (0.0, 0)
    for context, stride in [(8, 8), (8, 0), (1, 1)]:
        with pytest.raises(AiaynError, match="stride|context"):
            sliding_window_nll(model, torch.arange(5), context, stride)
    with pytest.raises(ValueError, match="1-D"):
        sliding_window_nll(model, torch.arange(6).view(2, 3), 8, 4)


# ---------------------------------------------------------------------------------- classification

Y_TRUE = ["a", "a", "a", "a", "b", "b", "c"]
Y_PRED = ["a", "a", "b", "c", "b", "b", "b"]


def test_accuracy() -> None:
    assert accuracy(Y_TRUE, Y_PRED) == pytest.approx(4 / 7)
    assert accuracy([1, 0], [1, 0]) == 1.0
    with pytest.raises(AiaynError, match="7 true labels but 6 predictions"):
        accuracy(Y_TRUE, Y_PRED[:6])
    with pytest.raises(AiaynError, match="no examples"):
        accuracy([], [])


def test_confusion_matrix_and_table() -> None:
    m = confusion_matrix(Y_TRUE, Y_PRED, ["a", "b", "c"])
    assert m == [[2, 1, 1], [0, 2, 0], [0, 1, 0]]
    assert format_confusion(m, ["a", "b", "c"]) == (
        "true \\ pred  a  b  c\n          a  2  1  1\n          b  0  2  0\n          c  0  1  0"
    )
    with pytest.raises(AiaynError, match=r"\['c'\] occur in the data"):
        confusion_matrix(Y_TRUE, Y_PRED, ["a", "b"])


def test_precision_recall_f1_by_hand() -> None:
    r = precision_recall_f1(Y_TRUE, Y_PRED, ["a", "b", "c", "d"])
    a, b, c, d = (r.per_class[k] for k in "abcd")
    assert (a.precision, a.recall, a.f1, a.support) == pytest.approx((1.0, 0.5, 2 / 3, 4))
    assert (b.precision, b.recall, b.f1, b.support) == pytest.approx((0.5, 1.0, 2 / 3, 2))
    assert (c.precision, c.recall, c.f1, c.support) == (0.0, 0.0, 0.0, 1)
    assert (d.precision, d.recall, d.f1, d.support) == (0.0, 0.0, 0.0, 0)  # absent class: 0, no error
    assert r.macro.precision == pytest.approx(1.5 / 4)
    assert r.macro.recall == pytest.approx(1.5 / 4)
    assert r.macro.f1 == pytest.approx((4 / 3) / 4)
    assert r.macro.support == 7
