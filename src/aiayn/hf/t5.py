"""T5 v1.0 and v1.1: ``T5ForConditionalGeneration`` (task "translation").

T5 is the ``t5-small`` preset's shape: RMSNorm without biases, pre-LN, unscaled attention with a relative position
bias (``position="t5"``) that the first layer of each stack holds and every layer adds, no bias on any linear layer,
one embedding shared by encoder and decoder.

- v1.0 (``feed_forward_proj="relu"``) ties the output layer to the embedding and multiplies the decoder's output by
  d_model^-0.5 before it (``tied_output_scale``).
- v1.1 (``feed_forward_proj="gated-gelu"``) has GeGLU with GELU's tanh approximation (``wi_0`` is the gate,
  ``wi_1`` the linear half: aiayn's ``w_in`` is ``[wi_0; wi_1]``) and an output layer of its own, unscaled.

transformers 5 writes every T5 config with ``tie_word_embeddings=true`` and tells the two apart by
``scale_decoder_outputs``; older configs say ``tie_word_embeddings=false`` for v1.1. A v1.1 folder that stores no
``lm_head.weight`` has its output layer tied in transformers, so aiayn's output layer starts as a copy of the
embedding. The decoder starts from ``<pad>`` (``decoder_start_token_id`` 0), and one SentencePiece vocabulary serves
both languages. T5's task prefixes ("translate English to German: ") are part of the input text.

A checkpoint whose ``d_kv * num_heads`` is not ``d_model`` (t5-v1_1-small, flan-t5-small: 6 heads of 64 in 512)
sets ``head_dim`` to ``d_kv``; otherwise ``head_dim`` stays null (d_model / n_heads).
"""

from __future__ import annotations

from typing import Any

import torch

from aiayn.config import ModelConfig
from aiayn.hf.bart import translation_meta
from aiayn.hf.bert import number
from aiayn.hf.family import Family, StateDict, StateReader, mismatches, refuse, register

#: T5's ``feed_forward_proj`` -> aiayn's (activation, gelu_approximate)
FEED_FORWARD = {"relu": ("relu", "none"), "gelu": ("gelu", "none"), "gelu_new": ("gelu", "tanh"),
                "silu": ("silu", "none"), "swish": ("silu", "none"), "gated-gelu": ("geglu", "tanh"),
                "gated-gelu_new": ("geglu", "tanh"), "gated-silu": ("swiglu", "none")}


def _scaled(hf: dict[str, Any]) -> bool:
    """Whether the decoder's output is rescaled before the output layer (v1.0) — then the layer is tied."""
    if "scale_decoder_outputs" in hf:
        return bool(hf["scale_decoder_outputs"])
    return hf.get("tie_word_embeddings", True) is not False


def t5_config_from_hf(hf: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    problems = []
    proj = hf.get("feed_forward_proj", "relu")
    if proj not in FEED_FORWARD:
        problems.append(f"feed_forward_proj={proj!r}: aiayn converts {', '.join(FEED_FORWARD)}")
    d, heads = int(hf.get("d_model", 512)), int(hf.get("num_heads", 8))
    d_kv = int(hf.get("d_kv", d // max(heads, 1)))
    if hf.get("is_encoder_decoder", True) is False:
        problems.append("is_encoder_decoder=false: aiayn converts T5's encoder-decoder")
    refuse("t5", problems)
    activation, approx = FEED_FORWARD[proj]
    scaled = _scaled(hf)
    vocab = int(hf.get("vocab_size", 32128))
    pad = hf.get("pad_token_id")
    enc = int(hf.get("num_layers", 6))
    dec = hf.get("num_decoder_layers")
    fields = dict(arch="encoder-decoder", vocab_size=vocab, d_model=d, n_heads=heads,
                  head_dim=None if d_kv * heads == d else d_kv,
                  n_layers=int(dec) if dec is not None else enc, n_encoder_layers=enc, d_ff=int(hf.get("d_ff", 2048)),
                  max_len=int(hf.get("n_positions") or 512), dropout=number(hf, "dropout_rate", 0.1),
                  activation=activation, gelu_approximate=approx, norm="rmsnorm",
                  norm_eps=number(hf, "layer_norm_epsilon", 1e-6), norm_position="pre", position="t5",
                  t5_num_buckets=int(hf.get("relative_attention_num_buckets", 32)),
                  t5_max_distance=int(hf.get("relative_attention_max_distance", 128)), bias=False,
                  scale_embeddings=False, tie_embeddings=scaled, tied_output_scale=scaled,
                  share_src_tgt_embeddings=True, init="gpt2",
                  pad_id=pad if isinstance(pad, int) and 0 <= pad < vocab else 0, name="t5")
    return fields, translation_meta(hf)


def t5_config_to_hf(config: ModelConfig, meta: dict[str, Any]) -> dict[str, Any]:
    c = config
    wanted = dict(arch="encoder-decoder", position="t5", norm="rmsnorm", norm_position="pre", deepnorm=False,
                  bias=False, qkv_bias=(None, False), n_kv_heads=(None, c.n_heads), scale_embeddings=False,
                  embedding_norm=False, output_bias=False, share_src_tgt_embeddings=True,
                  tgt_vocab_size=(None, c.vocab_size), sliding_window=None, tied_output_scale=c.tie_embeddings,
                  activation=("relu", "gelu", "silu", "swiglu", "geglu"))
    problems = mismatches(c, wanted, "T5")
    if c.activation == "geglu" and c.gelu_approximate != "tanh":
        problems.append("activation='geglu' with gelu_approximate='none': T5's gated-gelu is GELU's tanh "
                        "approximation")
    refuse("t5", problems)
    if c.activation in ("geglu", "swiglu"):
        proj = "gated-gelu" if c.activation == "geglu" else "gated-silu"
    else:
        proj = {"gelu": "gelu_new" if c.gelu_approximate == "tanh" else "gelu"}.get(c.activation, c.activation)
    return {"model_type": "t5", "architectures": ["T5ForConditionalGeneration"], "vocab_size": c.vocab_size,
            "d_model": c.d_model, "d_kv": c.head_dim, "d_ff": c.d_ff, "num_layers": c.encoder_layers,
            "num_decoder_layers": c.n_layers, "num_heads": c.n_heads,
            "relative_attention_num_buckets": c.t5_num_buckets,
            "relative_attention_max_distance": c.t5_max_distance, "dropout_rate": c.dropout,
            "layer_norm_epsilon": c.norm_eps, "feed_forward_proj": proj, "is_encoder_decoder": True,
            "tie_word_embeddings": c.tie_embeddings, "scale_decoder_outputs": c.tied_output_scale,
            "n_positions": c.max_len}


def _gated(config: ModelConfig) -> bool:
    return config.activation in ("geglu", "swiglu")


def _stacks(config: ModelConfig) -> tuple[tuple[str, int, bool], ...]:
    """(transformers' stack name, layers, has cross-attention) of the encoder and the decoder."""
    return ("encoder", config.encoder_layers, False), ("decoder", config.n_layers, True)


def t5_state_from_hf(state: StateDict, config: ModelConfig, hf: dict[str, Any]) -> StateDict:
    r = StateReader(state, ignore=(r"^decoder\.block\.0\.layer\.1\.EncDecAttention\.relative_attention_bias\.",))
    shared = r.take("shared.weight")
    out = {"src_embed.weight": shared}
    for key in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
        if key in r and not torch.equal(r.take(key), shared):
            refuse("t5", [f"{key} differs from shared.weight; aiayn's encoder and decoder share one embedding"])
    for stack, n, cross in _stacks(config):
        out[f"{stack}.pos_bias.embedding.weight"] = r.take(
            f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight")
        out[f"{stack}.final_norm.weight"] = r.take(f"{stack}.final_layer_norm.weight")
        for i in range(n):
            src, dst = f"{stack}.block.{i}.layer.", f"{stack}.layers.{i}."
            a = src + "0.SelfAttention."
            out[dst + "self_attn.qkv_proj.weight"] = torch.cat([r.take(f"{a}{p}.weight") for p in "qkv"])
            out[dst + "self_attn.out_proj.weight"] = r.take(a + "o.weight")
            out[dst + "self_res.norm.weight"] = r.take(src + "0.layer_norm.weight")
            if cross:
                c = src + "1.EncDecAttention."
                out[dst + "cross_attn.q_proj.weight"] = r.take(c + "q.weight")
                out[dst + "cross_attn.kv_proj.weight"] = torch.cat([r.take(c + "k.weight"), r.take(c + "v.weight")])
                out[dst + "cross_attn.out_proj.weight"] = r.take(c + "o.weight")
                out[dst + "cross_res.norm.weight"] = r.take(src + "1.layer_norm.weight")
            f = f"{src}{2 if cross else 1}."
            if _gated(config):
                w_in = torch.cat([r.take(f + "DenseReluDense.wi_0.weight"), r.take(f + "DenseReluDense.wi_1.weight")])
            else:
                w_in = r.take(f + "DenseReluDense.wi.weight")
            out[dst + "ffn.w_in.weight"] = w_in
            out[dst + "ffn.w_out.weight"] = r.take(f + "DenseReluDense.wo.weight")
            out[dst + "ffn_res.norm.weight"] = r.take(f + "layer_norm.weight")
    head = r.take("lm_head.weight") if "lm_head.weight" in r else None
    if config.tie_embeddings:
        if head is not None and not torch.equal(head, shared):
            refuse("t5", ["lm_head.weight differs from shared.weight, but the config rescales the decoder's output "
                          "(T5 v1.0), which aiayn does only before a tied output layer"])
    else:
        out["lm_head.proj.weight"] = (head if head is not None else shared).clone()
    r.done()
    return out


def t5_state_to_hf(state: StateDict, config: ModelConfig) -> StateDict:
    out = {"shared.weight": state["src_embed.weight"]}
    for stack, n, cross in _stacks(config):
        out[f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = \
            state[f"{stack}.pos_bias.embedding.weight"]
        out[f"{stack}.final_layer_norm.weight"] = state[f"{stack}.final_norm.weight"]
        for i in range(n):
            src, dst = f"{stack}.layers.{i}.", f"{stack}.block.{i}.layer."
            a = dst + "0.SelfAttention."
            for p, part in zip("qkv", state[src + "self_attn.qkv_proj.weight"].chunk(3)):
                out[f"{a}{p}.weight"] = part
            out[a + "o.weight"] = state[src + "self_attn.out_proj.weight"]
            out[dst + "0.layer_norm.weight"] = state[src + "self_res.norm.weight"]
            if cross:
                c = dst + "1.EncDecAttention."
                out[c + "q.weight"] = state[src + "cross_attn.q_proj.weight"]
                out[c + "k.weight"], out[c + "v.weight"] = state[src + "cross_attn.kv_proj.weight"].chunk(2)
                out[c + "o.weight"] = state[src + "cross_attn.out_proj.weight"]
                out[dst + "1.layer_norm.weight"] = state[src + "cross_res.norm.weight"]
            f = f"{dst}{2 if cross else 1}."
            if _gated(config):
                gate, up = state[src + "ffn.w_in.weight"].chunk(2)
                out[f + "DenseReluDense.wi_0.weight"], out[f + "DenseReluDense.wi_1.weight"] = gate, up
            else:
                out[f + "DenseReluDense.wi.weight"] = state[src + "ffn.w_in.weight"]
            out[f + "DenseReluDense.wo.weight"] = state[src + "ffn.w_out.weight"]
            out[f + "layer_norm.weight"] = state[src + "ffn_res.norm.weight"]
    if not config.tie_embeddings:
        out["lm_head.weight"] = state["lm_head.proj.weight"]
    return out


register(Family(name="t5", model_types=("t5",), task="translation", hf_class="T5ForConditionalGeneration",
                config_from_hf=t5_config_from_hf, state_from_hf=t5_state_from_hf, config_to_hf=t5_config_to_hf,
                state_to_hf=t5_state_to_hf, architectures=("T5ForConditionalGeneration",)))
