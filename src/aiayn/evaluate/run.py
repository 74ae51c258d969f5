"""Scoring a loaded checkpoint on a file: language models (perplexity, bits per character) and
classifiers (accuracy, precision/recall/F1, confusion matrix). ``aiayn evaluate`` calls these."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from aiayn.data.classification import load_labeled_text
from aiayn.data.lm import load_text_corpus
from aiayn.errors import AiaynError
from aiayn.evaluate.classification import accuracy, confusion_matrix, format_confusion, precision_recall_f1
from aiayn.evaluate.lm import bits_per_character, perplexity, sliding_window_nll, window_plan
from aiayn.evaluate.predict import display_labels, predict_proba
from aiayn.pretrained import Pretrained
from aiayn.tokenize.text_codec import codec_from_meta

LOGITS_BYTES = 1 << 30  # the most float32 logits one batch of language-model windows may hold


def evaluate_lm(pretrained: Pretrained, path: str | Path, context: int | None = None,
                stride: int | None = None, batch_size: int = 64, progress: bool = False) -> dict[str, Any]:
    """Perplexity and bits per character of a language model on a text file (or a folder of ``*.txt``).

    The text is tokenized as in training and scored with strided sliding windows
    (:func:`~aiayn.evaluate.lm.sliding_window_nll`), each document separately. The first token of a
    document has no history and is not scored; bits per character count the characters of the scored
    tokens only (all but the first token's), so the numbers compare across tokenizers.

    Args:
        pretrained: a loaded ``lm`` checkpoint.
        path: the evaluation text.
        context: window length in tokens (default: the training block size).
        stride: window step (default: ``context // 2``).
        batch_size: windows per forward pass; fewer when the batch's (B, context, V) logits would pass
            :data:`LOGITS_BYTES` (the result is the same for every batch size, up to float rounding).
        progress: show a progress bar over the windows on stderr.

    Returns:
        ``{"loss", "perplexity", "bits_per_char", "tokens", "chars", "context", "stride"}``: loss is the
        mean NLL per token in nats.
    """
    if pretrained.task != "lm":
        raise AiaynError(f"a {pretrained.task!r} checkpoint; perplexity needs a language model (task lm)")
    model = pretrained.model
    limit = model.config.max_len
    context = context or min(pretrained.meta.get("block_size") or limit, limit)
    stride = stride or max(context // 2, 1)
    if context > limit:
        raise AiaynError(f"context={context} exceeds the model's max_len={limit}; lower --context")
    if not 1 <= stride < context:
        raise AiaynError(f"stride={stride} with context={context}: the windows' step must be at least 1 and below "
                         f"the context; lower --stride (--stride {context - 1} gives windows that do not overlap)"
                         if context >= 2 else f"context={context}: a window needs at least 2 tokens; raise --context")
    codec = codec_from_meta(pretrained.tokenizers["text"], pretrained.meta)
    corpus = load_text_corpus(path)
    docs = [corpus] if isinstance(corpus, str) else corpus
    if batch_size < 1:
        raise AiaynError(f"batch_size={batch_size}; give at least 1 window per forward pass (--batch-size)")
    device = next(model.parameters()).device
    model.eval()
    vocab = model.config.target_vocab_size
    batch_size = max(1, min(batch_size, LOGITS_BYTES // (4 * context * vocab)))

    def logits_fn(x: torch.Tensor) -> torch.Tensor:
        return model(x.to(device)).logits.float()  # (B, L, V)

    encoded = [torch.tensor(codec.encode(doc), dtype=torch.long) for doc in docs]
    windows = sum(len(window_plan(ids.numel(), context, stride)) for ids in encoded)
    total, n_tokens, n_chars = 0.0, 0, 0
    with tqdm(total=windows, disable=not progress, unit="window", dynamic_ncols=True, leave=False,
              desc="perplexity") as bar:
        for doc, ids in zip(docs, encoded):
            if ids.numel() < 2:
                continue
            nll, n = sliding_window_nll(logits_fn, ids, context, stride, batch_size=batch_size,
                                        progress=bar.update)
            total, n_tokens = total + nll, n_tokens + n
            n_chars += max(len(doc) - len(codec.decode(ids[:1].tolist())), 1)
    if n_tokens == 0:
        raise AiaynError(f"{path}: fewer than 2 tokens to score; give a longer evaluation text")
    return {"loss": total / n_tokens, "perplexity": perplexity(total, n_tokens),
            "bits_per_char": bits_per_character(total, n_chars), "tokens": n_tokens, "chars": n_chars,
            "context": context, "stride": stride}


def evaluate_classifier(pretrained: Pretrained, path: str | Path, batch_size: int = 128) -> dict[str, Any]:
    """Accuracy, per-class and macro precision/recall/F1 and the confusion matrix on a labeled file.

    Args:
        pretrained: a loaded ``classification`` checkpoint.
        path: a labeled ``.tsv``/``.csv`` file with the training file's labels (e.g. SST-2's dev.tsv).
        batch_size: examples per forward pass.

    Returns:
        ``{"accuracy", "macro_precision", "macro_recall", "macro_f1", "per_class": {label: {precision,
        recall, f1, support}}, "confusion": [[...]], "confusion_text": str, "examples", "loss"}``; labels are
        shown by their names when the checkpoint has them (``label_names``).
    """
    if pretrained.task != "classification" or "labels" not in pretrained.meta:
        raise AiaynError(f"a {pretrained.task!r} checkpoint; this evaluation needs a classification model")
    labels = list(pretrained.meta["labels"])
    data = load_labeled_text(path, label_names=labels)
    max_len = pretrained.meta.get("max_len", pretrained.config.max_len)
    probs = predict_proba(pretrained.model, pretrained.tokenizers["text"], data.texts, max_len, batch_size)
    return classification_report(pretrained, probs, data.labels)


def classification_report(pretrained: Pretrained, probs: torch.Tensor, gold: list[int]) -> dict[str, Any]:
    """The keys of :func:`evaluate_classifier` from a classifier's probabilities (N, C) and the gold class ids (N,)
    (an index into the checkpoint's ``labels``)."""
    labels = list(pretrained.meta["labels"])
    pred = probs.argmax(-1).tolist()
    report = precision_recall_f1(gold, pred, list(range(len(labels))))
    matrix = confusion_matrix(gold, pred, list(range(len(labels))))
    p_gold = probs[torch.arange(len(gold)), torch.tensor(gold)].clamp_min(1e-12)
    shown = display_labels(pretrained.meta)  # the labels' names when the checkpoint has them
    return {
        "accuracy": accuracy(gold, pred),
        "macro_precision": report.macro.precision,
        "macro_recall": report.macro.recall,
        "macro_f1": report.macro.f1,
        "per_class": {shown[k]: {"precision": v.precision, "recall": v.recall, "f1": v.f1,
                                 "support": v.support} for k, v in report.per_class.items()},
        "confusion": matrix, "confusion_text": format_confusion(matrix, shown),
        "examples": len(gold), "loss": float(-p_gold.log().mean()) if len(gold) else math.nan,
    }
