"""Translation: parallel text -> BPE -> token-budget batches -> encoder-decoder -> label-smoothed loss,
validated by loss and BLEU of beam-search output."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from aiayn.checkpoint import checkpoint_file, load_config, load_model_state
from aiayn.config import ModelConfig
from aiayn.data.batching import collate_seq2seq, token_budget_batches
from aiayn.data.parallel import ParallelCorpus, filter_by_token_length, load_parallel
from aiayn.errors import AiaynError
from aiayn.evaluate.bleu import corpus_bleu
from aiayn.generate import translate
from aiayn.generate.translate import DECODE_DEFAULTS, seq2seq_models, source_ids, source_limit
from aiayn.models.build import build_model
from aiayn.tasks.finetune import announce, finetune_config, finetune_source
from aiayn.tasks.vocabulary import pretrained_vocabulary
from aiayn.tokenize import Tokenizer, load_tokenizer, train_tokenizer, training_options
from aiayn.tokenize.bpe import BPETokenizer
from aiayn.tokenize.bpe_dropout import BPEDropoutEncoder, PreparedCorpus
from aiayn.tokenize.pretrained import PretrainedTokenizer
from aiayn.train.recipe import resolve_path, take

DATA_DEFAULTS: dict[str, Any] = {
    "train_src": None, "train_tgt": None, "train_tsv": None,
    "valid_src": None, "valid_tgt": None, "valid_tsv": None,
    "test_src": None, "test_tgt": None,
    "max_tokens_per_side": 128, "policy": "warn", "batch_tokens": 4096, "lowercase": False,
}
TOKENIZER_DEFAULTS: dict[str, Any] = {"kind": "bpe", "vocab_size": 8000, "joint": True, "min_frequency": 2,
                                      "split_punctuation": True, "dropout": 0.0, "path": None}
EVAL_DEFAULTS: dict[str, Any] = {"bleu": True, "bleu_sentences": 500, "bleu_beam": 1}
SRC_TOK, TGT_TOK, JOINT_TOK = "tokenizer.src.json", "tokenizer.tgt.json", "tokenizer.json"


def build_model_config(section: dict[str, Any], **forced: Any) -> ModelConfig:
    """``[model]`` section -> ModelConfig: an optional ``preset`` plus field overrides, plus forced values."""
    section = dict(section)
    preset = section.pop("preset", None)
    fields = {**section, **forced}
    return ModelConfig.preset(preset, **fields) if preset else ModelConfig.from_dict(fields, "[model]")


def _read_corpus(recipe: dict[str, Any], data: dict[str, Any], split: str):
    tsv = resolve_path(recipe, data[f"{split}_tsv"]) if f"{split}_tsv" in data else None
    src, tgt = resolve_path(recipe, data[f"{split}_src"]), resolve_path(recipe, data[f"{split}_tgt"])
    if tsv is None and (src is None or tgt is None):
        return None
    corpus = load_parallel(src, tgt, tsv_path=tsv, policy=data["policy"]) if tsv is None else load_parallel(
        tsv_path=tsv, policy=data["policy"])
    if data["lowercase"]:
        corpus.src = [s.lower() for s in corpus.src]
        corpus.tgt = [t.lower() for t in corpus.tgt]
    return corpus


def _require_pairs(corpus: ParallelCorpus, what: str) -> None:
    """Refuse a corpus with no usable pair: an empty file, or one whose every pair was dropped (empty sides, too
    long) under the data policy; training on nothing would never finish an epoch.

    Raises:
        AiaynError: naming the file(s) and the fix.
    """
    if len(corpus):
        return
    files = " and ".join(corpus.files) if corpus.files else corpus.origin
    if corpus.stats.get("read", 0) == 0:
        empty = "the files are empty" if len(corpus.files) > 1 else "the file is empty"
        raise AiaynError(f"{files}: {empty}; give the {what} data one sentence pair per line")
    raise AiaynError(f"{files}: none of the {corpus.stats['read']} {what} pairs can be used "
                     f"({corpus.stats.get('skipped_empty', 0)} with an empty side, "
                     f"{corpus.stats.get('skipped_long', 0)} too long); give pairs with text on both sides")


class TranslationTask:
    """Everything translation training needs, built from a recipe (see ``recipes/multi30k-en-de.toml``).

    Args:
        recipe: a loaded recipe (``aiayn.train.recipe.load_recipe``).
        resume_dir: a checkpoint directory whose tokenizers to reuse (when resuming).
        device: where the model lives.
        pairs: in-memory data instead of files: {"train": [(src, tgt), ...], "valid": [...]} (the demo).
        model_vocab_size: the model's vocabulary when larger than the tokenizer's (a dry run on a small stand-in
            corpus builds the model of the full vocabulary).
    """

    select_metric = "loss"
    select_mode = "min"

    def __init__(self, recipe: dict[str, Any], *, resume_dir: Path | None = None,
                 device: torch.device | str = "cpu", pairs: dict[str, list[tuple[str, str]]] | None = None,
                 seed: int = 1, model_vocab_size: int = 0) -> None:
        self.data = take(recipe["data"], DATA_DEFAULTS, "data")
        self.tok_cfg = take(recipe["tokenizer"], TOKENIZER_DEFAULTS, "tokenizer")
        self.decode_cfg = take(recipe["decode"], DECODE_DEFAULTS, "decode")
        self.eval_cfg = take(recipe["eval"], EVAL_DEFAULTS, "eval")
        self.device = torch.device(device)
        self.seed = seed
        corpora: dict[str, ParallelCorpus | None] = {}  # where each pair came from, for messages
        if pairs is not None:
            train = ([s for s, _ in pairs["train"]], [t for _, t in pairs["train"]])
            valid = ([s for s, _ in pairs["valid"]], [t for _, t in pairs["valid"]])
        else:
            tr = _read_corpus(recipe, self.data, "train")
            if tr is None:
                raise AiaynError(f"{recipe.get('_path', 'recipe')}: [data] needs train_src and train_tgt "
                                 "(or train_tsv)")
            va = _read_corpus(recipe, self.data, "valid")
            _require_pairs(tr, "training")
            if va is not None:
                _require_pairs(va, "validation")
            train = (tr.src, tr.tgt)
            valid = (va.src, va.tgt) if va is not None else ([], [])
            corpora = {"training": tr, "validation": va}
        self.valid_text = valid

        # ---- tokenizers: reused from the checkpoint when resuming or starting from init_from (with the model
        # config), trained on the training data otherwise
        source = None if resume_dir is not None else finetune_source(recipe, "translation")
        if source is not None:
            self.src_tok, self.tgt_tok = load_translation_tokenizers(source[0])
        elif resume_dir is not None:
            self.src_tok, self.tgt_tok = load_translation_tokenizers(resume_dir)
        elif (pretrained := pretrained_vocabulary(recipe, self.tok_cfg, "translation")) is not None:
            self.src_tok = self.tgt_tok = pretrained  # one vocabulary for both sides
        elif self.tok_cfg["joint"]:
            tok = self._train_tok(train[0] + train[1])
            self.src_tok = self.tgt_tok = tok
        else:
            self.src_tok, self.tgt_tok = self._train_tok(train[0]), self._train_tok(train[1])
        joint = self.src_tok is self.tgt_tok
        if self.src_tok.pad_id != self.tgt_tok.pad_id:
            raise AiaynError(f"the source and target tokenizers pad with different ids ({self.src_tok.pad_id} and "
                             f"{self.tgt_tok.pad_id}); the model has one pad id: use one joint tokenizer, or two "
                             "with the same pad id")
        forced: dict[str, Any] = {"vocab_size": max(self.src_tok.vocab_size, model_vocab_size),
                                  "pad_id": self.src_tok.pad_id}
        if not joint:
            forced.update(tgt_vocab_size=max(self.tgt_tok.vocab_size, model_vocab_size),
                          share_src_tgt_embeddings=False)
        if source is not None or (resume_dir is not None and recipe["model"].get("init_from")):
            directory = resume_dir if source is None else source[0]
            self.model_config = finetune_config(load_config(directory), recipe, str(directory))
        else:
            self.model_config = build_model_config(recipe["model"], arch="encoder-decoder", **forced)
        torch.manual_seed(seed)
        self.model = build_model(self.model_config).to(self.device)
        if source is not None:
            load_model_state(source[0], self.model)
            t = self.tgt_tok
            announce(source[0], source[1], {"pad": t.pad_id, "bos": t.bos_id, "eos": t.eos_id,
                                            "decoder_start": t.decoder_start_id})

        self.limit = min(self.data["max_tokens_per_side"], self.model_config.max_len) - 1  # room for BOS/EOS
        self.train_ids, kept = self._encode(train, self.limit, "training", corpora.get("training"))
        if not kept:  # an epoch of no batches would loop for ever
            raise AiaynError(f"{corpora['training'].origin if corpora.get('training') else 'the training data'}: "
                             f"every pair is longer than {self.limit} tokens a side; raise data.max_tokens_per_side "
                             "and model.max_len, or give shorter pairs")
        self.valid_ids = (self._encode(valid, self.limit, "validation", corpora.get("validation"))[0]
                          if valid[0] else ([], []))
        if valid[0] and not self.valid_ids[0]:  # validation on nothing would score NaN at every evaluation
            raise AiaynError(f"{corpora['validation'].origin if corpora.get('validation') else 'the validation data'}"
                             f": every pair is longer than {self.limit} tokens a side; raise data.max_tokens_per_side "
                             "and model.max_len, or give shorter pairs")
        self.lengths = [(len(s), len(t) + 1) for s, t in zip(*self.train_ids)]
        self._dropout = self._prepare_bpe_dropout(train, kept)

    # ------------------------------------------------------------------ setup helpers
    def _train_tok(self, texts: list[str]) -> Tokenizer:
        return train_tokenizer(self.tok_cfg["kind"], texts, self.tok_cfg["vocab_size"],
                               **training_options(self.tok_cfg))

    @property
    def _frames_sources(self) -> bool:
        """Whether sources carry the tokenizer's own framing (a pretrained vocabulary's, :func:`source_ids`)."""
        return isinstance(self.src_tok, PretrainedTokenizer)

    def _encode(self, pair: tuple[list[str], list[str]], limit: int, what: str,
                corpus: ParallelCorpus | None = None) -> tuple[tuple[list, list], list]:
        """Token ids of the pairs within ``limit`` tokens a side, and the indices of those pairs (over-long
        pairs are reported at their ``file:line`` when ``corpus`` says where they came from)."""
        src = ([source_ids(self.src_tok, text) for text in pair[0]] if self._frames_sources
               else self.src_tok.encode_batch(pair[0]))  # sources as decoding reads them (source_ids)
        tgt = self.tgt_tok.encode_batch(pair[1])
        kept = filter_by_token_length(src, tgt, limit, self.data["policy"],
                                      origin=corpus.origin if corpus else f"{what} data",
                                      locate=corpus.location if corpus else None)
        return (list(kept.src), list(kept.tgt)), list(kept.kept)

    def _prepare_bpe_dropout(self, train: tuple[list[str], list[str]],
                             kept: list[int]) -> tuple[PreparedCorpus, PreparedCorpus] | None:
        """``[tokenizer] dropout > 0``: the kept training pairs, ready to be re-segmented every epoch."""
        p = self.tok_cfg["dropout"]
        if not p:
            return None
        if not (isinstance(self.src_tok, BPETokenizer) and isinstance(self.tgt_tok, BPETokenizer)):
            raise AiaynError(f"[tokenizer] dropout = {p} needs kind = \"bpe\" (BPE-dropout skips BPE merges); "
                             f"got kind = {self.tok_cfg['kind']!r}: set dropout = 0 or use BPE")
        src_enc = BPEDropoutEncoder(self.src_tok, p, seed=self.seed)
        tgt_enc = src_enc if self.tgt_tok is self.src_tok else BPEDropoutEncoder(self.tgt_tok, p, seed=self.seed)
        return (src_enc.prepare([train[0][i] for i in kept]), tgt_enc.prepare([train[1][i] for i in kept]))

    def _epoch_train_data(self, epoch: int) -> tuple[tuple[list, list], list]:
        """This epoch's training ids and (source, target) lengths: BPE-dropout segmentations when enabled.

        A pair whose sampled segmentation is longer than the token limit keeps its deterministic one.
        """
        if self._dropout is None:
            return self.train_ids, self.lengths
        src = self._dropout[0].encode_epoch(epoch, salt=0)
        tgt = self._dropout[1].encode_epoch(epoch, salt=1)
        for i, (s, t) in enumerate(zip(src, tgt)):
            if max(len(s), len(t)) > self.limit:
                src[i], tgt[i] = self.train_ids[0][i], self.train_ids[1][i]
        return (src, tgt), [(len(s), len(t) + 1) for s, t in zip(src, tgt)]

    def _collate(self, index: list[int], src_ids: list, tgt_ids: list) -> dict[str, Any]:
        """A training batch: the target shifted right behind the target vocabulary's decoder start id (BOS for
        the built-in tokenizers; pad for T5 and Marian vocabularies, EOS for BART) and ended by its EOS."""
        t = self.tgt_tok
        batch = collate_seq2seq([src_ids[i] for i in index], [tgt_ids[i] for i in index], t.pad_id,
                                t.decoder_start_id, t.eos_id)
        return {k: (v.to(self.device) if torch.is_tensor(v) else v) for k, v in batch.items()}

    # ------------------------------------------------------------------ the Task protocol
    def batches(self, position: dict[str, Any] | None) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        """Token-budget batches, reshuffled each epoch from (seed, epoch); resumable at (epoch, index)."""
        epoch, index = (position["epoch"], position["index"]) if position else (0, 0)
        while True:
            ids, lengths = self._epoch_train_data(epoch)
            plan = token_budget_batches(lengths, self.data["batch_tokens"], seed=self.seed, epoch=epoch)
            for i in range(index, len(plan)):
                yield self._collate(plan[i], *ids), {"epoch": epoch, "index": i + 1}
            epoch, index = epoch + 1, 0

    def count_targets(self, batch: dict[str, Any]) -> int:
        return int(batch["n_tokens"])

    def _scored(self, batch: dict[str, Any], label_smoothing: float) -> tuple[torch.Tensor, ...]:
        """(loss, nll, n_tokens) sums of a batch: decoder hidden states, then the output layer's loss."""
        out = self.model(batch["src"], batch["tgt_in"], compute_logits=False)
        return self.model.lm_head.loss(out.hidden, batch["labels"], label_smoothing)

    def loss(self, batch: dict[str, Any], label_smoothing: float) -> tuple[torch.Tensor, int, dict[str, float]]:
        loss, nll, n = self._scored(batch, label_smoothing)
        return loss, int(n), {"nll": float(nll.detach())}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Validation loss (per target token, no smoothing), perplexity and BLEU of decoded output."""
        self.model.eval()
        src_ids, tgt_ids = self.valid_ids
        if not src_ids:
            return {"loss": float("nan")}
        lengths = [(len(s), len(t) + 1) for s, t in zip(src_ids, tgt_ids)]
        total, count = 0.0, 0
        for index in token_budget_batches(lengths, self.data["batch_tokens"], seed=0, epoch=0, shuffle=False):
            b = self._collate(index, src_ids, tgt_ids)
            _, nll, n = self._scored(b, 0.0)
            total, count = total + float(nll), count + int(n)
        metrics = {"loss": total / count, "ppl": math.exp(min(total / count, 50))}
        if self.eval_cfg["bleu"]:
            n = min(self.eval_cfg["bleu_sentences"], len(self.valid_text[0]))
            hyps = translate_texts(self.model, self.src_tok, self.tgt_tok, self.valid_text[0][:n],
                                   beam=self.eval_cfg["bleu_beam"], alpha=self.decode_cfg["alpha"],
                                   max_len_a=self.decode_cfg["max_len_a"], max_len_b=self.decode_cfg["max_len_b"])
            bleu = corpus_bleu(hyps, self.valid_text[1][:n])
            metrics["bleu"] = bleu.score  # 0-100, as sacrebleu and `aiayn evaluate` print it
            self.metric_notes = {"bleu_signature": bleu.signature, "bleu_sentences": n,
                                 "bleu_beam": self.eval_cfg["bleu_beam"]}
        return metrics

    def checkpoint_config(self) -> dict[str, Any]:
        joint = self.src_tok is self.tgt_tok
        return {"task": "translation", "model": self.model_config.to_dict(),
                "tokenizers": {"src": JOINT_TOK if joint else SRC_TOK, "tgt": JOINT_TOK if joint else TGT_TOK},
                "decode": self.decode_cfg, "lowercase": self.data["lowercase"]}

    def write_tokenizers(self, directory: Path) -> None:
        if self.src_tok is self.tgt_tok:
            self.src_tok.save(directory / JOINT_TOK)
        else:
            self.src_tok.save(directory / SRC_TOK)
            self.tgt_tok.save(directory / TGT_TOK)


def load_translation_tokenizers(directory: Path) -> tuple[Tokenizer, Tokenizer]:
    """The (source, target) tokenizers saved in a translation checkpoint (the same object when joint)."""
    names = load_config(directory).get("tokenizers", {})
    src_name, tgt_name = names.get("src", JOINT_TOK), names.get("tgt", JOINT_TOK)
    src = load_tokenizer(checkpoint_file(directory, src_name))
    return src, (src if tgt_name == src_name else load_tokenizer(checkpoint_file(directory, tgt_name)))


@torch.no_grad()
def translate_texts(model, src_tok: Tokenizer, tgt_tok: Tokenizer, texts: list[str], *, beam: int = 4,
                    alpha: float = 0.6, max_len_a: float = 1.0, max_len_b: int = 50, batch_size: int = 64,
                    n_best: int = 1, forced_bos_id: int | None = None) -> list[str] | list[list[str]]:
    """Translate sentences with beam search (beam 1 = greedy), in length-sorted batches, order preserved.

    Sources are encoded by :func:`source_ids` (a pretrained vocabulary's own framing, cut to the model's
    ``max_len``). Outputs never contain ids the target tokenizer lacks (a model's output layer padded past its
    vocabulary, as T5's).

    Args:
        model: an encoder-decoder model, or a list of them sharing ``src_tok`` and ``tgt_tok`` (an ensemble;
            see :func:`aiayn.generate.translate`).
        forced_bos_id: a token every output begins with (the checkpoint's ``decode.forced_bos_id``: BART models
            with transformers' ``forced_bos_token_id``); it is fed to the decoder, not shown in the output.
    Returns:
        One string per input (``n_best == 1``), else a list of ``n_best`` strings per input.
    """
    models = seq2seq_models(model)
    device = next(models[0].parameters()).device
    max_src = source_limit(models)
    ids = [source_ids(src_tok, t, max_src) for t in texts]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out: list[Any] = [None] * len(ids)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        width = max(1, max(len(ids[i]) for i in chunk))
        src = torch.full((len(chunk), width), src_tok.pad_id, dtype=torch.long)
        for row, i in enumerate(chunk):
            src[row, :len(ids[i])] = torch.tensor(ids[i], dtype=torch.long)
        hyps = translate(models, src.to(device), beam_size=beam, alpha=alpha, max_len_a=max_len_a,
                         max_len_b=max_len_b, n_best=n_best, bos_id=tgt_tok.bos_id, eos_id=tgt_tok.eos_id,
                         pad_id=tgt_tok.pad_id, start_id=tgt_tok.decoder_start_id, vocab_size=tgt_tok.vocab_size,
                         forced_first_id=forced_bos_id)
        for row, i in enumerate(chunk):
            texts_i = [tgt_tok.decode(h.tokens) for h in hyps[row]]
            out[i] = texts_i[0] if n_best == 1 else texts_i
    return out
