"""Mixtral (task "lm"): Mistral with a mixture-of-experts feed-forward layer (``ffn = "moe"``, top-2 routing).

Each layer's ``block_sparse_moe.gate`` is aiayn's router; expert ``j``'s ``w1`` (gate) and ``w3`` (up) are stacked
into its ``w_in`` (gate first) and ``w2`` is its ``w_out``. transformers renormalises the top-k router
probabilities for every k, aiayn only for k > 1 (top-1 is Switch), so a Mixtral with one expert per token is
refused. ``router_aux_loss_coef`` becomes ``moe_aux_loss_weight``; the router jitter noise of training is not
converted.
"""

from __future__ import annotations

from typing import Any

import torch

from aiayn.config import ModelConfig
from aiayn.hf.decoders import (
    llama_like_from_hf,
    llama_like_state_from_hf,
    llama_like_state_to_hf,
    llama_like_to_hf,
    llama_like_wanted,
)
from aiayn.hf.family import Family, StateDict, StateReader, mismatches, refuse, register


def mixtral_config_from_hf(hf: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    problems = []
    top_k = int(hf.get("num_experts_per_tok", 2))
    if top_k < 2:
        problems.append(f"num_experts_per_tok={top_k}: aiayn routes one expert per token as Switch does (weighted "
                        "by its probability), Mixtral renormalises it to 1")
    if float(hf.get("router_jitter_noise", 0.0) or 0.0) != 0.0:
        problems.append(f"router_jitter_noise={hf['router_jitter_noise']}: aiayn's router has no jitter; convert "
                        "a checkpoint with router_jitter_noise=0")
    refuse("mixtral", problems)
    window = hf.get("sliding_window")
    fields, meta = llama_like_from_hf(hf, "mixtral", qkv_bias=False, sliding_window=int(window) if window else None)
    fields.update(ffn="moe", n_experts=int(hf.get("num_local_experts", 8)), moe_top_k=top_k,
                  moe_capacity_factor=None, moe_aux_loss_weight=float(hf.get("router_aux_loss_coef", 0.001)),
                  moe_z_loss_weight=0.0)
    return fields, meta


def experts_from_hf(r: StateReader, src: str, dst: str, config: ModelConfig) -> StateDict:
    """One layer's router and experts: ``w1``/``w3`` stacked into ``w_in`` (gate first), ``w2`` is ``w_out``."""
    m = src + "block_sparse_moe."
    out = {f"{dst}ffn.router.weight": r.take(m + "gate.weight")}
    for j in range(config.n_experts):
        e, o = f"{m}experts.{j}.", f"{dst}ffn.experts.{j}."
        out[o + "w_in.weight"] = torch.cat([r.take(e + "w1.weight"), r.take(e + "w3.weight")])
        out[o + "w_out.weight"] = r.take(e + "w2.weight")
    return out


def experts_to_hf(state: StateDict, src: str, dst: str, config: ModelConfig) -> StateDict:
    """The inverse of :func:`experts_from_hf` for one layer."""
    m = dst + "block_sparse_moe."
    out = {m + "gate.weight": state[f"{src}ffn.router.weight"]}
    for j in range(config.n_experts):
        e, o = f"{m}experts.{j}.", f"{src}ffn.experts.{j}."
        out[e + "w1.weight"], out[e + "w3.weight"] = state[o + "w_in.weight"].split(config.d_ff)
        out[e + "w2.weight"] = state[o + "w_out.weight"]
    return out


def mixtral_state_from_hf(state: StateDict, config: ModelConfig, hf: dict[str, Any]) -> StateDict:
    return llama_like_state_from_hf(state, config, hf, ffn=experts_from_hf)


def mixtral_state_to_hf(state: StateDict, config: ModelConfig) -> StateDict:
    return llama_like_state_to_hf(state, config, ffn=experts_to_hf)


def mixtral_config_to_hf(config: ModelConfig, meta: dict[str, Any]) -> dict[str, Any]:
    c = config
    wanted = {**llama_like_wanted(c), "ffn": "moe", "activation": "swiglu", "bias": False, "qkv_bias": (None, False),
              "moe_top_k": tuple(range(2, c.n_experts + 1))}
    refuse("mixtral", mismatches(c, wanted, "Mixtral"))
    return {**llama_like_to_hf(c, "mixtral", "MixtralForCausalLM"), "sliding_window": c.sliding_window,
            "num_local_experts": c.n_experts, "num_experts_per_tok": c.moe_top_k,
            "router_aux_loss_coef": c.moe_aux_loss_weight, "router_jitter_noise": 0.0, "output_router_logits": False}


register(Family(name="mixtral", model_types=("mixtral",), task="lm", hf_class="MixtralForCausalLM",
                config_from_hf=mixtral_config_from_hf, state_from_hf=mixtral_state_from_hf,
                config_to_hf=mixtral_config_to_hf, state_to_hf=mixtral_state_to_hf,
                architectures=("MixtralForCausalLM",)))
