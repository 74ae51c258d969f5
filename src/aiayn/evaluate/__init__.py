"""Evaluation metrics: BLEU/chrF (sacrebleu), perplexity and bits per character, classification."""

from __future__ import annotations

from aiayn.evaluate.bleu import Score, corpus_bleu, corpus_chrf, tokenized_lowercase_bleu
from aiayn.evaluate.classification import (
    PRF,
    ClassificationReport,
    accuracy,
    confusion_matrix,
    format_confusion,
    precision_recall_f1,
)
from aiayn.evaluate.lm import bits_per_character, perplexity, sliding_window_nll

__all__ = [
    "PRF",
    "ClassificationReport",
    "Score",
    "accuracy",
    "bits_per_character",
    "confusion_matrix",
    "corpus_bleu",
    "corpus_chrf",
    "format_confusion",
    "perplexity",
    "precision_recall_f1",
    "sliding_window_nll",
    "tokenized_lowercase_bleu",
]
