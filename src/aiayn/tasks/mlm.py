"""Masked-LM pretraining (BERT): sentences -> BPE -> ``[BOS] tokens [EOS]`` batches -> 15% of the tokens
corrupted (80% ``<mask>``, 10% random, 10% kept) -> encoder-only model -> loss on the chosen positions.

Also home of what the encoder tasks share: reading sentences (a TSV/CSV's text column, or the lines of
a plain text file), batching them, and building an encoder from a recipe or from an earlier
checkpoint (``[model] init_from``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from aiayn.checkpoint import checkpoint_dir, checkpoint_file, load_config, read_state_dict
from aiayn.config import ModelConfig
from aiayn.data.batching import token_budget_batches
from aiayn.data.classification import load_labeled_text
from aiayn.data.mlm import mask_tokens
from aiayn.data.text_io import read_lines
from aiayn.errors import AiaynError
from aiayn.models.build import build_model
from aiayn.models.losses import IGNORE_INDEX, label_smoothed_nll
from aiayn.tasks.finetune import finetune_config, finetune_source, init_from_name
from aiayn.tasks.translation import build_model_config
from aiayn.tasks.vocabulary import pretrained_vocabulary
from aiayn.tokenize import Tokenizer, load_tokenizer, train_tokenizer, training_options
from aiayn.train.recipe import resolve_path, take

DATA_DEFAULTS: dict[str, Any] = {
    "train": None, "valid": None, "val_fraction": 0.05, "text_column": None, "max_len": 128,
    "batch_size": 64, "batch_tokens": None, "eval_batch_size": 128, "mlm_prob": 0.15, "mask_prob": 0.8,
    "random_prob": 0.1,
}
TOKENIZER_DEFAULTS: dict[str, Any] = {"kind": "bpe", "vocab_size": 8000, "min_frequency": 2,
                                      "split_punctuation": True, "path": None}
TOKENIZER_FILE = "tokenizer.json"
TABLE_SUFFIXES = (".tsv", ".csv")


# ------------------------------------------------------------------------------------ shared helpers
def read_sentences(path: Path, text_column: str | int | None = None) -> list[str]:
    """Texts for an encoder: the text column of a ``.tsv``/``.csv`` file (e.g. SST-2), else the
    non-blank lines of a plain text file (``.gz`` allowed)."""
    suffixes = [s.lower() for s in path.suffixes if s.lower() != ".gz"]
    if suffixes and suffixes[-1] in TABLE_SUFFIXES:
        return load_labeled_text(path, text_column=text_column, texts_only=True).texts
    lines = [x.strip() for x in read_lines(path)]
    texts = [x for x in lines if x]
    if not texts:
        raise AiaynError(f"{path}: no text in the file; give one sentence per line")
    return texts


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
    """Right-pad token lists into a (B, T) LongTensor."""
    width = max(len(s) for s in seqs)
    out = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, :len(s)] = torch.tensor(list(s), dtype=torch.long)
    return out


def wrap(ids: Sequence[int], tok: Tokenizer, max_len: int) -> list[int]:
    """``[BOS] ids [EOS]`` cut to ``max_len`` tokens (BOS is the CLS token the classifier pools; a vocabulary
    without one, such as T5's, starts with the first token)."""
    bos = [] if tok.bos_id is None else [tok.bos_id]
    return (bos + list(ids) + [tok.eos_id])[:max_len]


def epoch_batches(n: int, batch_size: int, seed: int, epoch: int, lengths: Sequence[int] | None = None,
                  batch_tokens: int | None = None) -> list[torch.Tensor]:
    """The example indices of every batch of an epoch, shuffled from (seed, epoch).

    Args:
        n: number of examples; ``batch_size``: examples per batch (the cap, with ``batch_tokens``).
        lengths: (n,) padded length of each example; needed with ``batch_tokens``.
        batch_tokens: if given, batches are length-bucketed to at most this many padded tokens each
            (:func:`~aiayn.data.batching.token_budget_batches`): far less padding on corpora of short
            and long texts mixed, like SST-2's phrases.
    Returns:
        a list of (b,) long index tensors covering every example once.
    """
    if batch_tokens is not None:
        if lengths is None or len(lengths) != n:
            raise ValueError("epoch_batches: batch_tokens needs one length per example")
        plan = token_budget_batches(lengths, int(batch_tokens), seed=seed, epoch=epoch, max_batch_size=batch_size)
        return [torch.tensor(b, dtype=torch.long) for b in plan]
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))
    return [order[i:i + batch_size] for i in range(0, n, batch_size)]


def encoder_setup(recipe: dict[str, Any], tok_cfg: dict[str, Any], train_texts: list[str],
                  resume_dir: Path | None, **forced: Any) -> tuple[Tokenizer, ModelConfig, Path | None]:
    """The tokenizer and model config of an encoder task, and the checkpoint to initialize from.

    Precedence: a resumed run reuses its own checkpoint's tokenizer and model config; ``[model] init_from``
    reuses that checkpoint's tokenizer and model config, with the dropout-like ``[model]`` keys as overrides
    (:mod:`aiayn.tasks.finetune`; a classifier from a masked-LM checkpoint may also set ``pooling``);
    otherwise a tokenizer is trained on ``train_texts`` and the model config comes from ``[model]``.

    Returns:
        ``(tokenizer, model config, init_from directory or None)``; the caller loads ``init_from``'s
        weights after building the model (:func:`load_encoder_weights`), unless resuming.
    """
    task = "classification" if forced.get("n_classes") is not None else "mlm"
    found = None if resume_dir is not None else finetune_source(recipe, task)
    init_dir = None if found is None else found[0]
    source = resume_dir or init_dir
    if source is not None:
        meta = load_config(source)
        tok = load_tokenizer(checkpoint_file(source, meta.get("tokenizers", {}).get("text", TOKENIZER_FILE)))
        if resume_dir is not None and not init_from_name(recipe):
            config = ModelConfig.from_dict({**meta["model"], **forced}, f"{source}/config.json")
        else:
            config = finetune_config(meta, recipe, str(source), **forced)
        return tok, config, init_dir
    section = dict(recipe["model"])
    section.pop("init_from", None)
    tok = pretrained_vocabulary(recipe, tok_cfg, task)
    if tok is None:
        tok = train_tokenizer(tok_cfg["kind"], train_texts, tok_cfg["vocab_size"], **training_options(tok_cfg))
    return tok, build_model_config(section, vocab_size=tok.vocab_size, pad_id=tok.pad_id, **forced), None


def load_encoder_weights(model: torch.nn.Module, directory: Path) -> tuple[list[str], list[str]]:
    """Copy an encoder checkpoint's weights into ``model`` (non-strict) and print what did not match.

    Returns:
        ``(missing, unexpected)``: the model's parameters left at their fresh initialization, and the
        checkpoint's tensors the model has no place for.
    """
    state = read_state_dict(checkpoint_dir(directory))
    shapes = model.state_dict()
    # a classifier of another label set: its output layer starts fresh
    resized = sorted(k for k, v in state.items() if k.startswith("cls_head.") and k in shapes
                     and tuple(v.shape) != tuple(shapes[k].shape))
    for k in resized:
        del state[k]
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as e:
        raise AiaynError(f"{directory}: weights do not fit the model ({e})") from e
    if resized:
        print(f"{directory}: the checkpoint's classifier has another number of classes; {', '.join(resized)} "
              "start fresh")
    loaded = len(model.state_dict()) - len(missing)
    print(f"initialized {loaded} tensors from {directory}; newly initialized: {sorted(missing) or 'none'}; "
          f"unused from the checkpoint: {sorted(unexpected) or 'none'}")
    return list(missing), list(unexpected)


def build_encoder(recipe: dict[str, Any], tok_cfg: dict[str, Any], train_texts: list[str], resume_dir: Path | None,
                  data_max_len: int, device: torch.device, seed: int, **forced: Any
                  ) -> tuple[Tokenizer, ModelConfig, torch.nn.Module, int, tuple[list[str], list[str]] | None]:
    """Tokenizer, config and model of an encoder task (:func:`encoder_setup`, then the model seeded with ``seed``
    and initialized from ``init_from`` if the recipe names one).

    ``data.max_len`` (``data_max_len``) sizes the model's positions unless ``[model]`` or the ``init_from``
    checkpoint fixes them.

    Returns:
        ``(tokenizer, config, model, max_len, init report)``: ``max_len`` is the longest sequence the data may
        use (``data_max_len`` capped by the model), the report is :func:`load_encoder_weights`' or None.
    """
    if "max_len" not in recipe["model"] and init_from_name(recipe) is None:
        forced["max_len"] = data_max_len
    tok, config, init_dir = encoder_setup(recipe, tok_cfg, train_texts, resume_dir, **forced)
    torch.manual_seed(seed)
    model = build_model(config).to(device)
    report = load_encoder_weights(model, init_dir) if init_dir is not None else None
    return tok, config, model, min(data_max_len, config.max_len), report


def split_off(texts: list[Any], fraction: float, what: str) -> tuple[list[Any], list[Any]]:
    """Hold out the last ``fraction`` of a list for validation."""
    if not 0.0 < fraction < 1.0:
        raise AiaynError(f"[data]: no validation file is given and val_fraction={fraction}; set data.valid "
                         "or a val_fraction in (0, 1)")
    cut = int(len(texts) * (1.0 - fraction))
    if cut == len(texts) or cut == 0:
        raise AiaynError(f"{what}: {len(texts)} examples are too few to hold out val_fraction={fraction}; "
                         "set data.valid")
    return texts[:cut], texts[cut:]


# ------------------------------------------------------------------------------------ the task
class MLMTask:
    """Masked-LM pretraining of an encoder for the shared trainer (see ``recipes/sst2-mlm-pretrain.toml``).

    Args:
        recipe: a loaded recipe with ``task = "mlm"``.
        resume_dir: a checkpoint whose tokenizer and model config to reuse (when resuming).
        device: where the model and the batches live.
        seed: seeds the model's initialization, the batch order and the masking.
    """

    select_metric = "loss"
    select_mode = "min"

    def __init__(self, recipe: dict[str, Any], *, resume_dir: Path | None = None,
                 device: torch.device | str = "cpu", seed: int = 1) -> None:
        self.data = take(recipe["data"], DATA_DEFAULTS, "data")
        tok_cfg = take(recipe["tokenizer"], TOKENIZER_DEFAULTS, "tokenizer")
        self.device, self.seed = torch.device(device), seed
        train_path = resolve_path(recipe, self.data["train"])
        if train_path is None:
            raise AiaynError(f"{recipe.get('_path', 'recipe')}: [data] needs train = a .tsv/.csv file or a "
                             "text file with one sentence per line")
        train = read_sentences(train_path, self.data["text_column"])
        if self.data["valid"] is not None:
            valid = read_sentences(resolve_path(recipe, self.data["valid"]), self.data["text_column"])
        else:
            train, valid = split_off(train, self.data["val_fraction"], str(train_path))
        self.tok, self.model_config, self.model, self.max_len, _ = build_encoder(
            recipe, tok_cfg, train, resume_dir, int(self.data["max_len"]), self.device, seed, arch="encoder")
        self.train_ids = [wrap(x, self.tok, self.max_len) for x in self.tok.encode_batch(train)]
        self.valid_ids = [wrap(x, self.tok, self.max_len) for x in self.tok.encode_batch(valid)]
        self.train_lengths = [len(x) for x in self.train_ids]
        t = self.tok
        if t.mask_id is None:
            raise AiaynError("masked-LM pretraining needs a tokenizer with a mask token; this vocabulary has none "
                             "(GPT-2, LLaMA and T5 vocabularies lack one): use a BERT- or BART-style vocabulary, or "
                             "train a tokenizer")
        named = {t.pad_id, t.bos_id, t.eos_id, t.unk_id, t.mask_id} - {None}
        self.special = tuple(sorted(set(t.special_ids) | named))  # never chosen, never drawn at random

    def _masked(self, seqs: list[list[int]], generator: torch.Generator) -> dict[str, torch.Tensor]:
        ids = pad_batch(seqs, self.tok.pad_id)  # (B, T)
        masked, labels = mask_tokens(ids, mask_id=self.tok.mask_id, vocab_size=self.tok.vocab_size,
                                     special_ids=self.special, generator=generator,
                                     mlm_prob=self.data["mlm_prob"], mask_prob=self.data["mask_prob"],
                                     random_prob=self.data["random_prob"])
        return {"ids": masked.to(self.device), "labels": labels.to(self.device),
                "is_token": (ids != self.tok.pad_id).to(self.device)}

    # ------------------------------------------------------------------ the Task protocol
    def batches(self, position: dict[str, Any] | None) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        """Shuffled sentence batches; the masking of batch (epoch, i) is drawn from a generator seeded by
        (seed, epoch, i), so the position (epoch, index) alone resumes exactly."""
        epoch, index = (position["epoch"], position["index"]) if position else (0, 0)
        bs = int(self.data["batch_size"])
        while True:
            plan = epoch_batches(len(self.train_ids), bs, self.seed, epoch, self.train_lengths,
                                 self.data["batch_tokens"])
            for i in range(index, len(plan)):
                gen = torch.Generator().manual_seed((self.seed * 1_000_003 + epoch) * 1_000_003 + i)
                batch = self._masked([self.train_ids[j] for j in plan[i].tolist()], gen)
                yield batch, {"epoch": epoch, "index": i + 1}
            epoch, index = epoch + 1, 0

    def count_targets(self, batch: dict[str, Any]) -> int:
        return int((batch["labels"] != IGNORE_INDEX).sum())

    def _logits(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (N, V) at the N chosen positions only, and their labels (N,)."""
        out = self.model(batch["ids"], batch["is_token"], task="hidden")  # hidden (B, T, D)
        chosen = batch["labels"] != IGNORE_INDEX  # (B, T)
        return self.model.mlm_head(out.hidden[chosen]), batch["labels"][chosen]

    def loss(self, batch: dict[str, Any],
             label_smoothing: float) -> tuple[torch.Tensor, int, dict[str, float]]:
        logits, labels = self._logits(batch)
        loss, nll, n = label_smoothed_nll(logits, labels, label_smoothing)
        return loss, int(n), {"nll": float(nll.detach())}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Loss, perplexity and accuracy on the masked positions of the validation sentences, masked the
        same way at every evaluation."""
        self.model.eval()
        bs = int(self.data["eval_batch_size"])
        gen = torch.Generator().manual_seed(12345)
        total, count, correct = 0.0, 0, 0
        for i in range(0, len(self.valid_ids), bs):
            batch = self._masked(self.valid_ids[i:i + bs], gen)
            logits, labels = self._logits(batch)
            _, nll, n = label_smoothed_nll(logits, labels, 0.0)
            total, count = total + float(nll), count + int(n)
            correct += int((logits.argmax(-1) == labels).sum())
        loss = total / max(count, 1)
        return {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "masked_accuracy": correct / max(count, 1)}

    def checkpoint_config(self) -> dict[str, Any]:
        return {"task": "mlm", "model": self.model_config.to_dict(), "tokenizers": {"text": TOKENIZER_FILE},
                "max_len": self.max_len}

    def write_tokenizers(self, directory: Path) -> None:
        self.tok.save(directory / TOKENIZER_FILE)
