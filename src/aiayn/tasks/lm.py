"""Language modeling: a text file (or a folder of documents) -> char or BPE tokens -> random blocks ->
decoder-only model -> next-token loss, validated by the mean loss over fixed validation blocks.

Training batches follow nanoGPT's ``get_batch``: B random windows of T + 1 tokens from the training
stream (:class:`~aiayn.data.lm.RandomBlockSampler`, whose generator state is the resumable data
position). With ``data.packing = true`` a folder's documents are instead packed into blocks with
per-document attention masks and position ids that restart at each document
(:func:`~aiayn.data.packing.pack_documents`), and the blocks are visited in a fresh random order
each epoch.

BPE (and word) tokenizers collapse whitespace, which would erase line breaks; the task therefore
writes each ``\\n`` as a visible symbol (``␤``) before tokenizing and turns it back on decoding
(:class:`~aiayn.tokenize.text_codec.TextCodec`), so a BPE model of Shakespeare keeps its verse lines.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from aiayn.checkpoint import checkpoint_file, load_config, load_model_state
from aiayn.data.lm import RandomBlockSampler, load_text_corpus, split_text
from aiayn.data.packing import PackedBlocks, pack_documents
from aiayn.errors import AiaynError
from aiayn.generate import lm as lm_generation
from aiayn.models.build import build_model
from aiayn.models.losses import IGNORE_INDEX
from aiayn.tasks.finetune import announce, finetune_config, finetune_source
from aiayn.tasks.translation import build_model_config
from aiayn.tasks.vocabulary import pretrained_vocabulary
from aiayn.tokenize import Tokenizer, load_tokenizer, train_tokenizer, training_options
from aiayn.tokenize.text_codec import NEWLINE_SYMBOL, TextCodec, show_newlines
from aiayn.train.recipe import resolve_path, take

DATA_DEFAULTS: dict[str, Any] = {
    "path": None, "valid_path": None, "val_fraction": 0.1, "block_size": 256, "batch_size": 64,
    "packing": False, "eval_batch_size": 64, "eval_max_blocks": None,
}
TOKENIZER_DEFAULTS: dict[str, Any] = {
    "kind": "char", "vocab_size": 8000, "min_frequency": 2, "split_punctuation": True, "newlines": True,
    "path": None,
}
TOKENIZER_FILE = "tokenizer.json"


def _documents(corpus: str | list[str]) -> list[str]:
    return [corpus] if isinstance(corpus, str) else list(corpus)


class LMTask:
    """Decoder-only language modeling for the shared trainer (see ``recipes/shakespeare-char.toml``).

    Args:
        recipe: a loaded recipe with ``task = "lm"``.
        resume_dir: a checkpoint whose tokenizer and model config to reuse (when resuming).
        device: where the model and the batches live.
        seed: seeds the model's initialization and the batch sampler.
    """

    select_metric = "loss"
    select_mode = "min"

    def __init__(self, recipe: dict[str, Any], *, resume_dir: Path | None = None,
                 device: torch.device | str = "cpu", seed: int = 1) -> None:
        self.data = take(recipe["data"], DATA_DEFAULTS, "data")
        self.tok_cfg = take(recipe["tokenizer"], TOKENIZER_DEFAULTS, "tokenizer")
        self.device, self.seed = torch.device(device), seed
        self.block_size, self.batch_size = int(self.data["block_size"]), int(self.data["batch_size"])
        if self.block_size < 2 or self.batch_size < 1:
            raise AiaynError(f"[data]: block_size={self.block_size} must be >= 2 and batch_size="
                             f"{self.batch_size} >= 1")
        origin = recipe.get("_path", "recipe")
        path = resolve_path(recipe, self.data["path"])
        if path is None:
            raise AiaynError(f"{origin}: [data] needs path = a text file or a folder of *.txt documents")
        corpus = load_text_corpus(path)
        self.is_folder = not isinstance(corpus, str)
        if self.data["valid_path"] is not None:
            train, valid = corpus, load_text_corpus(resolve_path(recipe, self.data["valid_path"]))
        else:
            train, valid = split_text(corpus, self.data["val_fraction"])
        train_docs, valid_docs = _documents(train), _documents(valid)
        if not any(valid_docs):
            raise AiaynError(f"{path}: the validation part is empty; raise data.val_fraction, add documents, "
                             "or set data.valid_path")
        if self.data["packing"] and not self.is_folder:
            raise AiaynError(f"{path}: data.packing = true needs a folder with one *.txt file per document; "
                             "give a folder, or set data.packing = false")

        # ---- tokenizer: reused from the checkpoint when resuming or starting from init_from (with the model
        # config), trained on the training text otherwise
        source = None if resume_dir is not None else finetune_source(recipe, "lm")
        trained = self.tok_cfg["kind"] != "pretrained"  # a pretrained vocabulary encodes line breaks itself
        symbol = NEWLINE_SYMBOL if self.tok_cfg["newlines"] and self.tok_cfg["kind"] != "char" and trained else None
        if resume_dir is not None or source is not None:
            directory = resume_dir if source is None else source[0]
            meta = load_config(directory)
            tok = load_tokenizer(checkpoint_file(directory, meta.get("tokenizers", {}).get("text", TOKENIZER_FILE)))
            self.codec = TextCodec(tok, meta.get("newline_symbol"))
        else:
            pretrained = pretrained_vocabulary(recipe, self.tok_cfg, "lm")
            self.codec = TextCodec(pretrained if pretrained is not None else self._train_tokenizer(train_docs, symbol),
                                   symbol)
        tok = self.codec.tokenizer

        if source is not None or (resume_dir is not None and recipe["model"].get("init_from")):
            self.model_config = finetune_config(meta, recipe, str(directory))
        else:
            section = dict(recipe["model"])
            forced: dict[str, Any] = {"arch": "decoder", "vocab_size": tok.vocab_size, "pad_id": tok.pad_id}
            if "max_len" not in section:
                forced["max_len"] = self.block_size
            self.model_config = build_model_config(section, **forced)
        if self.model_config.max_len < self.block_size:
            fix = ("lower block_size (init_from's model has that many positions)" if "init_from" in recipe["model"]
                   else "raise max_len or lower block_size")
            raise AiaynError(f"{origin}: model.max_len={self.model_config.max_len} is shorter than "
                             f"data.block_size={self.block_size}; {fix}")
        torch.manual_seed(seed)
        self.model = build_model(self.model_config).to(self.device)
        if source is not None:
            load_model_state(source[0], self.model)
            announce(source[0], meta, {"eos": tok.eos_id, "pad": tok.pad_id, "bos": tok.bos_id})

        # ---- data as token ids
        if self.data["packing"]:
            self.train_blocks = self._pack(train_docs, "training")
            self.valid_blocks = self._pack(valid_docs, "validation")
        else:
            self.train_ids = self._stream(train_docs)
            self.valid_ids = self._stream(valid_docs)
            if self.valid_ids.numel() < 2:
                raise AiaynError(f"{path}: the validation part has {self.valid_ids.numel()} token(s); "
                                 "it needs at least 2: raise data.val_fraction or set data.valid_path")
            self.sampler = RandomBlockSampler(self.train_ids, self.block_size, self.batch_size, seed)

    # ------------------------------------------------------------------ setup helpers
    def _train_tokenizer(self, docs: list[str], symbol: str | None) -> Tokenizer:
        kind = self.tok_cfg["kind"]
        if kind == "char":
            return train_tokenizer("char", docs)
        # BPE learns from lines; the newline symbol ends each line so it gets its own vocabulary entry.
        lines = [show_newlines(line + "\n", symbol) if symbol else line
                 for doc in docs for line in doc.split("\n")]
        return train_tokenizer(kind, (x for x in lines if x.strip()), self.tok_cfg["vocab_size"],
                               **training_options(self.tok_cfg))

    def _stream(self, docs: list[str]) -> torch.Tensor:
        """One token stream: a single file as is (nanoGPT), a folder's documents each followed by EOS."""
        eos = [self.codec.tokenizer.eos_id] if self.is_folder else []
        ids: list[int] = []
        for doc in docs:
            if doc:
                ids += self.codec.encode(doc) + eos
        return torch.tensor(ids, dtype=torch.long, device=self.device)

    def _pack(self, docs: list[str], what: str) -> PackedBlocks:
        tok = self.codec.tokenizer
        encoded = [self.codec.encode(d) for d in docs]
        if not any(encoded):
            raise AiaynError(f"the {what} documents hold no tokens; add text to them")
        return pack_documents(encoded, self.block_size, eos_id=tok.eos_id, pad_id=tok.pad_id)

    def _packed_batch(self, blocks: PackedBlocks) -> dict[str, torch.Tensor]:
        return {"ids": blocks.input_ids.to(self.device), "labels": blocks.labels.to(self.device),
                "doc_ids": blocks.doc_ids.to(self.device), "positions": blocks.position_ids.to(self.device)}

    # ------------------------------------------------------------------ the Task protocol
    def batches(self, position: dict[str, Any] | None) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        """Random blocks; the position is the sampler state (streams) or (epoch, index) (packed blocks)."""
        if self.data["packing"]:
            yield from self._packed_batches(position)
            return
        if position is not None:
            self.sampler.load_state_dict(position["sampler"])
        while True:
            x, y = self.sampler.next()  # (B, T) each
            yield {"ids": x, "labels": y}, {"sampler": self.sampler.state_dict()}

    def _packed_batches(self, position: dict[str, Any] | None) -> Iterator[tuple[dict, dict]]:
        epoch, index = (position["epoch"], position["index"]) if position else (0, 0)
        n = len(self.train_blocks)
        while True:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + epoch))
            starts = list(range(0, n, self.batch_size))
            for i in range(index, len(starts)):
                chosen = order[starts[i]:starts[i] + self.batch_size]
                yield self._packed_batch(self.train_blocks[chosen]), {"epoch": epoch, "index": i + 1}
            epoch, index = epoch + 1, 0

    def count_targets(self, batch: dict[str, Any]) -> int:
        return int((batch["labels"] != IGNORE_INDEX).sum())

    def _scored(self, batch: dict[str, Any], label_smoothing: float) -> tuple[torch.Tensor, ...]:
        """(loss, nll, n_tokens) sums of a batch (document masks and positions applied for packed blocks):
        hidden states, then the output layer's loss."""
        out = self.model(batch["ids"], positions=batch.get("positions"), doc_ids=batch.get("doc_ids"),
                         compute_logits=False)  # hidden (B, T, D)
        return self.model.lm_head.loss(out.hidden, batch["labels"], label_smoothing)

    def loss(self, batch: dict[str, Any],
             label_smoothing: float) -> tuple[torch.Tensor, int, dict[str, float]]:
        loss, nll, n = self._scored(batch, label_smoothing)
        return loss, int(n), {"nll": float(nll.detach())}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean next-token loss over the validation blocks (all of them, or ``data.eval_max_blocks``
        evenly spaced ones), and its perplexity."""
        self.model.eval()
        total, count = 0.0, 0
        for batch in self._valid_batches():
            _, nll, n = self._scored(batch, 0.0)
            total, count = total + float(nll), count + int(n)
        loss = total / max(count, 1)
        return {"loss": loss, "ppl": math.exp(min(loss, 50.0))}

    def _valid_batches(self) -> Iterator[dict[str, torch.Tensor]]:
        bs, limit = int(self.data["eval_batch_size"]), self.data["eval_max_blocks"]
        if self.data["packing"]:
            index = _spread(len(self.valid_blocks), limit)
            for i in range(0, len(index), bs):
                yield self._packed_batch(self.valid_blocks[index[i:i + bs]])
            return
        ids, t = self.valid_ids, self.block_size
        n_full = (ids.numel() - 1) // t
        if n_full == 0:  # a validation text shorter than one block: score it whole
            yield {"ids": ids[None, :-1], "labels": ids[None, 1:]}
            return
        starts = _spread(n_full, limit).to(ids.device) * t  # (N,) the last partial block is left out
        offsets = torch.arange(t + 1, device=ids.device)  # (T+1,)
        for i in range(0, len(starts), bs):
            window = ids[starts[i:i + bs, None] + offsets[None, :]]  # (b, T+1)
            yield {"ids": window[:, :-1], "labels": window[:, 1:]}

    def checkpoint_config(self) -> dict[str, Any]:
        return {"task": "lm", "model": self.model_config.to_dict(), "tokenizers": {"text": TOKENIZER_FILE},
                "block_size": self.block_size, "newline_symbol": self.codec.newline_symbol,
                "packing": bool(self.data["packing"])}

    def write_tokenizers(self, directory: Path) -> None:
        self.codec.tokenizer.save(directory / TOKENIZER_FILE)


def _spread(n: int, limit: int | None) -> torch.Tensor:
    """Indices 0..n-1, or ``limit`` of them evenly spaced when ``limit < n``."""
    if limit is None or limit >= n:
        return torch.arange(n)
    return torch.linspace(0, n - 1, max(int(limit), 1)).round().long()


def generate_text(model: torch.nn.Module, codec: TextCodec, prompts: Sequence[str], *, max_new_tokens: int,
                  block_size: int | None = None, temperature: float = 1.0, top_k: int | None = None,
                  top_p: float | None = None, greedy: bool = False, seed: int | None = None,
                  prefix_lm: bool = False, on_text: Callable[[int, str], None] | None = None) -> list[str]:
    """Continue text prompts with a decoder-only model, as one left-padded batch, stopping at EOS.

    The context never exceeds ``block_size`` tokens (default: the model's ``max_len``): when a row's
    context is full, generation continues from its last ``block_size // 2`` tokens (nanoGPT crops the
    context too, one token at a time; cropping by half-blocks keeps the KV cache useful). Each row
    slides on its own schedule, so greedy output does not depend on the other prompts of the batch.
    With ``prefix_lm`` the whole context of each chunk is the bidirectional prefix.

    Args:
        model: a :class:`~aiayn.models.decoder.DecoderModel`.
        codec: the checkpoint's text codec.
        prompts: B prompt texts; an empty prompt starts from :meth:`TextCodec.start_ids`.
        max_new_tokens: the most tokens to add per prompt.
        block_size: the longest context the model was trained on.
        temperature, top_k, top_p, greedy, seed: sampling settings (see :func:`aiayn.generate.lm.generate`);
            chunk k after the first draws with seed ``seed + k``.
        prefix_lm: attend bidirectionally within the prompt.
        on_text: streaming callback ``on_text(prompt_index, new_text)`` called with the text each new
            token adds to that prompt's continuation.

    Returns:
        The continuation text of each prompt (without the prompt).
    """
    tok = codec.tokenizer
    limit = min(block_size or model.config.max_len, model.config.max_len)
    rows = [codec.encode(p) if p else codec.start_ids() for p in prompts]
    new: list[list[int]] = [[] for _ in prompts]
    shown = [codec.decode(r) for r in rows]

    def stream(i: int, token: int) -> None:
        new[i].append(token)
        if on_text is not None:
            text = codec.decode(rows[i] + new[i])
            common = len(shown[i]) if text.startswith(shown[i]) else _common_prefix(text, shown[i])
            if len(text) > common:
                on_text(i, text[common:])
            shown[i] = text

    start = [0] * len(prompts)  # where each row's context window begins in its prompt + output
    active, remaining, chunk = list(range(len(prompts))), max_new_tokens, 0
    while remaining > 0 and active:
        for i in active:  # a full window drops its older half; each row slides on its own schedule
            if len(rows[i]) + len(new[i]) - start[i] >= limit:
                start[i] = len(rows[i]) + len(new[i]) - max(limit // 2, 1)
        ctx = [(rows[i] + new[i])[start[i]:] for i in active]
        n = min(remaining, limit - max(len(c) for c in ctx))
        out = lm_generation.generate(model, ctx, max_new_tokens=n, temperature=temperature, top_k=top_k, top_p=top_p,
                       greedy=greedy, seed=None if seed is None else seed + chunk, stop_ids=(tok.eos_id,),
                       pad_id=tok.pad_id, prefix_lm=prefix_lm,
                       on_token=lambda j, t, act=tuple(active): stream(act[j], t))
        active = [i for j, i in enumerate(active) if len(out[j]) == n]  # the others met EOS
        remaining, chunk = remaining - n, chunk + 1
    return [codec.decode(rows[i] + new[i])[len(codec.decode(rows[i])):] for i in range(len(prompts))]


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
