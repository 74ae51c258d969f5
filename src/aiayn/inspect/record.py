"""The inspection record of one input: everything the explorer shows, as a JSON-ready dict.

:func:`inspect_text` runs a checkpoint on one text as its task does (a translation is decoded with beam search or
greedily, then read back in one teacher-forced pass; a language model reads the text and predicts what comes next;
a classifier predicts its class) and records, from that same forward pass (:func:`aiayn.inspect.capture`):

``tokens``
    ``{"encoder": [...], "decoder": [...]}``: the token strings each stack read (a decoder's row i reads token i
    and predicts token i + 1).
``attention``
    ``{kind: [layer][head][query][key]}`` for the kinds the model has: ``encoder`` (self), ``decoder`` (causal
    self), ``cross`` (decoder queries over encoder keys).
``masks``
    ``{kind: [query][key]}`` 1 where the pass let a query attend to a key (padding, causal, window, pattern), and
    ``mask_notes``: what made each mask.
``positions``
    the position scheme: a table of absolute encodings (sinusoidal, learned), RoPE's frequencies and angles, or
    the additive bias matrices (ALiBi, T5) the pass added, per head.
``stats``
    ``{kind: [layer][head] {entropy, distance, first, punctuation}}`` (:mod:`aiayn.inspect.stats`).
``output``
    translation: the decoded text and how; language model: ``next_token`` (the most likely next tokens with their
    logits); classification: the labels with their probabilities and the prediction.
``ids``
    ``{"encoder": [...], "decoder": [...]}``: the token ids of ``tokens`` (what a step-through,
    :mod:`aiayn.inspect.stepthrough`, runs the model on again).
``cut``
    None, or what was kept of an input longer than the model takes (as the commands' ``--on-long warn`` says it):
    ``{"tokens", "limit", "kept": "first" | "last", "kept_text", "message"}``.
``notes``
    sentences the explorer shows above the views: the cut, and tokens unknown to the tokenizer.
``steps``
    only when asked for (``steps=``): one step-through and neuron view (:func:`aiayn.inspect.stepthrough.step_record`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from aiayn.config import PRESETS, ModelConfig
from aiayn.data.classification import collate_classification
from aiayn.errors import AiaynError
from aiayn.evaluate.predict import display_labels, encode_for_classifier
from aiayn.generate import translate
from aiayn.generate.translate import DECODE_DEFAULTS, source_ids, source_limit
from aiayn.inspect.capture import AttentionCapture, Call, capture_attention
from aiayn.inspect.stats import head_statistics
from aiayn.inspect.stepthrough import default_selection, step_record
from aiayn.pretrained import Pretrained
from aiayn.tokenize.text_codec import codec_from_meta

#: how many next-token candidates a language model's record keeps (the explorer's temperature / top-k / top-p
#: control works among them)
NEXT_TOKENS = 256
#: the most positions and dimensions of an absolute position table the record keeps
TABLE_POSITIONS, TABLE_DIMS = 128, 128
TASKS = ("translation", "lm", "classification", "mlm")


def _round(x: Tensor, digits: int | None) -> Any:
    values = x.detach().float().cpu()
    if digits is not None:
        values = torch.round(values, decimals=digits)
    return values.tolist()


def _tokens(tok: Any, ids: list[int]) -> list[str]:
    return [tok.id_to_token(i) for i in ids]


def _mask_of(call: Call, t: int, s: int) -> Tensor:
    """(T, S) 1/0 of what row 0 of a call could attend to."""
    if call.allowed is None:
        return torch.ones(t, s)
    allowed = call.allowed
    while allowed.dim() > 2:
        allowed = allowed[0]
    return allowed.expand(t, s).float()


def _notes(config: Any, kind: str) -> str:
    parts = []
    if kind == "decoder":
        parts.append("causal")
        if config.sliding_window is not None:
            parts.append(f"sliding window of {config.sliding_window}")
    if kind != "cross" and getattr(config, "attention_mask", "dense") != "dense":
        parts.append(f"{config.attention_mask} pattern")
    parts.append("padding (none in a single input)" if kind != "decoder" else "no padding in a single input")
    return ", ".join(parts)


def _attention(capture: AttentionCapture, kinds: dict[str, tuple[list[str], list[str]]], config: Any,
               digits: int | None) -> dict[str, Any]:
    """The attention, masks and statistics of one pass: ``kinds`` maps each kind to its (query, key) tokens."""
    attention, masks, stats, notes = {}, {}, {}, {}
    for kind, (queries, keys) in kinds.items():
        layers = capture.kind(kind)
        if not layers:
            continue
        calls = [calls[-1] for calls in layers]  # the pass of interest is the last call of each layer
        weights = [c.weights[0] for c in calls]  # (H, T, S) each
        attention[kind] = [_round(w, digits) for w in weights]
        masks[kind] = _round(_mask_of(calls[0], len(queries), len(keys)), 0)
        notes[kind] = _notes(config, kind)
        stats[kind] = [head_statistics(w, keys, self_attention=kind != "cross") for w in weights]
    return {"attention": attention, "masks": masks, "mask_notes": notes, "stats": stats}


def _positions(model: nn.Module, capture: AttentionCapture, config: Any, length: int, digits: int | None,
               kind: str) -> dict[str, Any]:
    """The position scheme of the stack that ``kind`` records, as numbers to draw."""
    stack = getattr(model, "encoder" if kind == "encoder" else "decoder")
    out: dict[str, Any] = {"scheme": config.position}
    n = max(1, min(config.max_len, max(length, 32), TABLE_POSITIONS))
    if stack.abs_pos is not None:
        table = stack.abs_pos(torch.arange(n, device=_device(model))[None])[0]  # (P, D)
        out["table"] = _round(table[:, :TABLE_DIMS], digits)
        out["table_shown"] = {"positions": n, "of_positions": config.max_len, "dims": min(TABLE_DIMS, config.d_model),
                              "of_dims": config.d_model}
    elif stack.rotary is not None:
        inv_freq = stack.rotary.inv_freq.float().cpu()  # (Dh/2,)
        out["inv_freq"] = _round(inv_freq, None)
        out["angles"] = _round(torch.cos(torch.arange(n, dtype=torch.float32)[:, None] * inv_freq), digits)
    layers = capture.kind(kind)
    if layers and layers[0][-1].bias is not None:
        bias = layers[0][-1].bias
        while bias.dim() > 3:
            bias = bias[0]
        out["bias"] = _round(bias.expand(config.n_heads, *bias.shape[-2:]), digits)  # (H, T, S)
    return out


#: the fields that make a model the size of a preset
SIZE_FIELDS = ("d_model", "d_ff", "n_heads", "n_layers", "encoder_layers")


def _preset_named(config: Any) -> tuple[str | None, str | None]:
    """(the preset ``config`` is, None when it is another size; the preset its design comes from, or None)."""
    if config.name not in PRESETS:
        return None, None
    preset = ModelConfig.preset(config.name, vocab_size=config.vocab_size)
    same = all(getattr(preset, f) == getattr(config, f) for f in SIZE_FIELDS)
    return (config.name if same else None), config.name


def _model_summary(pre: Pretrained) -> dict[str, Any]:
    """What the explorer's header says of the model: its real sizes (and a preset's name only if it has its size)."""
    c = pre.config
    name, design = _preset_named(c)
    return {"task": pre.task, "name": name, "design": design, "arch": c.arch, "n_layers": c.n_layers,
            "encoder_layers": c.encoder_layers if c.arch != "decoder" else 0, "n_heads": c.n_heads,
            "kv_heads": c.kv_heads, "head_dim": c.head_dim, "d_model": c.d_model, "d_ff": c.d_ff,
            "parameters": sum(p.numel() for p in pre.model.parameters()), "position": c.position,
            "norm": c.norm, "norm_position": c.norm_position, "max_len": c.max_len}


def _cut(total: int, kept_ids: list[int], limit: int, where: str, decode: Any, effect: str) -> dict[str, Any] | None:
    """The record's ``cut``: None when nothing was cut; else what was kept of ``total`` tokens (the ``where`` ones,
    ``kept_ids``) and a message naming it, as ``--on-long warn`` does."""
    if total <= limit:
        return None
    kept_text = decode(kept_ids)
    return {"tokens": total, "limit": limit, "kept": where, "kept_text": kept_text,
            "message": f"the input has {total} tokens, more than the {limit} the model takes; {effect}"}


def _unknown_note(ids: list[int], unk_id: int | None) -> list[str]:
    k = sum(1 for i in ids if i == unk_id) if unk_id is not None else 0
    if not ids or k / len(ids) <= 0.10:
        return []
    return [f"{k} of the {len(ids)} input tokens are unknown to the tokenizer (words or characters absent from its "
            "training data): the model reads each as <unk>"]


def _finish(record: dict[str, Any], cut: dict[str, Any] | None, unknown: list[str]) -> dict[str, Any]:
    record["cut"] = cut
    record["notes"] = ([cut["message"]] if cut else []) + unknown
    return record


@torch.no_grad()
def inspect_text(pre: Pretrained, text: str, *, beam: int | None = None, alpha: float | None = None,
                 layers: list[int] | None = None, digits: int | None = 5,
                 steps: bool | dict[str, int | str] = False) -> dict[str, Any]:
    """The inspection record of ``text`` for a loaded checkpoint (see the module docstring).

    Args:
        pre: a checkpoint from :func:`aiayn.pretrained.load_pretrained` (accelerated or not: the weights come from
            the pass that computes the output either way).
        text: one input: a source sentence, a prompt, or a text to classify.
        beam: translation only: the beam width (default the checkpoint's ``decode.beam``; 1 is greedy).
        alpha: translation only: the length penalty (default the checkpoint's ``decode.alpha``).
        layers: record these layers only (default all).
        digits: decimals kept of each weight (None: full float32 precision).
        steps: also record one step-through (:mod:`aiayn.inspect.stepthrough`) under ``steps``, for pages that have
            no server to ask (an offline file, a notebook): True for the explorer's first choice (cross-attention or
            the first kind, layer 0, head 0, the last query), or a selection ``{"kind", "layer", "head", "query"}``.
    Raises:
        AiaynError: an empty input or one that is not Unicode text (a lone surrogate), or a checkpoint of an unknown
            task.
    """
    if not text.strip():
        raise AiaynError("the input is empty; give a sentence to inspect")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise AiaynError(f"the input holds a lone surrogate (\\u{ord(text[e.start]):04x}) at character {e.start}, "
                         "which is not Unicode text; give the text as UTF-8") from None
    if pre.config.input == "patches":
        raise AiaynError("this checkpoint reads images, not text: inspect one with aiayn inspect -i IMAGE.png")
    if pre.task not in TASKS:
        raise AiaynError(f"a {pre.task!r} checkpoint: aiayn inspect reads {', '.join(TASKS)} checkpoints")
    pre.model.eval()
    if pre.task == "translation":
        record = _translation(pre, text, beam=beam, alpha=alpha, layers=layers, digits=digits)
    else:
        run = {"lm": _lm, "classification": _classification, "mlm": _mlm}[pre.task]
        record = run(pre, text, layers=layers, digits=digits)
    record = {"input": text, "model": _model_summary(pre), **record}
    if steps:
        chosen = default_selection(record) if steps is True else dict(steps)
        record["steps"] = step_record(pre, record["ids"], **chosen)
    return record


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _translation(pre: Pretrained, text: str, *, beam: int | None, alpha: float | None, layers: list[int] | None,
                 digits: int | None) -> dict[str, Any]:
    src_tok, tgt_tok, model = pre.tokenizers["src"], pre.tokenizers["tgt"], pre.model
    decode = {**DECODE_DEFAULTS, **(pre.meta.get("decode") or {})}
    beam = int(decode["beam"] if beam is None else beam)
    decode["alpha"] = decode["alpha"] if alpha is None else alpha
    limit = source_limit(model)
    full = source_ids(src_tok, text)
    ids = source_ids(src_tok, text, limit)
    src = torch.tensor([ids], device=_device(model))
    forced = decode.get("forced_bos_id")
    hyp = translate(model, src, beam_size=beam, alpha=decode["alpha"], max_len_a=decode["max_len_a"],
                    max_len_b=decode["max_len_b"], bos_id=tgt_tok.bos_id, eos_id=tgt_tok.eos_id,
                    pad_id=tgt_tok.pad_id, start_id=tgt_tok.decoder_start_id, vocab_size=tgt_tok.vocab_size,
                    forced_first_id=forced)[0][0]
    start = [tgt_tok.decoder_start_id] + ([forced] if forced is not None else [])
    out_ids = list(hyp.tokens)
    tgt_in = torch.tensor([start + [i for i in out_ids if i != tgt_tok.eos_id]], device=src.device)
    with capture_attention(model, layers) as capture:
        model(src, tgt_in, compute_logits=False)
    enc, dec = _tokens(src_tok, ids), _tokens(tgt_tok, tgt_in[0].tolist())
    record = _attention(capture, {"encoder": (enc, enc), "decoder": (dec, dec), "cross": (dec, enc)},
                        pre.config, digits)
    cut = _cut(len(full), ids, limit, "first", src_tok.decode,
               f"only its first {limit} tokens were translated (split it into sentences to translate it all)")
    return _finish({"tokens": {"encoder": enc, "decoder": dec}, **record,
                    "ids": {"encoder": ids, "decoder": tgt_in[0].tolist()},
                    "positions": {k: _positions(model, capture, pre.config, len(t), digits, k)
                                  for k, t in (("encoder", enc), ("decoder", dec))},
                    "output": {"kind": "translation", "text": tgt_tok.decode(out_ids),
                               "tokens": _tokens(tgt_tok, out_ids), "beam": beam,
                               "method": "greedy" if beam == 1 else f"beam search, {beam} beams",
                               "score": float(hyp.score)}}, cut, _unknown_note(full, src_tok.unk_id))


def _lm(pre: Pretrained, text: str, *, layers: list[int] | None,
        digits: int | None) -> dict[str, Any]:
    model, codec = pre.model, codec_from_meta(pre.tokenizers["text"], pre.meta)
    context = min(pre.meta.get("block_size") or pre.config.max_len, pre.config.max_len)
    full = codec.encode(text)
    if not full:
        raise AiaynError("the input has no tokens for this model's tokenizer; give a text of its language")
    ids = full[-context:]
    with capture_attention(model, layers) as capture:
        logits = model(torch.tensor([ids], device=_device(model))).logits[0, -1].float()  # (V,)
    tok = codec.tokenizer
    tokens = _tokens(tok, ids)
    top = torch.topk(logits, min(NEXT_TOKENS, logits.numel()))
    log_z = float(torch.logsumexp(logits, 0))
    record = _attention(capture, {"decoder": (tokens, tokens)}, pre.config, digits)
    cut = _cut(len(full), ids, context, "last", codec.decode,
               f"the next token is predicted from its last {context} tokens only (shorten it to see it all)")
    return _finish({"tokens": {"decoder": tokens}, **record, "ids": {"decoder": ids},
                    "positions": {"decoder": _positions(model, capture, pre.config, len(tokens), digits, "decoder")},
                    "output": {"kind": "next_token", "tokens": _tokens(tok, top.indices.tolist()),
                               "ids": top.indices.tolist(), "logits": _round(top.values, 4), "log_z": log_z,
                               "vocab_size": int(logits.numel())}}, cut, _unknown_note(full, tok.unk_id))


def _encoder_ids(pre: Pretrained, text: str) -> tuple[list[int], dict[str, Any] | None, list[str]]:
    """The ids an encoder reads for ``text`` (``[BOS] tokens [EOS]`` cut to its length), the record's ``cut`` and
    its note on unknown tokens."""
    tok = pre.tokenizers["text"]
    max_len = int(pre.meta.get("max_len") or pre.config.max_len)
    framed = encode_for_classifier(tok, [text])  # tokens [EOS]; the collator prepends BOS
    batch = collate_classification(framed, [0], tok.pad_id, max_len, cls_id=tok.bos_id)
    ids = batch.input_ids[0].tolist()
    what = "classified" if pre.task == "classification" else "read"
    cut = _cut(len(framed[0]) + 1, ids, max_len, "first", tok.decode,
               f"only its first {max_len - 1} tokens are {what} (the model takes {max_len} with the start token)")
    return ids, cut, _unknown_note(framed[0][:-1], tok.unk_id)


def _classification(pre: Pretrained, text: str, *, layers: list[int] | None,
                    digits: int | None) -> dict[str, Any]:
    model, tok = pre.model, pre.tokenizers["text"]
    ids, cut, unknown = _encoder_ids(pre, text)
    x = torch.tensor([ids], device=_device(model))
    with capture_attention(model, layers) as capture:
        probs = model(x, torch.ones_like(x, dtype=torch.bool), task="classify").logits[0].float().softmax(-1)
    tokens = _tokens(tok, ids)
    labels = display_labels(pre.meta)
    best = int(probs.argmax())
    record = _attention(capture, {"encoder": (tokens, tokens)}, pre.config, digits)
    return _finish({"tokens": {"encoder": tokens}, **record, "ids": {"encoder": ids},
                    "positions": {"encoder": _positions(model, capture, pre.config, len(tokens), digits, "encoder")},
                    "output": {"kind": "classification", "labels": labels, "probs": _round(probs, 6),
                               "prediction": labels[best], "probability": float(probs[best])}}, cut, unknown)


def _mlm(pre: Pretrained, text: str, *, layers: list[int] | None,
         digits: int | None) -> dict[str, Any]:
    model, tok = pre.model, pre.tokenizers["text"]
    ids, cut, unknown = _encoder_ids(pre, text)
    x = torch.tensor([ids], device=_device(model))
    with capture_attention(model, layers) as capture:
        logits = model(x, torch.ones_like(x, dtype=torch.bool)).logits[0].float()  # (T, V)
    tokens = _tokens(tok, ids)
    record = _attention(capture, {"encoder": (tokens, tokens)}, pre.config, digits)
    best = logits.argmax(-1).tolist()
    return _finish({"tokens": {"encoder": tokens}, **record, "ids": {"encoder": ids},
                    "positions": {"encoder": _positions(model, capture, pre.config, len(tokens), digits, "encoder")},
                    "output": {"kind": "masked_lm", "predicted": _tokens(tok, best)}}, cut, unknown)

