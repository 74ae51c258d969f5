"""Sentence embeddings: texts -> one vector each, from an encoder or a decoder's hidden states and a pooling.

A checkpoint of task ``"embedding"`` (what ``aiayn convert --from-hf`` writes for a bare ``BertModel``, a
sentence-transformers folder, or a bare ``LlamaModel`` / ``MistralModel`` / ``Qwen2Model``) says how to pool in its
``config.json``::

    "embedding": {"pooling": "mean", "normalize": true, "lowercase": false, "from": "sentence-transformers"}

Other checkpoints that read tokens embed too, with a default pooling: an encoder (``mlm``, ``classification``) the
mean of its tokens, a decoder-only language model (``lm``) its last token; neither is normalised.

The poolings, as sentence-transformers computes them (``Pooling``), padding never counted:

- ``mean``: the mean of the hidden states of the text's tokens (framing tokens such as ``[CLS]`` and ``[SEP]``
  included, padding excluded by the attention mask);
- ``cls``: the first token's hidden state;
- ``max``: the largest value of each dimension over the text's tokens;
- ``last``: the last token's hidden state (sentence-transformers' ``lasttoken``; for causal decoders, the only
  token that has seen the whole text).

``normalize`` then scales each vector to unit L2 norm (sentence-transformers' ``Normalize`` module), so that a dot
product is the cosine similarity. ``lowercase`` lower-cases a text before tokenizing it (``do_lower_case`` of
``sentence_bert_config.json``).

Texts are framed as the model's tokenizer frames them (a pretrained vocabulary's own special tokens, e.g. BERT's
``[CLS] ... [SEP]``; aiayn's own tokenizers: ``[BOS] ... [EOS]`` for an encoder, as in masked-LM training, nothing for
a language model) and cut to the checkpoint's ``max_len`` keeping the framing, as transformers' truncation does.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.errors import AiaynError
from aiayn.generate.inputs import check_lengths
from aiayn.generate.translate import source_ids
from aiayn.pretrained import EMBEDDING_POOLINGS, Pretrained, load_pretrained
from aiayn.tokenize import Tokenizer
from aiayn.tokenize.pretrained import PretrainedTokenizer

POOLINGS = EMBEDDING_POOLINGS
"""The poolings: ``mean``, ``cls``, ``max``, ``last`` (see the module docstring)."""

TASKS = ("embedding", "lm", "mlm", "classification")
"""The checkpoint tasks :func:`embed` reads."""


@dataclass(frozen=True)
class EmbeddingSettings:
    """How a checkpoint's texts become vectors.

    Attributes:
        pooling: one of :data:`POOLINGS`.
        normalize: scale each vector to unit L2 norm.
        lowercase: lower-case each text before tokenizing it.
        max_len: the most tokens of a text the model reads (framing tokens included).
    """

    pooling: str
    normalize: bool
    lowercase: bool
    max_len: int


def settings(pre: Pretrained, pooling: str | None = None, normalize: bool | None = None,
             where: str = "checkpoint") -> EmbeddingSettings:
    """The checkpoint's embedding settings (its ``embedding`` entry, else the default of its architecture),
    with ``pooling`` and ``normalize`` given here taking precedence.

    Raises:
        AiaynError: a checkpoint of a task without token embeddings (translation, image classification), one without
            a tokenizer, or an unknown pooling.
    """
    if pre.task not in TASKS or pre.config.input != "tokens":
        raise AiaynError(f"{where}: a {pre.task!r} checkpoint; embed reads encoders and decoder-only models (tasks "
                         f"{', '.join(TASKS)}), e.g. what aiayn convert --from-hf wrote for a sentence-transformers "
                         "folder or a BertModel")
    if "text" not in pre.tokenizers:
        raise AiaynError(f"{where}: the checkpoint has no tokenizer, so it cannot read text; convert the model "
                         "again from a folder with its tokenizer files")
    saved: dict[str, Any] = pre.meta.get("embedding") or {}
    decoder = pre.config.arch == "decoder"
    mode = pooling or saved.get("pooling") or ("last" if decoder else "mean")
    if mode not in POOLINGS:
        raise AiaynError(f"pooling {mode!r}: choose one of {', '.join(POOLINGS)}")
    limit = pre.config.max_len
    if isinstance(pre.meta.get("max_len"), int):
        limit = min(limit, pre.meta["max_len"])
    if decoder and isinstance(pre.meta.get("block_size"), int):
        limit = min(limit, pre.meta["block_size"])
    return EmbeddingSettings(mode, bool(saved.get("normalize", False) if normalize is None else normalize),
                             bool(saved.get("lowercase", False)), limit)


# ---------------------------------------------------------------------------------------------- tokens
def frame(tok: Tokenizer, text: str, decoder: bool, limit: int | None = None) -> tuple[list[int], int]:
    """A text's ids as the model reads them, at most ``limit`` of them, and its length before the cut.

    A pretrained vocabulary frames the text as transformers' tokenizer does (``encode_with_special``); a longer text
    keeps the framing and loses its last text tokens (transformers' truncation). aiayn's own tokenizers frame an
    encoder's text as ``[BOS] ... [EOS]`` (masked-LM and classifier training) and a decoder's not at all.
    """
    if isinstance(tok, PretrainedTokenizer):
        full = tok.encode_with_special(text)
        return (full if limit is None or len(full) <= limit else source_ids(tok, text, limit)), len(full)
    ids = tok.encode(text)
    if decoder:
        return (ids if limit is None else ids[:limit]), len(ids)
    full_len = len(ids) + 2
    if limit is not None and full_len > limit:
        ids = ids[:max(0, limit - 2)]
    return [tok.bos_id if tok.bos_id is not None else tok.eos_id, *ids, tok.eos_id], full_len


# ---------------------------------------------------------------------------------------------- pooling
def pool(h: Tensor, is_token: Tensor, pooling: str, normalize: bool = False) -> Tensor:
    """Pool hidden states into one vector per sequence, as sentence-transformers does (see the module docstring).

    Args:
        h: (B, T, D) hidden states.
        is_token: (B, T) bool, False at padding (right padding: each row's tokens come first).
        pooling: one of :data:`POOLINGS`.
        normalize: scale each vector to unit L2 norm.
    Returns:
        (B, D) float32; a row without tokens is zeros.
    """
    h = h.float()
    mask = is_token.unsqueeze(-1)  # (B, T, 1)
    if pooling == "mean":
        weight = mask.to(h.dtype)  # (B, T, 1)
        out = (h * weight).sum(1) / weight.sum(1).clamp(min=1e-9)  # (B, D)
    elif pooling == "max":
        out = h.masked_fill(~mask, float("-inf")).amax(1)  # (B, D)
    elif pooling == "cls":
        out = h[:, 0]  # (B, D)
    elif pooling == "last":
        last = (is_token.sum(1) - 1).clamp(min=0)  # (B,)
        out = h[torch.arange(h.shape[0], device=h.device), last]  # (B, D)
    else:
        raise AiaynError(f"pooling {pooling!r}: choose one of {', '.join(POOLINGS)}")
    out = torch.where(is_token.any(1, keepdim=True), out, torch.zeros_like(out))  # (B, D)
    return F.normalize(out, p=2.0, dim=-1) if normalize else out


@torch.no_grad()
def embed_ids(model: torch.nn.Module, ids: Sequence[Sequence[int]], pad_id: int, pooling: str,
              normalize: bool = False, batch_size: int = 32) -> Tensor:
    """Embed token id sequences (already framed and cut) in length-sorted, right-padded batches, order kept.

    Args:
        model: an :class:`~aiayn.models.EncoderModel` or :class:`~aiayn.models.DecoderModel` in eval mode.
        ids: N sequences of token ids.
        pad_id: the id that fills the batches (never attended by the encoder, after every token for the decoder).
        pooling: one of :data:`POOLINGS`.
        normalize: scale each vector to unit L2 norm.
        batch_size: sequences per forward pass.
    Returns:
        (N, D) float32 on the CPU.
    """
    model.eval()
    device = next(model.parameters()).device
    d = model.config.d_model
    out = torch.zeros(len(ids), d)
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))  # similar lengths together: less padding
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        width = max(1, max(len(ids[i]) for i in rows))
        batch = torch.full((len(rows), width), pad_id, dtype=torch.long)  # (B, T)
        is_token = torch.zeros(len(rows), width, dtype=torch.bool)  # (B, T)
        for j, i in enumerate(rows):
            batch[j, :len(ids[i])] = torch.tensor(ids[i], dtype=torch.long)
            is_token[j, :len(ids[i])] = True
        batch, is_token = batch.to(device), is_token.to(device)
        if model.config.arch == "decoder":  # right padding lies after every token under the causal mask
            h = model(batch, compute_logits=False).hidden  # (B, T, D)
        else:
            h = model(batch, is_token, task="hidden").hidden  # (B, T, D)
        out[rows] = pool(h, is_token, pooling, normalize).cpu()
    return out


def encode_texts(pre: Pretrained, texts: Sequence[str], s: EmbeddingSettings) -> tuple[list[list[int]], list[int]]:
    """Each text's ids as :func:`embed_ids` takes them (lower-cased when the settings say so, framed, cut to
    ``s.max_len``), and each text's length in tokens before the cut."""
    tok = pre.tokenizers["text"]
    decoder = pre.config.arch == "decoder"
    framed = [frame(tok, t.lower() if s.lowercase else t, decoder, s.max_len) for t in texts]
    return [ids for ids, _ in framed], [n for _, n in framed]


def empty_warnings(ids: Sequence[Sequence[int]], names: Sequence[str]) -> list[str]:
    """One warning per input without any token (a blank text, for a model that frames no text): its vector is
    zeros."""
    return [f"{name}: no tokens at all (a blank text, and the model frames no text); its vector is zeros"
            for name, row in zip(names, ids) if not row]


def long_effect(s: EmbeddingSettings) -> str:
    """What happens to a text longer than the model takes, for ``--on-long`` warnings."""
    return f"only its first {s.max_len} tokens (framing tokens included) are embedded"


def embed(checkpoint_or_pretrained: str | Path | Pretrained, texts: Sequence[str] | str, batch_size: int = 32, *,
          pooling: str | None = None, normalize: bool | None = None, on_long: str = "warn",
          device: str | torch.device = "cpu", accel: str | None = None,
          warn: Callable[[str], None] | None = None) -> Tensor:
    """Embed texts with a checkpoint: one vector per text.

    ::

        import aiayn
        vectors = aiayn.embed("runs/minilm", ["A man is eating food.", "A man is riding a horse."])  # (2, 384)
        vectors @ vectors.T  # cosine similarities, when the checkpoint normalises

    Args:
        checkpoint_or_pretrained: a checkpoint directory (task ``embedding``, ``lm``, ``mlm`` or ``classification``),
            or one :func:`~aiayn.pretrained.load_pretrained` loaded.
        texts: N texts (a single string is one text). An empty text is embedded as its framing tokens (BERT's
            ``[CLS] [SEP]``), as sentence-transformers does; a text without any token gives a zero vector and a
            warning.
        batch_size: texts per forward pass.
        pooling: ``mean``, ``cls``, ``max`` or ``last``; default: the checkpoint's.
        normalize: unit L2 norm; default: the checkpoint's.
        on_long: a text longer than the checkpoint's ``max_len`` tokens: ``warn`` (cut, with a warning naming it),
            ``truncate`` (cut silently) or ``error``.
        device: where a checkpoint given by path is loaded.
        accel: ``auto`` or ``none`` for a checkpoint given by path (:func:`~aiayn.pretrained.load_pretrained`).
        warn: called with each warning (default: :func:`warnings.warn`).
    Returns:
        (N, D) float32 on the CPU.

    Raises:
        AiaynError: the checkpoint is missing or of another task; a text is not a string; ``on_long="error"`` and a
            text is too long (named as ``texts[i]``).
    """
    if isinstance(texts, str):
        texts = [texts]
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if bad is not None:
        raise AiaynError(f"texts[{bad}] is a {type(texts[bad]).__name__}, not a string; pass a list of strings")
    if batch_size < 1:
        raise AiaynError(f"batch_size={batch_size}: give a whole number of at least 1")
    if isinstance(checkpoint_or_pretrained, Pretrained):
        pre, where = checkpoint_or_pretrained, "checkpoint"
    else:
        pre, where = load_pretrained(checkpoint_or_pretrained, device, accel=accel), str(checkpoint_or_pretrained)
    s = settings(pre, pooling, normalize, where)
    ids, lengths = encode_texts(pre, texts, s)
    names = [f"texts[{i}]" for i in range(len(texts))]
    try:
        messages = check_lengths(lengths, s.max_len, on_long, names, effect=long_effect(s), fix="split the text")
    except AiaynError as e:
        raise AiaynError(_as_argument(str(e))) from None
    for message in [*messages, *empty_warnings(ids, names)]:
        (warn or (lambda m: warnings.warn(m, stacklevel=3)))(_as_argument(message))
    return embed_ids(pre.model, ids, pre.tokenizers["text"].pad_id, s.pooling, s.normalize, batch_size)


def _as_argument(message: str) -> str:
    """A ``--on-long`` message as the Python function's argument says it."""
    return message.replace("--on-long truncate (or warn)", "on_long='truncate' (or 'warn')").replace(
        "--on-long truncate", "on_long='truncate'")
