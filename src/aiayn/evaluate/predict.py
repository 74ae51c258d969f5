"""A text classifier's predictions: its inputs (``[BOS] tokens [EOS]``), its class probabilities, and how a
checkpoint's classes are shown. Evaluation (:func:`aiayn.evaluate.run.evaluate_classifier`), the classification
task's validation and ``aiayn classify`` share them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from aiayn.data.classification import collate_classification
from aiayn.tokenize import Tokenizer


def display_labels(meta: dict[str, Any]) -> list[str]:
    """How a classification checkpoint's classes are shown: ``label_names`` from its ``config.json`` (the
    recipe's ``[data] label_names``), else the labels as the training file writes them (``labels``)."""
    return list(meta.get("label_names") or meta["labels"])


def encode_for_classifier(tok: Tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text followed by EOS (the collator prepends BOS, the CLS token, and cuts to
    ``max_len``): ``[BOS] tokens [EOS]``, as in masked-LM pretraining."""
    return [ids + [tok.eos_id] for ids in tok.encode_batch(list(texts))]


@torch.no_grad()
def predict_proba(model: torch.nn.Module, tok: Tokenizer, texts: Sequence[str], max_len: int,
                  batch_size: int = 128) -> torch.Tensor:
    """Class probabilities (N, C) of texts, in their order, from an encoder with a classification head."""
    model.eval()
    device = next(model.parameters()).device
    ids = encode_for_classifier(tok, texts)
    out = []
    for i in range(0, len(ids), batch_size):
        chunk = ids[i:i + batch_size]
        b = collate_classification(chunk, [0] * len(chunk), tok.pad_id, max_len, cls_id=tok.bos_id)
        logits = model(b.input_ids.to(device), b.attention_mask.to(device), task="classify").logits  # (b, C)
        out.append(logits.float().softmax(-1).cpu())
    return torch.cat(out) if out else torch.zeros(0, model.config.n_classes)
