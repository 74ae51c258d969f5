"""Decoder-only families: GPT-2, LLaMA, Mistral and Qwen2 (task "lm").

GPT-2 is the ``gpt2-small`` preset's shape: learned positions, pre-LN LayerNorm, GELU (tanh), biases everywhere and
a tied output layer. Its ``Conv1D`` layers store weights as (in, out), so every matrix is transposed; ``c_attn``
is already the fused ``[q; k; v]`` projection of aiayn's ``qkv_proj``.

LLaMA, Mistral and Qwen2 (and Mixtral, :mod:`aiayn.hf.mixtral`) are the ``llama`` preset's shape: RoPE, RMSNorm,
SwiGLU, no biases (Qwen2: biases on q, k and v), GQA. ``q_proj``, ``k_proj`` and ``v_proj`` are stacked into
``qkv_proj``; ``gate_proj`` and ``up_proj`` into the FFN's ``w_in`` (gate first). Mistral adds a sliding window over
every layer; LLaMA 3 scales RoPE's frequencies (``rope_type`` "llama3").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from aiayn.config import ModelConfig
from aiayn.hf.family import Family, StateDict, StateReader, mismatches, refuse, register

LM_META = {"newline_symbol": None, "packing": False}


def lm_meta(max_len: int) -> dict[str, Any]:
    """The lm task's checkpoint entries for a converted model: its context is its position table."""
    return {"block_size": max_len, **LM_META}


def _drop(hf: dict[str, Any]) -> float:
    return float(hf.get("resid_pdrop", hf.get("dropout", 0.0)) or 0.0)


def _tie(hf: dict[str, Any], default: bool) -> bool:
    return bool(hf.get("tie_word_embeddings", default))


# ---------------------------------------------------------------------------------------------- GPT-2
GPT2_ACTIVATIONS = {"gelu_new": ("gelu", "tanh"), "gelu_pytorch_tanh": ("gelu", "tanh"), "gelu_fast": None,
                    "gelu": ("gelu", "none"), "relu": ("relu", "none"), "silu": ("silu", "none"),
                    "swish": ("silu", "none")}


def gpt2_config_from_hf(hf: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    act = hf.get("activation_function", "gelu_new")
    problems = []
    if GPT2_ACTIVATIONS.get(act) is None:
        problems.append(f"activation_function={act!r}: aiayn has "
                        f"{', '.join(k for k, v in GPT2_ACTIVATIONS.items() if v)}")
    if not hf.get("scale_attn_weights", True):
        problems.append("scale_attn_weights=false: aiayn always scales attention by 1/sqrt(d_head)")
    if hf.get("scale_attn_by_inverse_layer_idx", False):
        problems.append("scale_attn_by_inverse_layer_idx=true: aiayn scales every layer's attention alike")
    if hf.get("add_cross_attention", False):
        problems.append("add_cross_attention=true: a GPT-2 with cross-attention is not a language model")
    refuse("gpt2", problems)
    activation, approx = GPT2_ACTIVATIONS[act]  # type: ignore[misc]
    d = int(hf.get("n_embd", 768))
    max_len = int(hf.get("n_positions", 1024))
    eos = hf.get("eos_token_id")
    vocab = int(hf.get("vocab_size", 50257))
    fields = dict(arch="decoder", vocab_size=vocab, d_model=d, n_heads=int(hf.get("n_head", 12)),
                  n_layers=int(hf.get("n_layer", 12)), d_ff=int(hf.get("n_inner") or 4 * d), max_len=max_len,
                  dropout=_drop(hf), attn_dropout=float(hf.get("attn_pdrop", 0.0) or 0.0), activation=activation,
                  gelu_approximate=approx, norm="layernorm", norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
                  norm_position="pre", position="learned", scale_embeddings=False, bias=True,
                  tie_embeddings=_tie(hf, True), init="gpt2", pad_id=_pad_id(hf, vocab, eos), name="gpt2")
    return fields, lm_meta(max_len)


def _pad_id(hf: dict[str, Any], vocab: int, eos: Any) -> int:
    for value in (hf.get("pad_token_id"), eos if not isinstance(eos, list) else (eos or [None])[0]):
        if isinstance(value, int) and 0 <= value < vocab:
            return value
    return 0


def _t(x: torch.Tensor) -> torch.Tensor:
    return x.t().contiguous()


def gpt2_state_from_hf(state: StateDict, config: ModelConfig, hf: dict[str, Any]) -> StateDict:
    # the original checkpoints name the stack's tensors without the "transformer." prefix
    plain = {k.removeprefix("transformer."): v for k, v in state.items()}
    r = StateReader(plain, ignore=(r"\.attn\.bias$", r"\.attn\.masked_bias$"))
    out = {"embed.weight": r.take("wte.weight"), "decoder.abs_pos.weight.weight": r.take("wpe.weight"),
           "decoder.final_norm.weight": r.take("ln_f.weight"), "decoder.final_norm.bias": r.take("ln_f.bias")}
    for i in range(config.n_layers):
        src, dst = f"h.{i}.", f"decoder.layers.{i}."
        for a, b in (("ln_1", "self_res.norm"), ("ln_2", "ffn_res.norm")):
            out[f"{dst}{b}.weight"] = r.take(f"{src}{a}.weight")
            out[f"{dst}{b}.bias"] = r.take(f"{src}{a}.bias")
        for a, b in (("attn.c_attn", "self_attn.qkv_proj"), ("attn.c_proj", "self_attn.out_proj"),
                     ("mlp.c_fc", "ffn.w_in"), ("mlp.c_proj", "ffn.w_out")):
            out[f"{dst}{b}.weight"] = _t(r.take(f"{src}{a}.weight"))  # Conv1D (in, out) -> Linear (out, in)
            out[f"{dst}{b}.bias"] = r.take(f"{src}{a}.bias")
    if "lm_head.weight" in r:
        head = r.take("lm_head.weight")
        if not config.tie_embeddings:
            out["lm_head.proj.weight"] = head
    elif not config.tie_embeddings:
        r.take("lm_head.weight")  # names the missing tensor
    r.done()
    return out


def gpt2_config_to_hf(config: ModelConfig, meta: dict[str, Any]) -> dict[str, Any]:
    c = config
    wanted: dict[str, Any] = dict(arch="decoder", position="learned", position_offset=0, norm="layernorm",
                                  norm_position="pre", deepnorm=False, activation=("gelu", "relu", "silu"),
                                  bias=True, qkv_bias=(None, True), n_kv_heads=(None, c.n_heads),
                                  scale_embeddings=False, embedding_norm=False, n_token_types=None,
                                  tied_output_scale=False, output_bias=False, sliding_window=None,
                                  tgt_vocab_size=(None, c.vocab_size))
    refuse("gpt2", mismatches(c, wanted, "GPT-2"))
    act = {"relu": "relu", "silu": "silu"}.get(c.activation) or (
        "gelu_new" if c.gelu_approximate == "tanh" else "gelu")
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": c.vocab_size,
            "n_positions": c.max_len, "n_embd": c.d_model, "n_layer": c.n_layers, "n_head": c.n_heads,
            "n_inner": c.d_ff, "activation_function": act, "layer_norm_epsilon": c.norm_eps,
            "resid_pdrop": c.dropout, "embd_pdrop": c.dropout, "attn_pdrop": c.attn_dropout,
            "tie_word_embeddings": c.tie_embeddings, "scale_attn_weights": True,
            "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False, "add_cross_attention": False}


def gpt2_state_to_hf(state: StateDict, config: ModelConfig) -> StateDict:
    out = {"transformer.wte.weight": state["embed.weight"],
           "transformer.wpe.weight": state["decoder.abs_pos.weight.weight"],
           "transformer.ln_f.weight": state["decoder.final_norm.weight"],
           "transformer.ln_f.bias": state["decoder.final_norm.bias"]}
    for i in range(config.n_layers):
        src, dst = f"decoder.layers.{i}.", f"transformer.h.{i}."
        for a, b in (("ln_1", "self_res.norm"), ("ln_2", "ffn_res.norm")):
            out[f"{dst}{a}.weight"] = state[f"{src}{b}.weight"]
            out[f"{dst}{a}.bias"] = state[f"{src}{b}.bias"]
        for a, b in (("attn.c_attn", "self_attn.qkv_proj"), ("attn.c_proj", "self_attn.out_proj"),
                     ("mlp.c_fc", "ffn.w_in"), ("mlp.c_proj", "ffn.w_out")):
            out[f"{dst}{a}.weight"] = _t(state[f"{src}{b}.weight"])
            out[f"{dst}{a}.bias"] = state[f"{src}{b}.bias"]
    if not config.tie_embeddings:
        out["lm_head.weight"] = state["lm_head.proj.weight"]
    return out


register(Family(name="gpt2", model_types=("gpt2",), task="lm", hf_class="GPT2LMHeadModel",
                config_from_hf=gpt2_config_from_hf, state_from_hf=gpt2_state_from_hf,
                config_to_hf=gpt2_config_to_hf, state_to_hf=gpt2_state_to_hf,
                architectures=("GPT2LMHeadModel", "GPT2Model")))


# ---------------------------------------------------------------------------------------------- LLaMA-like
#: transformers' hidden_act -> aiayn's gated activation and GELU approximation
GATED = {"silu": ("swiglu", "none"), "swish": ("swiglu", "none"), "gelu": ("geglu", "none"),
         "gelu_pytorch_tanh": ("geglu", "tanh"), "gelu_new": ("geglu", "tanh")}


def rope_settings(hf: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """aiayn's RoPE fields from transformers' ``rope_parameters`` (v5) or ``rope_theta`` + ``rope_scaling`` (v4)."""
    params = dict(hf.get("rope_parameters") or {})
    old = hf.get("rope_scaling") or {}
    if not params or (old and "rope_type" not in params and "type" not in params):
        params = {**old, **params}
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    fields: dict[str, Any] = dict(rope_theta=theta)
    problems = []
    needed = {"linear": ("factor",), "llama3": ("factor", "original_max_position_embeddings")}.get(kind, ())
    lacking = [k for k in needed if params.get(k) is None]
    if lacking:
        return fields, [f"rope_type={kind!r} without {', '.join(lacking)}: give them in rope_parameters"]
    if kind == "linear":
        fields.update(rope_scaling="linear", rope_scaling_factor=float(params["factor"]))
    elif kind == "llama3":
        fields.update(rope_scaling="llama3", rope_scaling_factor=float(params["factor"]),
                      rope_original_max_len=int(params["original_max_position_embeddings"]),
                      rope_low_freq_factor=float(params.get("low_freq_factor", 1.0)),
                      rope_high_freq_factor=float(params.get("high_freq_factor", 4.0)))
    elif kind != "default":
        problems.append(f"rope_type={kind!r}: aiayn converts the RoPE types default, linear and llama3")
    partial = hf.get("partial_rotary_factor", params.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        problems.append(f"partial_rotary_factor={partial}: aiayn rotates every dimension of a head")
    return fields, problems


def rope_to_hf(config: ModelConfig) -> dict[str, Any]:
    """transformers' ``rope_parameters`` (and the v4 ``rope_theta`` / ``rope_scaling`` for older readers)."""
    c = config
    params: dict[str, Any] = {"rope_type": "default" if c.rope_scaling == "none" else c.rope_scaling,
                              "rope_theta": c.rope_theta}
    if c.rope_scaling == "linear":
        params["factor"] = c.rope_scaling_factor
    elif c.rope_scaling == "llama3":
        params.update(factor=c.rope_scaling_factor, original_max_position_embeddings=c.rope_original_max_len,
                      low_freq_factor=c.rope_low_freq_factor, high_freq_factor=c.rope_high_freq_factor)
    return {"rope_parameters": params, "rope_theta": c.rope_theta,
            "rope_scaling": None if c.rope_scaling == "none" else dict(params)}


def llama_like_from_hf(hf: dict[str, Any], family: str, qkv_bias: bool,
                       sliding_window: int | None) -> tuple[dict[str, Any], dict[str, Any]]:
    d = int(hf.get("hidden_size", 4096))
    heads = int(hf.get("num_attention_heads", 32))
    kv = int(hf.get("num_key_value_heads") or heads)
    act = hf.get("hidden_act", "silu")
    rope, problems = rope_settings(hf)
    if act not in GATED:
        problems.append(f"hidden_act={act!r}: aiayn converts {', '.join(GATED)}")
    head_dim = hf.get("head_dim")  # kept only where it is not hidden_size / num_attention_heads
    head_dim = int(head_dim) if head_dim is not None and int(head_dim) * heads != d else None
    attn_bias, mlp_bias = bool(hf.get("attention_bias", False)), bool(hf.get("mlp_bias", False))
    if attn_bias != mlp_bias:
        problems.append(f"attention_bias={attn_bias}, mlp_bias={mlp_bias}: aiayn has biases on every linear layer "
                        "or none (besides q, k and v)")
    if hf.get("pretraining_tp", 1) not in (None, 1):
        problems.append(f"pretraining_tp={hf['pretraining_tp']}: convert a checkpoint saved with pretraining_tp=1")
    refuse(family, problems)
    activation, approx = GATED[act]
    max_len = int(hf.get("max_position_embeddings", 2048))
    vocab = int(hf.get("vocab_size", 32000))
    fields = dict(arch="decoder", vocab_size=vocab, d_model=d, n_heads=heads, n_kv_heads=kv, head_dim=head_dim,
                  n_layers=int(hf.get("num_hidden_layers", 32)), d_ff=int(hf.get("intermediate_size", 11008)),
                  max_len=max_len, dropout=0.0, attn_dropout=float(hf.get("attention_dropout", 0.0) or 0.0),
                  activation=activation, gelu_approximate=approx, norm="rmsnorm",
                  norm_eps=float(hf.get("rms_norm_eps", 1e-6)), norm_position="pre", position="rope", **rope,
                  bias=attn_bias, qkv_bias=True if qkv_bias else None, scale_embeddings=False,
                  tie_embeddings=_tie(hf, False), sliding_window=sliding_window, init="gpt2",
                  pad_id=_pad_id(hf, vocab, hf.get("eos_token_id")), name=family)
    return fields, lm_meta(max_len)


def dense_ffn_from_hf(r: StateReader, src: str, dst: str, config: ModelConfig) -> StateDict:
    """One layer's gated FFN: ``mlp.gate_proj`` and ``mlp.up_proj`` stacked into ``ffn.w_in`` (gate first)."""
    m, out = src + "mlp.", {}
    out[f"{dst}ffn.w_in.weight"] = torch.cat([r.take(m + "gate_proj.weight"), r.take(m + "up_proj.weight")])
    out[f"{dst}ffn.w_out.weight"] = r.take(m + "down_proj.weight")
    if config.bias:
        out[f"{dst}ffn.w_in.bias"] = torch.cat([r.take(m + "gate_proj.bias"), r.take(m + "up_proj.bias")])
        out[f"{dst}ffn.w_out.bias"] = r.take(m + "down_proj.bias")
    return out


def dense_ffn_to_hf(state: StateDict, src: str, dst: str, config: ModelConfig) -> StateDict:
    """The inverse of :func:`dense_ffn_from_hf` for one layer."""
    m, out = dst + "mlp.", {}
    out[m + "gate_proj.weight"], out[m + "up_proj.weight"] = state[f"{src}ffn.w_in.weight"].split(config.d_ff)
    out[m + "down_proj.weight"] = state[f"{src}ffn.w_out.weight"]
    if config.bias:
        out[m + "gate_proj.bias"], out[m + "up_proj.bias"] = state[f"{src}ffn.w_in.bias"].split(config.d_ff)
        out[m + "down_proj.bias"] = state[f"{src}ffn.w_out.bias"]
    return out


FFNFromHF = Callable[[StateReader, str, str, ModelConfig], StateDict]
FFNToHF = Callable[[StateDict, str, str, ModelConfig], StateDict]


def llama_like_state_from_hf(state: StateDict, config: ModelConfig, hf: dict[str, Any],
                             ffn: FFNFromHF = dense_ffn_from_hf) -> StateDict:
    r = StateReader(state, ignore=(r"rotary_emb\.inv_freq$",))
    out = {"embed.weight": r.take("model.embed_tokens.weight"),
           "decoder.final_norm.weight": r.take("model.norm.weight")}
    for i in range(config.n_layers):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{i}."
        a = src + "self_attn."
        out[f"{dst}self_attn.qkv_proj.weight"] = torch.cat([r.take(f"{a}{p}_proj.weight") for p in "qkv"])
        if config.qkv_uses_bias:
            out[f"{dst}self_attn.qkv_proj.bias"] = torch.cat([r.take(f"{a}{p}_proj.bias") for p in "qkv"])
        out[f"{dst}self_attn.out_proj.weight"] = r.take(f"{a}o_proj.weight")
        if config.bias:
            out[f"{dst}self_attn.out_proj.bias"] = r.take(f"{a}o_proj.bias")
        out.update(ffn(r, src, dst, config))
        out[f"{dst}self_res.norm.weight"] = r.take(src + "input_layernorm.weight")
        out[f"{dst}ffn_res.norm.weight"] = r.take(src + "post_attention_layernorm.weight")
    if not config.tie_embeddings:
        out["lm_head.proj.weight"] = r.take("lm_head.weight")
    elif "lm_head.weight" in r:
        r.take("lm_head.weight")  # a tied copy stored anyway
    r.done()
    return out


def llama_like_state_to_hf(state: StateDict, config: ModelConfig, ffn: FFNToHF = dense_ffn_to_hf) -> StateDict:
    c = config
    q, kv = c.n_heads * c.head_dim, c.kv_heads * c.head_dim
    out = {"model.embed_tokens.weight": state["embed.weight"], "model.norm.weight": state["decoder.final_norm.weight"]}
    for i in range(c.n_layers):
        src, dst = f"decoder.layers.{i}.", f"model.layers.{i}."
        a = dst + "self_attn."
        for name, part in zip("qkv", state[f"{src}self_attn.qkv_proj.weight"].split([q, kv, kv])):
            out[f"{a}{name}_proj.weight"] = part
        if c.qkv_uses_bias:
            for name, part in zip("qkv", state[f"{src}self_attn.qkv_proj.bias"].split([q, kv, kv])):
                out[f"{a}{name}_proj.bias"] = part
        out[f"{a}o_proj.weight"] = state[f"{src}self_attn.out_proj.weight"]
        if c.bias:
            out[f"{a}o_proj.bias"] = state[f"{src}self_attn.out_proj.bias"]
        out.update(ffn(state, src, dst, c))
        out[dst + "input_layernorm.weight"] = state[f"{src}self_res.norm.weight"]
        out[dst + "post_attention_layernorm.weight"] = state[f"{src}ffn_res.norm.weight"]
    if not c.tie_embeddings:
        out["lm_head.weight"] = state["lm_head.proj.weight"]
    return out


def llama_like_wanted(config: ModelConfig) -> dict[str, Any]:
    return dict(arch="decoder", position="rope", norm="rmsnorm", norm_position="pre", deepnorm=False,
                activation=("swiglu", "geglu"), scale_embeddings=False, embedding_norm=False, n_token_types=None,
                tied_output_scale=False, output_bias=False, rope_scaling=("none", "linear", "llama3"),
                tgt_vocab_size=(None, config.vocab_size), ffn="dense")


def llama_like_to_hf(config: ModelConfig, model_type: str, hf_class: str) -> dict[str, Any]:
    c = config
    act = "silu" if c.activation == "swiglu" else ("gelu_pytorch_tanh" if c.gelu_approximate == "tanh" else "gelu")
    return {"model_type": model_type, "architectures": [hf_class], "vocab_size": c.vocab_size,
            "hidden_size": c.d_model, "intermediate_size": c.d_ff, "num_hidden_layers": c.n_layers,
            "num_attention_heads": c.n_heads, "num_key_value_heads": c.kv_heads, "head_dim": c.head_dim,
            "hidden_act": act, "max_position_embeddings": c.max_len, "rms_norm_eps": c.norm_eps,
            "tie_word_embeddings": c.tie_embeddings, "attention_dropout": c.attn_dropout, **rope_to_hf(c)}


# LLaMA ------------------------------------------------------------------------------------------------------------
def llama_config_from_hf(hf: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    return llama_like_from_hf(hf, "llama", qkv_bias=False, sliding_window=None)


def llama_config_to_hf(config: ModelConfig, meta: dict[str, Any]) -> dict[str, Any]:
    c = config
    refuse("llama", mismatches(c, {**llama_like_wanted(c), "sliding_window": None, "qkv_bias": (None, c.bias)},
                                "LLaMA"))
    return {**llama_like_to_hf(c, "llama", "LlamaForCausalLM"), "attention_bias": c.bias, "mlp_bias": c.bias,
            "pretraining_tp": 1}


register(Family(name="llama", model_types=("llama",), task="lm", hf_class="LlamaForCausalLM",
                config_from_hf=llama_config_from_hf, state_from_hf=llama_like_state_from_hf,
                config_to_hf=llama_config_to_hf, state_to_hf=llama_like_state_to_hf,
                architectures=("LlamaForCausalLM",)))


# Mistral ----------------------------------------------------------------------------------------------------------
def mistral_config_from_hf(hf: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    window = hf.get("sliding_window")
    return llama_like_from_hf(hf, "mistral", qkv_bias=False, sliding_window=int(window) if window else None)


def mistral_config_to_hf(config: ModelConfig, meta: dict[str, Any]) -> dict[str, Any]:
    c = config
    refuse("mistral", mismatches(c, {**llama_like_wanted(c), "bias": False, "qkv_bias": (None, False)},
                                  "Mistral"))
    return {**llama_like_to_hf(c, "mistral", "MistralForCausalLM"), "sliding_window": c.sliding_window}


register(Family(name="mistral", model_types=("mistral",), task="lm", hf_class="MistralForCausalLM",
                config_from_hf=mistral_config_from_hf, state_from_hf=llama_like_state_from_hf,
                config_to_hf=mistral_config_to_hf, state_to_hf=llama_like_state_to_hf,
                architectures=("MistralForCausalLM",)))


# Qwen2 ------------------------------------------------------------------------------------------------------------
def qwen2_config_from_hf(hf: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    n = int(hf.get("num_hidden_layers", 32))
    window = hf.get("sliding_window") if hf.get("use_sliding_window", False) else None
    types = hf.get("layer_types")
    if types is None:  # transformers' rule: the layers from max_window_layers on slide
        first = int(hf.get("max_window_layers", n) or 0)
        types = ["sliding_attention" if window and i >= first else "full_attention" for i in range(n)]
    if len(set(types)) > 1:
        refuse("qwen2", [f"layer_types={types}: aiayn applies one sliding window to every layer or to none; set "
                         "use_sliding_window=false or max_window_layers=0"])
    sliding = types and types[0] == "sliding_attention" and window
    return llama_like_from_hf(hf, "qwen2", qkv_bias=True, sliding_window=int(window) if sliding else None)


def qwen2_config_to_hf(config: ModelConfig, meta: dict[str, Any]) -> dict[str, Any]:
    c = config
    refuse("qwen2", mismatches(c, {**llama_like_wanted(c), "bias": False, "qkv_bias": True}, "Qwen2"))
    window = c.sliding_window
    return {**llama_like_to_hf(c, "qwen2", "Qwen2ForCausalLM"), "use_sliding_window": window is not None,
            "sliding_window": window, "max_window_layers": 0 if window else c.n_layers,
            "layer_types": ["sliding_attention" if window else "full_attention"] * c.n_layers}


register(Family(name="qwen2", model_types=("qwen2",), task="lm", hf_class="Qwen2ForCausalLM",
                config_from_hf=qwen2_config_from_hf, state_from_hf=llama_like_state_from_hf,
                config_to_hf=qwen2_config_to_hf, state_to_hf=llama_like_state_to_hf,
                architectures=("Qwen2ForCausalLM",)))
