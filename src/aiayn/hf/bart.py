"""BART and Marian: ``BartForConditionalGeneration`` and ``MarianMTModel`` (task "translation").

Both are the paper's post-LN encoder-decoder with biases everywhere, one embedding shared by encoder, decoder and
the output layer, and a bias on the output layer (``final_logits_bias`` -> ``output_bias``). ``q_proj``, ``k_proj``
and ``v_proj`` are stacked into ``qkv_proj``; cross-attention's ``k_proj`` and ``v_proj`` into ``kv_proj``.

- BART (the ``bart-base`` preset): learned positions read from table row position + 2 (``position_offset``), a
  LayerNorm after the embeddings (``layernorm_embedding`` -> ``embedding_norm``), GELU; pad is 1, and the decoder
  starts from ``</s>`` (``decoder_start_token_id`` 2).
- Marian (the ``marian`` preset, opus-mt): sinusoidal positions with all sines before all cosines
  (``sinusoidal_layout="halves"``; the fixed table that older folders store is not read, and not written: both
  sides compute it), SiLU ("swish"),
  embeddings scaled by sqrt(d_model); pad is the vocabulary's last id, and the decoder starts from it.

A Marian model with separate source and target vocabularies (``share_encoder_decoder_embeddings=false``) has no
aiayn counterpart here: the converted checkpoint holds one joint vocabulary.
"""

from __future__ import annotations

from typing import Any

import torch

from aiayn.config import ModelConfig
from aiayn.generate.translate import DECODE_DEFAULTS
from aiayn.hf.bert import activation_from_hf, activation_to_hf, number
from aiayn.hf.family import Family, StateDict, StateReader, mismatches, refuse, register
from aiayn.nn.positions import sinusoidal_table

#: the translation task's decoding defaults for a converted model (aiayn's: beam 4, GNMT alpha 0.6, input + 50)


def translation_meta(hf: dict[str, Any]) -> dict[str, Any]:
    """The translation task's checkpoint entries for a converted seq2seq model: aiayn's decoding defaults, with the
    config's ``num_beams`` when it names more than one and its ``forced_bos_token_id`` as ``forced_bos_id``; no
    lower-casing."""
    beams = hf.get("num_beams")
    decode = {**DECODE_DEFAULTS, **({"beam": int(beams)} if isinstance(beams, int) and beams > 1 else {})}
    forced = hf.get("forced_bos_token_id")  # every output begins with it (bart-large-cnn, mBART-like models)
    if isinstance(forced, int) and not isinstance(forced, bool):
        decode["forced_bos_id"] = forced
    return {"decode": decode, "lowercase": False}


# ---------------------------------------------------------------------------------------------- config
def _fields(hf: dict[str, Any], family: str, default_act: str) -> tuple[dict[str, Any], list[str]]:
    act, problems = activation_from_hf(hf.get("activation_function", default_act), "activation_function")
    d = int(hf.get("d_model", 1024))
    heads = int(hf.get("encoder_attention_heads", 16))
    if int(hf.get("decoder_attention_heads", heads)) != heads:
        problems.append(f"decoder_attention_heads={hf['decoder_attention_heads']}: aiayn's encoder and decoder have "
                        f"the same number of heads (encoder_attention_heads={heads})")
    ffn = int(hf.get("encoder_ffn_dim", 4096))
    if int(hf.get("decoder_ffn_dim", ffn)) != ffn:
        problems.append(f"decoder_ffn_dim={hf['decoder_ffn_dim']}: aiayn's encoder and decoder have one d_ff "
                        f"(encoder_ffn_dim={ffn})")
    if heads and d % heads:
        problems.append(f"d_model={d}: not divisible by encoder_attention_heads={heads}")
    for key in ("normalize_before", "add_final_layer_norm", "static_position_embeddings"):
        if hf.get(key):
            problems.append(f"{key}=true: aiayn converts the post-LN {family} without it")
    vocab = int(hf.get("vocab_size", 50265))
    pad = hf.get("pad_token_id")
    if not (isinstance(pad, int) and 0 <= pad < vocab):
        problems.append(f"pad_token_id={pad!r}: needs a pad id below vocab_size={vocab}")
    activation, approx = act or ("gelu", "none")
    fields = dict(arch="encoder-decoder", vocab_size=vocab, d_model=d, n_heads=heads,
                  n_layers=int(hf.get("decoder_layers", 12)), n_encoder_layers=int(hf.get("encoder_layers", 12)),
                  d_ff=ffn, max_len=int(hf.get("max_position_embeddings", 1024)), dropout=number(hf, "dropout", 0.1),
                  attn_dropout=number(hf, "attention_dropout", 0.0),
                  ffn_dropout=number(hf, "activation_dropout", 0.0), activation=activation, gelu_approximate=approx,
                  norm="layernorm", norm_eps=1e-5, norm_position="post", bias=True,
                  scale_embeddings=bool(hf.get("scale_embedding", False)), output_bias=True,
                  tie_embeddings=hf.get("tie_word_embeddings", True) is not False, share_src_tgt_embeddings=True,
                  init="gpt2", pad_id=pad if isinstance(pad, int) else 0, name=family)
    return fields, problems


def bart_config_from_hf(hf: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    fields, problems = _fields(hf, "bart", "gelu")
    if hf.get("normalize_embedding") is False:
        problems.append("normalize_embedding=false: BART's layernorm_embedding is expected")
    refuse("bart", problems)
    return {**fields, "position": "learned", "position_offset": 2, "embedding_norm": True}, translation_meta(hf)


def marian_config_from_hf(hf: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    fields, problems = _fields(hf, "marian", "gelu")
    vocab = fields["vocab_size"]
    if hf.get("share_encoder_decoder_embeddings", True) is False or int(hf.get("decoder_vocab_size") or vocab) != vocab:
        problems.append("share_encoder_decoder_embeddings=false / decoder_vocab_size: aiayn converts Marian models "
                        "with one joint vocabulary")
    refuse("marian", problems)
    return {**fields, "position": "sinusoidal", "sinusoidal_layout": "halves", "embedding_norm": False}, \
        translation_meta(hf)


def _wanted(config: ModelConfig) -> dict[str, Any]:
    return dict(arch="encoder-decoder", norm="layernorm", norm_position="post", deepnorm=False, bias=True,
                qkv_bias=(None, True), n_kv_heads=(None, config.n_heads), activation=("relu", "gelu", "silu"),
                tied_output_scale=False, share_src_tgt_embeddings=True, tgt_vocab_size=(None, config.vocab_size),
                sliding_window=None, n_token_types=None)


def _to_hf(config: ModelConfig, model_type: str, hf_class: str) -> dict[str, Any]:
    c = config
    act = activation_to_hf(c)
    return {"model_type": model_type, "architectures": [hf_class], "vocab_size": c.vocab_size, "d_model": c.d_model,
            "encoder_layers": c.encoder_layers, "decoder_layers": c.n_layers, "encoder_attention_heads": c.n_heads,
            "decoder_attention_heads": c.n_heads, "encoder_ffn_dim": c.d_ff, "decoder_ffn_dim": c.d_ff,
            "activation_function": "swish" if act == "silu" and model_type == "marian" else act,
            "max_position_embeddings": c.max_len, "dropout": c.dropout, "attention_dropout": c.attn_dropout,
            "activation_dropout": c.ffn_dropout, "scale_embedding": c.scale_embeddings,
            "tie_word_embeddings": c.tie_embeddings, "is_encoder_decoder": True}


def bart_config_to_hf(config: ModelConfig, meta: dict[str, Any]) -> dict[str, Any]:
    wanted = {**_wanted(config), "position": "learned", "position_offset": 2, "embedding_norm": True}
    refuse("bart", mismatches(config, wanted, "BART"))
    return _to_hf(config, "bart", "BartForConditionalGeneration")


def marian_config_to_hf(config: ModelConfig, meta: dict[str, Any]) -> dict[str, Any]:
    # an interleaved table (the paper's) is Marian's halves with the width reordered: the weights are reordered too
    wanted = {**_wanted(config), "position": "sinusoidal", "sinusoidal_layout": ("halves", "interleaved"),
              "position_offset": 0,
              "embedding_norm": False}
    refuse("marian", mismatches(config, wanted, "Marian"))
    return {**_to_hf(config, "marian", "MarianMTModel"), "decoder_vocab_size": config.vocab_size,
            "share_encoder_decoder_embeddings": True}


# ---------------------------------------------------------------------------------------------- weights
#: (transformers' name inside a layer, aiayn's) of the parts kept as they are
_KEPT = (("self_attn.out_proj", "self_attn.out_proj"), ("self_attn_layer_norm", "self_res.norm"),
         ("fc1", "ffn.w_in"), ("fc2", "ffn.w_out"), ("final_layer_norm", "ffn_res.norm"))
_CROSS = (("encoder_attn.q_proj", "cross_attn.q_proj"), ("encoder_attn.out_proj", "cross_attn.out_proj"),
          ("encoder_attn_layer_norm", "cross_res.norm"))


def _stacks(config: ModelConfig) -> tuple[tuple[str, int, bool], ...]:
    return ("encoder", config.encoder_layers, False), ("decoder", config.n_layers, True)


def _with_prefix(state: StateDict) -> StateDict:
    """A ``BartModel`` folder names its tensors without the ``model.`` of the generation model."""
    if any(k.startswith("model.") for k in state):
        return state
    return {(k if k == "final_logits_bias" or k.startswith("lm_head.") else "model." + k): v for k, v in state.items()}


def _state_from_hf(state: StateDict, config: ModelConfig, family: str, learned_positions: bool) -> StateDict:
    ignore = () if learned_positions else (r"embed_positions\.weight$",)  # Marian's fixed sinusoidal table
    r = StateReader(_with_prefix(state), ignore=ignore)
    shared = r.take("model.shared.weight")
    out = {"src_embed.weight": shared}
    tied = ["model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"]
    if config.tie_embeddings:
        tied.append("lm_head.weight")
    else:
        out["lm_head.proj.weight"] = r.take("lm_head.weight")
    for key in tied:
        if key in r and not torch.equal(r.take(key), shared):
            refuse(family, [f"{key} differs from model.shared.weight, to which aiayn's model ties it"])
    bias = r.take("final_logits_bias").reshape(-1) if "final_logits_bias" in r else torch.zeros(config.vocab_size)
    out["lm_head.proj.bias"] = bias
    for stack, n, cross in _stacks(config):
        m = f"model.{stack}."
        if learned_positions:
            out[f"{stack}.abs_pos.weight.weight"] = r.take(m + "embed_positions.weight")
            out[f"{stack}.embed_norm.weight"] = r.take(m + "layernorm_embedding.weight")
            out[f"{stack}.embed_norm.bias"] = r.take(m + "layernorm_embedding.bias")
        for i in range(n):
            src, dst = f"{m}layers.{i}.", f"{stack}.layers.{i}."
            for p in ("weight", "bias"):
                out[f"{dst}self_attn.qkv_proj.{p}"] = torch.cat([r.take(f"{src}self_attn.{q}_proj.{p}") for q in "qkv"])
                for theirs, mine in _KEPT + (_CROSS if cross else ()):
                    out[f"{dst}{mine}.{p}"] = r.take(f"{src}{theirs}.{p}")
                if cross:
                    out[f"{dst}cross_attn.kv_proj.{p}"] = torch.cat([r.take(f"{src}encoder_attn.{q}_proj.{p}")
                                                                     for q in "kv"])
    r.done()
    return out


def _state_to_hf(state: StateDict, config: ModelConfig, learned_positions: bool) -> StateDict:
    out = {"model.shared.weight": state["src_embed.weight"],
           "final_logits_bias": state.get("lm_head.proj.bias", torch.zeros(config.vocab_size)).reshape(1, -1)}
    if not config.tie_embeddings:
        out["lm_head.weight"] = state["lm_head.proj.weight"]
    for stack, n, cross in _stacks(config):
        m = f"model.{stack}."
        if learned_positions:
            out[m + "embed_positions.weight"] = state[f"{stack}.abs_pos.weight.weight"]
            out[m + "layernorm_embedding.weight"] = state[f"{stack}.embed_norm.weight"]
            out[m + "layernorm_embedding.bias"] = state[f"{stack}.embed_norm.bias"]
        for i in range(n):
            src, dst = f"{stack}.layers.{i}.", f"{m}layers.{i}."
            for p in ("weight", "bias"):
                for q, part in zip("qkv", state[f"{src}self_attn.qkv_proj.{p}"].chunk(3)):
                    out[f"{dst}self_attn.{q}_proj.{p}"] = part
                for theirs, mine in _KEPT + (_CROSS if cross else ()):
                    out[f"{dst}{theirs}.{p}"] = state[f"{src}{mine}.{p}"]
                if cross:
                    for q, part in zip("kv", state[f"{src}cross_attn.kv_proj.{p}"].chunk(2)):
                        out[f"{dst}encoder_attn.{q}_proj.{p}"] = part
    return out


def bart_state_from_hf(state: StateDict, config: ModelConfig, hf: dict[str, Any]) -> StateDict:
    return _state_from_hf(state, config, "bart", learned_positions=True)


def bart_state_to_hf(state: StateDict, config: ModelConfig) -> StateDict:
    return _state_to_hf(state, config, learned_positions=True)


def marian_state_from_hf(state: StateDict, config: ModelConfig, hf: dict[str, Any]) -> StateDict:
    table = sinusoidal_table(config.max_len, config.d_model, "halves")  # (max_len, D)
    for key in ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"):
        stored = _with_prefix(state).get(key)
        if stored is not None and (stored.shape != table.shape or not torch.allclose(stored.float(), table,
                                                                                      atol=1e-4)):
            refuse("marian", [f"{key}: not the sinusoidal table (a folder aiayn exported from a model trained here, "
                              "whose tables carry its start token and norm scale): convert the aiayn checkpoint it "
                              "was exported from instead"])
    return _state_from_hf(state, config, "marian", learned_positions=False)


def marian_state_to_hf(state: StateDict, config: ModelConfig) -> StateDict:
    if config.sinusoidal_layout == "interleaved":
        state = width_reordered(state, halves_order(config.d_model))
    return _state_to_hf(state, config, learned_positions=False)


def halves_order(d_model: int) -> torch.Tensor:
    """(D,) long: column j of the "halves" sinusoidal table (all sines, then all cosines) is column ``order[j]`` of
    the "interleaved" one (sin, cos, sin, ...): the even columns, then the odd ones."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


#: how each tensor of an encoder-decoder's state meets the residual stream: the dimension of the stream's width
#: (D) it reads (a layer's input columns, an embedding's columns) or writes (an output's rows, a norm), by the end
#: of its name; None: it has no such dimension (biases of the projections into heads or the feed-forward width)
_WIDTH_DIM = {"embed.weight": 1, "qkv_proj.weight": 1, "q_proj.weight": 1, "kv_proj.weight": 1, "w_in.weight": 1,
              "lm_head.proj.weight": 1, "out_proj.weight": 0, "out_proj.bias": 0, "w_out.weight": 0,
              "w_out.bias": 0, "norm.weight": 0, "norm.bias": 0, "qkv_proj.bias": None, "q_proj.bias": None,
              "kv_proj.bias": None, "w_in.bias": None, "lm_head.proj.bias": None}


def width_reordered(state: StateDict, order: torch.Tensor) -> StateDict:
    """The state of the same model with its residual stream's D features in the ``order`` (D,) given: every tensor
    that reads or writes the stream indexed by ``order`` along that dimension. The model computes the same
    outputs; the hidden states are ``h[..., order]`` of the original's. A model whose sinusoidal table is
    interleaved, reordered by :func:`halves_order`, is the same model with Marian's table.

    Raises:
        AiaynError: a tensor of a kind this does not know how to reorder (named).
    """
    out = {}
    for key, value in state.items():
        suffix = next((s for s in _WIDTH_DIM if key == s or key.endswith("." + s) or key.endswith("_" + s)), None)
        if suffix is None:
            refuse("marian", [f"{key}: aiayn cannot reorder this tensor's width to Marian's sinusoidal layout; "
                              "train with [model] sinusoidal_layout = \"halves\" to export"])
        dim = _WIDTH_DIM[suffix]
        out[key] = value if dim is None else value.index_select(dim, order)
    return out



register(Family(name="bart", model_types=("bart",), task="translation", hf_class="BartForConditionalGeneration",
                config_from_hf=bart_config_from_hf, state_from_hf=bart_state_from_hf,
                config_to_hf=bart_config_to_hf, state_to_hf=bart_state_to_hf,
                architectures=("BartForConditionalGeneration", "BartModel")))

register(Family(name="marian", model_types=("marian",), task="translation", hf_class="MarianMTModel",
                config_from_hf=marian_config_from_hf, state_from_hf=marian_state_from_hf,
                config_to_hf=marian_config_to_hf, state_to_hf=marian_state_to_hf,
                architectures=("MarianMTModel",)))
