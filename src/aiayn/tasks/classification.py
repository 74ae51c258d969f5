"""Sequence classification (e.g. SST-2 sentiment): labeled TSV/CSV -> BPE -> ``[BOS] tokens [EOS]`` ->
encoder-only model -> CLS or mean pooling -> class logits, trained from scratch or from a masked-LM
checkpoint (``[model] init_from = "runs/sst2-mlm/best"``), validated by accuracy.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from aiayn.data.classification import LabeledData, collate_classification, load_labeled_text
from aiayn.errors import AiaynError
from aiayn.evaluate.classification import accuracy, precision_recall_f1
from aiayn.evaluate.predict import encode_for_classifier, predict_proba
from aiayn.models.losses import label_smoothed_nll
from aiayn.tasks.mlm import (
    TOKENIZER_DEFAULTS,
    TOKENIZER_FILE,
    build_encoder,
    epoch_batches,
    split_off,
)
from aiayn.train.recipe import resolve_path, take

DATA_DEFAULTS: dict[str, Any] = {
    "train": None, "valid": None, "val_fraction": 0.1, "text_column": None, "label_column": None,
    "max_len": 128, "batch_size": 32, "batch_tokens": None, "eval_batch_size": 128, "label_names": None,
}


def name_labels(labels: Sequence[str], names: Any, where: str) -> list[str] | None:
    """Names for the training file's labels from a recipe's ``[data] label_names`` table.

    Args:
        labels: the labels as the training file writes them, in class-id order (e.g. SST-2's ``["0", "1"]``).
        names: the table, each label of the file to its name (e.g. ``{"0" = "negative", "1" = "positive"}``;
            TOML gives its keys as strings), or None.
        where: the recipe, for messages.

    Returns:
        One name per label, in class-id order; None when ``names`` is None.

    Raises:
        AiaynError: ``names`` is not a table of non-empty, distinct strings covering exactly the file's labels.
    """
    if names is None:
        return None
    example = ", ".join(f'"{x}" = "..."' for x in labels)
    if not isinstance(names, dict):
        raise AiaynError(f"{where}: [data] label_names must be a table from each label of the training file to "
                         f"its name, e.g. label_names = {{ {example} }}")
    keys = {str(k): v for k, v in names.items()}
    missing, extra = [x for x in labels if x not in keys], [k for k in keys if k not in labels]
    if missing or extra:
        raise AiaynError(f"{where}: [data] label_names must name exactly the training file's labels {list(labels)}"
                         f"{f'; missing {missing}' if missing else ''}{f'; not in the file {extra}' if extra else ''}")
    out = [keys[x] for x in labels]
    bad = [x for x in out if not isinstance(x, str) or not x.strip() or "\t" in x or "\n" in x]
    if bad or len(set(out)) != len(out):
        raise AiaynError(f"{where}: [data] label_names must give each label a different, non-empty name without "
                         f"tabs or line breaks; got {out}")
    return out


class ClassificationTask:
    """Sequence classification for the shared trainer (see ``recipes/sst2-scratch.toml``).

    Args:
        recipe: a loaded recipe with ``task = "classification"``.
        resume_dir: a checkpoint whose tokenizer and model config to reuse (when resuming).
        device: where the model and the batches live.
        seed: seeds the model's initialization and the batch order.
    """

    select_metric = "accuracy"
    select_mode = "max"

    def __init__(self, recipe: dict[str, Any], *, resume_dir: Path | None = None,
                 device: torch.device | str = "cpu", seed: int = 1) -> None:
        self.data = take(recipe["data"], DATA_DEFAULTS, "data")
        tok_cfg = take(recipe["tokenizer"], TOKENIZER_DEFAULTS, "tokenizer")
        self.device, self.seed = torch.device(device), seed
        train_path = resolve_path(recipe, self.data["train"])
        if train_path is None:
            raise AiaynError(f"{recipe.get('_path', 'recipe')}: [data] needs train = a labeled .tsv or .csv "
                             "file (a label column and a text column)")
        cols = {"text_column": self.data["text_column"], "label_column": self.data["label_column"]}
        train = load_labeled_text(train_path, **cols)
        self.labels = train.label_names
        if self.data["valid"] is not None:
            valid_path = resolve_path(recipe, self.data["valid"])
            valid = load_labeled_text(valid_path, label_names=self.labels, **cols)
        else:
            train, valid = _split(train, self.data["val_fraction"])
        if len(self.labels) < 2:
            raise AiaynError(f"{train_path}: only one label ({self.labels}) occurs; a classifier needs at "
                             "least 2")
        self.label_names = name_labels(self.labels, self.data["label_names"], recipe.get("_path", "recipe"))
        self.tok, self.model_config, self.model, self.max_len, self.init_report = build_encoder(
            recipe, tok_cfg, train.texts, resume_dir, int(self.data["max_len"]), self.device, seed,
            arch="encoder", n_classes=len(self.labels))
        self.train_ids, self.train_labels = encode_for_classifier(self.tok, train.texts), train.labels
        self.train_lengths = [min(len(x) + 1, self.max_len) for x in self.train_ids]  # + the CLS token
        self.valid = valid

    def _collate(self, index: list[int]) -> dict[str, torch.Tensor]:
        b = collate_classification([self.train_ids[i] for i in index], [self.train_labels[i] for i in index],
                                   self.tok.pad_id, self.max_len, cls_id=self.tok.bos_id).to(self.device)
        return {"ids": b.input_ids, "is_token": b.attention_mask, "labels": b.labels}

    # ------------------------------------------------------------------ the Task protocol
    def batches(self, position: dict[str, Any] | None) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        """Shuffled batches, reshuffled each epoch from (seed, epoch); resumable at (epoch, index)."""
        epoch, index = (position["epoch"], position["index"]) if position else (0, 0)
        while True:
            plan = epoch_batches(len(self.train_ids), int(self.data["batch_size"]), self.seed, epoch,
                                 self.train_lengths, self.data["batch_tokens"])
            for i in range(index, len(plan)):
                yield self._collate(plan[i].tolist()), {"epoch": epoch, "index": i + 1}
            epoch, index = epoch + 1, 0

    def count_targets(self, batch: dict[str, Any]) -> int:
        return int(batch["labels"].numel())

    def loss(self, batch: dict[str, Any],
             label_smoothing: float) -> tuple[torch.Tensor, int, dict[str, float]]:
        logits = self.model(batch["ids"], batch["is_token"], task="classify").logits  # (B, C)
        loss, nll, n = label_smoothed_nll(logits, batch["labels"], label_smoothing)
        return loss, int(n), {"nll": float(nll.detach())}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Validation accuracy, loss (mean NLL) and macro F1."""
        probs = predict_proba(self.model, self.tok, self.valid.texts, self.max_len,
                              int(self.data["eval_batch_size"]))  # (N, C)
        gold = torch.tensor(self.valid.labels)
        pred = probs.argmax(-1).tolist()
        nll = -probs.gather(1, gold[:, None]).clamp_min(1e-12).log().mean()
        report = precision_recall_f1(self.valid.labels, pred, list(range(len(self.labels))))
        return {"accuracy": accuracy(self.valid.labels, pred), "loss": float(nll),
                "macro_f1": report.macro.f1}

    def checkpoint_config(self) -> dict[str, Any]:
        config = {"task": "classification", "model": self.model_config.to_dict(),
                  "tokenizers": {"text": TOKENIZER_FILE}, "labels": list(self.labels), "max_len": self.max_len}
        if self.label_names is not None:
            config["label_names"] = list(self.label_names)
        return config

    def write_tokenizers(self, directory: Path) -> None:
        self.tok.save(directory / TOKENIZER_FILE)


def _split(data: LabeledData, fraction: float) -> tuple[LabeledData, LabeledData]:
    idx = list(range(len(data)))
    a, b = split_off(idx, fraction, data.path)

    def part(ix: list[int]) -> LabeledData:
        return LabeledData([data.texts[i] for i in ix], [data.labels[i] for i in ix], data.label_names,
                           [data.lines[i] for i in ix], data.path)

    return part(a), part(b)
