"""BERT: ``BertForMaskedLM`` (task "mlm"), ``BertForSequenceClassification`` (task "classification") and the bare
``BertModel`` (task "embedding", sentence-transformers folders included).

BERT is the ``bert-base`` preset's shape: learned positions, token-type (segment) embeddings and a LayerNorm after
the embeddings (``n_token_types``, ``embedding_norm``), post-LN, GELU, biases everywhere. ``query``, ``key`` and
``value`` are stacked into aiayn's ``qkv_proj``. The masked-LM head (``cls.predictions``: dense, GELU, LayerNorm,
the tied output layer and its bias) is aiayn's ``mlm_head``; the pooler (dense + tanh on ``[CLS]``) and the
classifier are aiayn's ``cls_head``.

A masked-LM folder's pooler and next-sentence head (``BertForPreTraining``) are not converted: aiayn's masked-LM
model has no such parts. A classifier has no masked-LM head; its aiayn ``mlm_head`` is written as zeros. A
classifier's labels are its class ids (``"0"``, ``"1"``, ...: what a GLUE file writes) and its ``id2label`` names
them.

A bare ``BertModel`` (what a sentence-transformers folder holds at its root, its keys with or without the ``bert.``
prefix) is the encoder alone: its pooling comes from the sentence-transformers files (:mod:`aiayn.hf.sentence`),
else mean pooling without normalisation. Its pooler (dense + tanh on ``[CLS]``, which sentence-transformers does not
use) is not kept, so the ``BertModel`` written back has none and transformers initialises one afresh on loading;
aiayn's ``mlm_head`` is zeros with its output layer tied to the embedding (no weights of its own; unused).
"""

from __future__ import annotations

import re
from typing import Any

import torch

from aiayn.config import ModelConfig
from aiayn.hf.family import Family, StateDict, StateReader, mismatches, refuse, register
from aiayn.hf.sentence import default_entry

#: transformers' activation names -> aiayn's (activation, gelu_approximate)
ACTIVATIONS = {"gelu": ("gelu", "none"), "gelu_new": ("gelu", "tanh"), "gelu_pytorch_tanh": ("gelu", "tanh"),
               "relu": ("relu", "none"), "silu": ("silu", "none"), "swish": ("silu", "none")}


def activation_from_hf(name: Any, key: str, allowed: tuple[str, ...] = tuple(ACTIVATIONS)
                       ) -> tuple[tuple[str, str] | None, list[str]]:
    """aiayn's (activation, gelu_approximate) for transformers' activation ``name`` (read from ``key``), or None
    and the problem."""
    if name in allowed:
        return ACTIVATIONS[name], []
    return None, [f"{key}={name!r}: aiayn converts {', '.join(allowed)}"]


def activation_to_hf(config: ModelConfig) -> str:
    """transformers' name of an ungated aiayn activation ("gelu", "gelu_new", "relu" or "silu")."""
    if config.activation == "gelu":
        return "gelu_new" if config.gelu_approximate == "tanh" else "gelu"
    return config.activation


def number(hf: dict[str, Any], key: str, default: float) -> float:
    """A float entry of a transformers config (null -> ``default``)."""
    value = hf.get(key)
    return float(default if value is None else value)


def _legacy_names(state: StateDict) -> StateDict:
    """Old BERT checkpoints name LayerNorm parameters ``gamma``/``beta`` and may lack the ``bert.`` prefix."""
    out = {}
    for key, value in state.items():
        key = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", key)
        key = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", key)
        if key.startswith(("embeddings.", "encoder.", "pooler.")):
            key = "bert." + key
        out[key] = value
    return out


# ---------------------------------------------------------------------------------------------- config
def _labels(hf: dict[str, Any]) -> tuple[int, list[str] | None, list[str]]:
    """(number of classes, their names from ``id2label`` or None, problems)."""
    id2label = hf.get("id2label") or {}
    names = {int(k): str(v) for k, v in id2label.items()} if isinstance(id2label, dict) else {}
    n = int(hf.get("num_labels") or len(names) or 2)
    problems = []
    if n < 2:
        problems.append(f"num_labels={n}: a regression head; aiayn's classifier picks one of two or more labels")
    problem_type = hf.get("problem_type")
    if problem_type not in (None, "single_label_classification"):
        problems.append(f"problem_type={problem_type!r}: aiayn's classifier is single-label")
    shown = [names.get(i, "") for i in range(n)]
    default = all(s == f"LABEL_{i}" for i, s in enumerate(shown))
    valid = all(s.strip() and "\t" not in s and "\n" not in s for s in shown) and len(set(shown)) == n
    return n, (shown if valid and not default else None), problems


def _bert_fields(hf: dict[str, Any], family: str) -> dict[str, Any]:
    act, problems = activation_from_hf(hf.get("hidden_act", "gelu"), "hidden_act",
                                       ("gelu", "gelu_new", "gelu_pytorch_tanh"))
    kind = hf.get("position_embedding_type", "absolute")
    if kind not in (None, "absolute"):
        problems.append(f"position_embedding_type={kind!r}: aiayn converts BERT with absolute (learned) positions")
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        problems.append("is_decoder/add_cross_attention=true: a causal BERT is not a masked-LM encoder")
    d, heads = int(hf.get("hidden_size", 768)), int(hf.get("num_attention_heads", 12))
    if heads and d % heads:
        problems.append(f"hidden_size={d}: not divisible by num_attention_heads={heads}")
    vocab = int(hf.get("vocab_size", 30522))
    pad = hf.get("pad_token_id")
    types = int(hf.get("type_vocab_size", 2) or 0)
    refuse(family, problems)
    activation, approx = act  # type: ignore[misc]
    return dict(arch="encoder", vocab_size=vocab, d_model=d, n_heads=heads,
                n_layers=int(hf.get("num_hidden_layers", 12)), d_ff=int(hf.get("intermediate_size", 4 * d)),
                max_len=int(hf.get("max_position_embeddings", 512)), dropout=number(hf, "hidden_dropout_prob", 0.1),
                attn_dropout=number(hf, "attention_probs_dropout_prob", 0.1), activation=activation,
                gelu_approximate=approx, norm="layernorm", norm_eps=number(hf, "layer_norm_eps", 1e-12),
                norm_position="post", position="learned", scale_embeddings=False, embedding_norm=True,
                n_token_types=types or None, bias=True, tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
                init="gpt2", pooling="cls", n_classes=None,
                pad_id=pad if isinstance(pad, int) and 0 <= pad < vocab else 0, name=family)


def mlm_config_from_hf(hf: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    fields = _bert_fields(hf, "bert")
    return fields, {"max_len": fields["max_len"]}


def classifier_config_from_hf(hf: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    fields = _bert_fields(hf, "bert")
    n, names, problems = _labels(hf)
    refuse("bert", problems)
    meta: dict[str, Any] = {"labels": [str(i) for i in range(n)], "max_len": fields["max_len"]}
    if names is not None:
        meta["label_names"] = names
    return {**fields, "n_classes": n}, meta


def embedding_config_from_hf(hf: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    fields = {**_bert_fields(hf, "bert"), "tie_embeddings": True}  # the unused masked-LM output layer: the embedding
    return fields, {"max_len": fields["max_len"], "embedding": default_entry("mean")}


def _wanted(config: ModelConfig) -> dict[str, Any]:
    return dict(arch="encoder", position="learned", position_offset=0, norm="layernorm", norm_position="post",
                deepnorm=False, activation="gelu", bias=True, qkv_bias=(None, True), n_kv_heads=(None, config.n_heads),
                scale_embeddings=False, embedding_norm=True, sliding_window=None)


def _bert_to_hf(config: ModelConfig, hf_class: str) -> dict[str, Any]:
    c = config
    return {"model_type": "bert", "architectures": [hf_class], "vocab_size": c.vocab_size, "hidden_size": c.d_model,
            "num_hidden_layers": c.n_layers, "num_attention_heads": c.n_heads, "intermediate_size": c.d_ff,
            "hidden_act": activation_to_hf(c), "hidden_dropout_prob": c.dropout,
            "attention_probs_dropout_prob": c.attn_dropout, "max_position_embeddings": c.max_len,
            "type_vocab_size": c.n_token_types or 1, "layer_norm_eps": c.norm_eps,
            "position_embedding_type": "absolute", "tie_word_embeddings": c.tie_embeddings, "is_decoder": False,
            "add_cross_attention": False}


def mlm_config_to_hf(config: ModelConfig, meta: dict[str, Any]) -> dict[str, Any]:
    refuse("bert", mismatches(config, _wanted(config), "BERT"))
    return _bert_to_hf(config, "BertForMaskedLM")


def classifier_config_to_hf(config: ModelConfig, meta: dict[str, Any]) -> dict[str, Any]:
    refuse("bert", mismatches(config, {**_wanted(config), "pooling": "cls"}, "BERT's classifier"))
    n = int(config.n_classes or 0)
    labels = [str(x) for x in meta.get("label_names") or meta.get("labels") or range(n)]
    if len(labels) != n:
        refuse("bert", [f"labels={labels}: the model has {n} classes"])
    return {**_bert_to_hf(config, "BertForSequenceClassification"), "num_labels": n,
            "id2label": {str(i): x for i, x in enumerate(labels)}, "label2id": {x: i for i, x in enumerate(labels)},
            "problem_type": "single_label_classification"}


def embedding_config_to_hf(config: ModelConfig, meta: dict[str, Any]) -> dict[str, Any]:
    refuse("bert", mismatches(config, {**_wanted(config), "n_classes": None}, "BertModel"))
    base = meta.get("hf_config") if isinstance(meta.get("hf_config"), dict) else {}
    return {**_bert_to_hf(config, "BertModel"), "tie_word_embeddings": bool(base.get("tie_word_embeddings", True))}


# ---------------------------------------------------------------------------------------------- weights
#: (transformers' name inside a layer, aiayn's name inside a layer) of the linear layers and norms kept as they are
_LAYER = (("attention.output.dense", "self_attn.out_proj"), ("attention.output.LayerNorm", "self_res.norm"),
          ("intermediate.dense", "ffn.w_in"), ("output.dense", "ffn.w_out"), ("output.LayerNorm", "ffn_res.norm"))


def _encoder_from_hf(r: StateReader, config: ModelConfig) -> StateDict:
    e = "bert.embeddings."
    out = {"embed.weight": r.take(e + "word_embeddings.weight"),
           "encoder.abs_pos.weight.weight": r.take(e + "position_embeddings.weight"),
           "encoder.embed_norm.weight": r.take(e + "LayerNorm.weight"),
           "encoder.embed_norm.bias": r.take(e + "LayerNorm.bias")}
    types = r.take(e + "token_type_embeddings.weight")
    if config.n_token_types is not None:
        out["encoder.token_type_embed.weight"] = types
    for i in range(config.n_layers):
        src, dst = f"bert.encoder.layer.{i}.", f"encoder.layers.{i}."
        a = src + "attention.self."
        for p in ("weight", "bias"):
            out[f"{dst}self_attn.qkv_proj.{p}"] = torch.cat([r.take(f"{a}{n}.{p}") for n in ("query", "key", "value")])
            for theirs, mine in _LAYER:
                out[f"{dst}{mine}.{p}"] = r.take(f"{src}{theirs}.{p}")
    return out


def _same_as(r: StateReader, key: str, other: torch.Tensor, why: str) -> None:
    """Take ``key`` when the folder stores it, refusing a value that differs from the weight it is tied to."""
    if key in r and not torch.equal(r.take(key), other):
        refuse("bert", [f"{key} differs from {why}, to which aiayn's model ties it"])


def mlm_state_from_hf(state: StateDict, config: ModelConfig, hf: dict[str, Any]) -> StateDict:
    r = StateReader(_legacy_names(state), ignore=(r"^bert\.pooler\.", r"^cls\.seq_relationship\.",
                                                  r"position_ids$"))
    out = _encoder_from_hf(r, config)
    p = "cls.predictions."
    out["mlm_head.bias"] = r.take(p + "bias")
    _same_as(r, p + "decoder.bias", out["mlm_head.bias"], p + "bias")
    for theirs, mine in (("transform.dense", "dense"), ("transform.LayerNorm", "norm")):
        for q in ("weight", "bias"):
            out[f"mlm_head.{mine}.{q}"] = r.take(f"{p}{theirs}.{q}")
    if config.tie_embeddings:
        _same_as(r, p + "decoder.weight", out["embed.weight"], "the word embeddings")
    else:
        out["mlm_head.decoder.proj.weight"] = r.take(p + "decoder.weight")
    r.done()
    return out


def _no_mlm_head(config: ModelConfig) -> StateDict:
    """aiayn's masked-LM head for a folder without one (a classifier, a bare encoder): zeros."""
    d, v = config.d_model, config.vocab_size
    out = {"mlm_head.bias": torch.zeros(v), "mlm_head.dense.weight": torch.zeros(d, d),
           "mlm_head.dense.bias": torch.zeros(d), "mlm_head.norm.weight": torch.ones(d),
           "mlm_head.norm.bias": torch.zeros(d)}
    if not config.tie_embeddings:
        out["mlm_head.decoder.proj.weight"] = torch.zeros(v, d)
    return out


def classifier_state_from_hf(state: StateDict, config: ModelConfig, hf: dict[str, Any]) -> StateDict:
    r = StateReader(_legacy_names(state), ignore=(r"position_ids$",))
    out = _encoder_from_hf(r, config)
    for theirs, mine in (("bert.pooler.dense", "cls_head.dense"), ("classifier", "cls_head.out")):
        for q in ("weight", "bias"):
            out[f"{mine}.{q}"] = r.take(f"{theirs}.{q}")
    r.done()
    return {**out, **_no_mlm_head(config)}


def embedding_state_from_hf(state: StateDict, config: ModelConfig, hf: dict[str, Any]) -> StateDict:
    r = StateReader(_legacy_names(state), ignore=(r"^bert\.pooler\.", r"position_ids$"))
    out = _encoder_from_hf(r, config)
    r.done()
    return {**out, **_no_mlm_head(config)}


def _encoder_to_hf(state: StateDict, config: ModelConfig) -> StateDict:
    e = "bert.embeddings."
    types = state.get("encoder.token_type_embed.weight")
    out = {e + "word_embeddings.weight": state["embed.weight"],
           e + "position_embeddings.weight": state["encoder.abs_pos.weight.weight"],
           e + "token_type_embeddings.weight": types if types is not None else torch.zeros(1, config.d_model),
           e + "LayerNorm.weight": state["encoder.embed_norm.weight"],
           e + "LayerNorm.bias": state["encoder.embed_norm.bias"]}
    for i in range(config.n_layers):
        src, dst = f"encoder.layers.{i}.", f"bert.encoder.layer.{i}."
        for p in ("weight", "bias"):
            for n, part in zip(("query", "key", "value"), state[f"{src}self_attn.qkv_proj.{p}"].chunk(3)):
                out[f"{dst}attention.self.{n}.{p}"] = part
            for theirs, mine in _LAYER:
                out[f"{dst}{theirs}.{p}"] = state[f"{src}{mine}.{p}"]
    return out


def mlm_state_to_hf(state: StateDict, config: ModelConfig) -> StateDict:
    out = _encoder_to_hf(state, config)
    p = "cls.predictions."
    out[p + "bias"] = state["mlm_head.bias"]
    for theirs, mine in (("transform.dense", "dense"), ("transform.LayerNorm", "norm")):
        for q in ("weight", "bias"):
            out[f"{p}{theirs}.{q}"] = state[f"mlm_head.{mine}.{q}"]
    if not config.tie_embeddings:
        out[p + "decoder.weight"] = state["mlm_head.decoder.proj.weight"]
    return out


def classifier_state_to_hf(state: StateDict, config: ModelConfig) -> StateDict:
    out = _encoder_to_hf(state, config)
    for theirs, mine in (("bert.pooler.dense", "cls_head.dense"), ("classifier", "cls_head.out")):
        for q in ("weight", "bias"):
            out[f"{theirs}.{q}"] = state[f"{mine}.{q}"]
    return out


def embedding_state_to_hf(state: StateDict, config: ModelConfig) -> StateDict:
    return {k.removeprefix("bert."): v for k, v in _encoder_to_hf(state, config).items()}  # as BertModel saves


register(Family(name="bert", model_types=("bert",), task="mlm", hf_class="BertForMaskedLM",
                config_from_hf=mlm_config_from_hf, state_from_hf=mlm_state_from_hf,
                config_to_hf=mlm_config_to_hf, state_to_hf=mlm_state_to_hf,
                architectures=("BertForMaskedLM", "BertForPreTraining")))

register(Family(name="bert-classifier", model_types=("bert",), task="classification",
                hf_class="BertForSequenceClassification", config_from_hf=classifier_config_from_hf,
                state_from_hf=classifier_state_from_hf, config_to_hf=classifier_config_to_hf,
                state_to_hf=classifier_state_to_hf, architectures=("BertForSequenceClassification",)))

register(Family(name="bert-embedding", model_types=("bert",), task="embedding", hf_class="BertModel",
                config_from_hf=embedding_config_from_hf, state_from_hf=embedding_state_from_hf,
                config_to_hf=embedding_config_to_hf, state_to_hf=embedding_state_to_hf,
                architectures=("BertModel",)))
