"""Image classification with a Vision Transformer: images -> patches -> encoder (``input="patches"``) -> CLS or
mean pooling -> class logits, validated by accuracy on a seeded, stratified held-out split (see
``recipes/digits-vit.toml``).

The data is scikit-learn's bundled 8x8 digits (``[data] source = "sklearn-digits"``) or a folder of class-named
subfolders of PNG / ``.npy`` images (``[data] train = "my_images/"``, optionally ``valid``); :mod:`aiayn.data.images`
reads both. A checkpoint of this task has no tokenizer; ``aiayn classify`` reads image files through it
(:func:`classify_files`), ``aiayn evaluate --data sklearn-digits|FOLDER`` scores it (:func:`evaluate_images`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from aiayn.checkpoint import load_config
from aiayn.config import ModelConfig
from aiayn.data.images import (
    DIGITS,
    IMAGE_SUFFIXES,
    ImageData,
    first_image_shape,
    fit_image,
    image_input,
    load_digits,
    load_image_folder,
    random_shift,
    stratified_split,
)
from aiayn.data.text_io import read_lines
from aiayn.errors import AiaynError, where
from aiayn.evaluate.classification import accuracy, precision_recall_f1
from aiayn.evaluate.predict import display_labels
from aiayn.evaluate.run import classification_report
from aiayn.models.build import build_model
from aiayn.models.losses import label_smoothed_nll
from aiayn.tasks.classification import name_labels
from aiayn.tasks.mlm import epoch_batches
from aiayn.tasks.translation import build_model_config
from aiayn.train.recipe import resolve_path, take

TASK = "image_classification"
DATA_DEFAULTS: dict[str, Any] = {
    "source": None, "train": None, "valid": None, "val_fraction": 0.2, "split_seed": 0, "batch_size": 64,
    "eval_batch_size": 512, "label_names": None, "max_shift": 0,
}


def data_problems(recipe: dict[str, Any], data: dict[str, Any]) -> list[str]:
    """The ``[data]`` problems of an image recipe (``data``: the section over :data:`DATA_DEFAULTS`): exactly one of
    ``source`` and ``train``, folders that exist, a valid split."""
    out = []
    if data["source"] is not None and data["source"] != DIGITS:
        out.append(f"[data] source={data['source']!r}: unknown; use source = \"{DIGITS}\", or train = a folder of "
                   "class-named subfolders of images")
    if (data["source"] is None) == (data["train"] is None):
        out.append(f"[data]: set one of source = \"{DIGITS}\" and train = a folder of class-named subfolders of "
                   "images" + ("" if data["source"] is None else ", not both"))
    for key in ("train", "valid"):
        path = resolve_path(recipe, data[key])
        if path is not None and not path.is_dir():
            out.append(f"[data] {key}={data[key]!r}: no such folder (looked in the current directory and beside the "
                       "recipe); give a folder with one subfolder of images per class")
    if data["valid"] is not None and data["train"] is None:
        out.append("[data] valid: applies to train = a folder; the digits are split by val_fraction")
    if not (isinstance(data["split_seed"], int) and not isinstance(data["split_seed"], bool)):
        out.append(f"[data] split_seed={data['split_seed']!r}: must be a whole number, e.g. split_seed = 0")
    shift = data["max_shift"]
    if not (isinstance(shift, int) and not isinstance(shift, bool) and shift >= 0):
        out.append(f"[data] max_shift={shift!r}: must be a whole number of pixels >= 0 (0: no shifting), e.g. "
                   "max_shift = 1")
    return out


def model_fields(recipe: dict[str, Any], data: dict[str, Any], n_classes: int) -> dict[str, Any]:
    """What the task sets in ``[model]``: an encoder reading patches with ``n_classes`` outputs; unless the recipe
    says otherwise, images of the data's size and channels (the digits: 1 x 8 x 8) and max_len = the positions of one
    image. ``vocab_size`` 1 and ``pad_id`` 0 stand in for the vocabulary an image model does not have."""
    section = recipe["model"]
    fields: dict[str, Any] = {"arch": "encoder", "input": "patches", "n_classes": n_classes, "vocab_size": 1,
                              "pad_id": 0}
    if "image_size" not in section or "channels" not in section:
        folder = resolve_path(recipe, data["train"]) if data["source"] is None else None
        channels, size = (1, 8) if folder is None or not folder.is_dir() else first_image_shape(folder)
        fields["channels"] = section.get("channels", channels)
        fields["image_size"] = section.get("image_size", size)
    if "max_len" not in section:
        probe = {**section, **fields}
        size, patch = probe.get("image_size", 224), probe.get("patch_size", 16)
        if isinstance(size, int) and isinstance(patch, int) and patch >= 1:
            fields["max_len"] = max((size // patch) ** 2 + (probe.get("pooling", "cls") == "cls"), 1)
    return fields


def _digits(channels: int, size: int) -> ImageData:
    """The digits as a model of (channels, size, size) images reads them: resized, or repeated to RGB, if need be."""
    whole = load_digits()
    if (channels, size) == (1, 8):
        return whole
    images = torch.stack([fit_image(x, channels, size, src) for x, src in zip(whole.images, whole.sources)])
    return ImageData(images, whole.labels, whole.label_names, whole.sources)


def _read(recipe: dict[str, Any], data: dict[str, Any], channels: int, size: int) -> tuple[ImageData, ImageData]:
    """(train, held-out) images of a recipe's ``[data]``, brought to (channels, size, size)."""
    if data["source"] == DIGITS:
        whole = _digits(channels, size)
        kept, held = stratified_split(whole.labels, float(data["val_fraction"]), int(data["split_seed"]))
        return whole.subset(kept), whole.subset(held)
    train = load_image_folder(resolve_path(recipe, data["train"]), channels, size)
    if data["valid"] is not None:
        return train, load_image_folder(resolve_path(recipe, data["valid"]), channels, size, train.label_names)
    kept, held = stratified_split(train.labels, float(data["val_fraction"]), int(data["split_seed"]))
    return train.subset(kept), train.subset(held)


@torch.no_grad()
def predict_proba(model: torch.nn.Module, images: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
    """Class probabilities (N, n_classes) of images (N, C, S, S), in their order."""
    model.eval()
    device = next(model.parameters()).device
    out = [model(images[i:i + batch_size].to(device), task="classify").logits.float().softmax(-1).cpu()
           for i in range(0, len(images), batch_size)]  # (b, n_classes) each
    return torch.cat(out) if out else torch.zeros(0, model.config.n_classes)


def scores(probs: torch.Tensor, gold: Sequence[int], n_classes: int) -> dict[str, float]:
    """Accuracy, loss (mean NLL) and macro F1 of probabilities (N, n_classes) against gold class ids."""
    pred = probs.argmax(-1).tolist()
    nll = -probs.gather(1, torch.tensor(list(gold))[:, None]).clamp_min(1e-12).log().mean()
    report = precision_recall_f1(list(gold), pred, list(range(n_classes)))
    return {"accuracy": accuracy(list(gold), pred), "loss": float(nll), "macro_f1": report.macro.f1}


class ImageClassificationTask:
    """Image classification for the shared trainer (see ``recipes/digits-vit.toml``).

    Args:
        recipe: a loaded recipe with ``task = "image_classification"``.
        resume_dir: a checkpoint whose model config to reuse (when resuming).
        device: where the model and the batches live.
        seed: seeds the model's initialization and the batch order (the split has its own ``split_seed``).
    """

    select_metric = "accuracy"
    select_mode = "max"

    def __init__(self, recipe: dict[str, Any], *, resume_dir: Path | None = None,
                 device: torch.device | str = "cpu", seed: int = 1) -> None:
        self.data = take(recipe["data"], DATA_DEFAULTS, "data")
        where = recipe.get("_path", "recipe")
        problems = data_problems(recipe, self.data)
        if problems:
            raise AiaynError(f"{where}: " + "; ".join(problems))
        self.device, self.seed = torch.device(device), seed
        fields = model_fields(recipe, self.data, 2)  # the number of classes is known once the data is read
        section = {**recipe["model"], **fields}
        self.train, self.valid = _read(recipe, self.data, section.get("channels", 3), section.get("image_size", 224))
        self.labels = self.train.label_names
        self.label_names = name_labels(self.labels, self.data["label_names"], where)
        if resume_dir is not None:
            config = ModelConfig.from_dict(load_config(resume_dir)["model"], f"{resume_dir}/config.json")
        else:
            config = build_model_config(recipe["model"], **{**fields, "n_classes": len(self.labels)})
        self.model_config = config
        torch.manual_seed(seed)
        self.model = build_model(config).to(self.device)

    # ------------------------------------------------------------------ the Task protocol
    def batches(self, position: dict[str, Any] | None) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        """Shuffled batches, reshuffled each epoch from (seed, epoch), each image shifted by up to
        ``[data] max_shift`` pixels drawn from (seed, epoch, batch); resumable at (epoch, index)."""
        epoch, index = (position["epoch"], position["index"]) if position else (0, 0)
        labels = torch.tensor(self.train.labels)
        shift = int(self.data["max_shift"])
        while True:
            plan = epoch_batches(len(self.train), int(self.data["batch_size"]), self.seed, epoch)
            for i in range(index, len(plan)):
                ix = plan[i]
                g = torch.Generator().manual_seed((self.seed * 1_000_003 + epoch) * 100_003 + i)
                images = random_shift(self.train.images[ix], shift, g)  # (B, C, S, S)
                batch = {"images": images.to(self.device), "labels": labels[ix].to(self.device)}
                yield batch, {"epoch": epoch, "index": i + 1}
            epoch, index = epoch + 1, 0

    def count_targets(self, batch: dict[str, Any]) -> int:
        return int(batch["labels"].numel())

    def loss(self, batch: dict[str, Any], label_smoothing: float) -> tuple[torch.Tensor, int, dict[str, float]]:
        logits = self.model(batch["images"], task="classify").logits  # (B, n_classes)
        loss, nll, n = label_smoothed_nll(logits, batch["labels"], label_smoothing)
        return loss, int(n), {"nll": float(nll.detach())}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Held-out accuracy, loss (mean NLL) and macro F1."""
        probs = predict_proba(self.model, self.valid.images, int(self.data["eval_batch_size"]))
        return scores(probs, self.valid.labels, len(self.labels))

    def checkpoint_config(self) -> dict[str, Any]:
        data = {k: self.data[k] for k in ("source", "val_fraction", "split_seed")}
        config = {"task": TASK, "model": self.model_config.to_dict(), "tokenizers": {}, "labels": list(self.labels),
                  "data": data}
        if self.label_names is not None:
            config["label_names"] = list(self.label_names)
        return config

    def write_tokenizers(self, directory: Path) -> None:
        """An image model has no tokenizer: nothing to write."""


# ---------------------------------------------------------------------------------------------- inference
def labelled_data(pre: Any, data: str) -> ImageData:
    """The labelled images ``aiayn evaluate --data`` names: ``sklearn-digits`` (the checkpoint's held-out split of
    the digits, as it was trained) or a folder of class-named subfolders."""
    meta, c = pre.meta, pre.config
    if data == DIGITS:
        split = meta.get("data") or {}
        if split.get("source") != DIGITS:
            raise AiaynError(f"--data {DIGITS}: this checkpoint was not trained on the digits; give a folder of "
                             "class-named subfolders of images")
        whole = _digits(c.channels, c.image_size)
        return whole.subset(stratified_split(whole.labels, float(split["val_fraction"]), int(split["split_seed"]))[1])
    return load_image_folder(data, c.channels, c.image_size, list(meta["labels"]))


def evaluate_images(pre: Any, data: str, batch_size: int = 512) -> dict[str, Any]:
    """Accuracy, per-class and macro precision/recall/F1 and the confusion matrix of an image checkpoint on
    :func:`labelled_data` (the keys of :func:`aiayn.evaluate.run.evaluate_classifier`)."""
    images = labelled_data(pre, data)
    probs = predict_proba(pre.model, images.images, batch_size)
    return classification_report(pre, probs, images.labels)


def image_paths(listing: str | None) -> list[tuple[str | None, str | None]]:
    """The images ``aiayn classify -i`` names, as (``file:line`` or None, path) per input line, path None for a blank
    line: one
    ``.png``/``.npy`` file itself, or a file (or stdin for None and ``-``) listing one image path per line, a relative
    path read from the current directory or, failing that, beside the list."""
    if listing not in (None, "-") and Path(listing).suffix.lower() in IMAGE_SUFFIXES:
        return [(None, listing)]
    if listing in (None, "-"):
        lines, name, base = [line.rstrip("\n").removesuffix("\r") for line in sys.stdin], "stdin", None
    else:
        lines, name, base = read_lines(listing), listing, Path(listing).parent
    out: list[tuple[str | None, str | None]] = []
    for i, line in enumerate(lines):
        path = line.strip()
        if path and base is not None and not Path(path).is_absolute() and not Path(path).exists():
            path = str(base / path) if (base / path).exists() else path
        out.append((where(name, i + 1), path or None))
    return out


def classify_files(pre: Any, listing: str | None, batch_size: int = 512) -> list[str]:
    """``label<TAB>probability`` of each image :func:`image_paths` names (a blank line for a blank line), the label by
    its name when the checkpoint has names; every image is read and checked before any is classified.

    Raises:
        AiaynError: an image the model cannot read, named by its input line and file.
    """
    named = image_paths(listing)
    kept = [(i, image_input(pre, path, line)) for i, (line, path) in enumerate(named) if path is not None]
    out = [""] * len(named)
    if not kept:
        return out
    probs = predict_proba(pre.model, torch.stack([x for _, x in kept]), batch_size)  # (N, n_classes)
    labels = display_labels(pre.meta)
    best_p, best = probs.max(-1)  # (N,), (N,)
    for (i, _), p, k in zip(kept, best_p.tolist(), best.tolist()):
        out[i] = f"{labels[k]}\t{p:.4f}"
    return out
