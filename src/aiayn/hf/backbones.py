"""Bare decoder backbones: ``LlamaModel``, ``MistralModel`` and ``Qwen2Model`` (task "embedding").

A backbone folder holds a decoder-only model without its LM head (its keys without the ``model.`` prefix: what
``LlamaModel.save_pretrained`` writes). Its config and weights map as the language model's do
(:mod:`aiayn.hf.decoders`); the converted checkpoint gives hidden states, pooled by the last token (the only one
that has seen the whole text under the causal mask; sentence-transformers' ``lasttoken``), not normalised, unless a
sentence-transformers ``modules.json`` beside it says otherwise (:mod:`aiayn.hf.sentence`).

aiayn's decoder always has an output layer: here it is tied to the embedding (``tie_embeddings``), so it owns no
weights; it is never used (``aiayn generate`` reads ``lm`` checkpoints only). The folder written back is the same
backbone class, its ``tie_word_embeddings`` as the source had it. ``GPT2Model`` is not among these: GPT-2 ties its
output layer to its embedding, so the ``gpt2`` family converts a bare ``GPT2Model`` as the language model it is.
"""

from __future__ import annotations

from typing import Any

from aiayn.config import ModelConfig
from aiayn.hf.decoders import (
    llama_config_from_hf,
    llama_config_to_hf,
    llama_like_state_from_hf,
    llama_like_state_to_hf,
    mistral_config_from_hf,
    mistral_config_to_hf,
    qwen2_config_from_hf,
    qwen2_config_to_hf,
)
from aiayn.hf.family import ConfigFromHF, ConfigToHF, Family, StateDict, register
from aiayn.hf.sentence import default_entry


def backbone(name: str, model_type: str, hf_class: str, config_from: ConfigFromHF, config_to: ConfigToHF) -> Family:
    """The embedding family of a LLaMA-like backbone class, from the language model's config maps."""

    def config_from_hf(hf: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        fields, _ = config_from(hf)
        fields = {**fields, "tie_embeddings": True}  # no LM head in the folder: the unused output layer is tied
        return fields, {"max_len": fields["max_len"], "embedding": default_entry("last")}

    def state_from_hf(state: StateDict, config: ModelConfig, hf: dict[str, Any]) -> StateDict:
        named = {k if k.startswith(("model.", "lm_head.")) else f"model.{k}": v for k, v in state.items()}
        return llama_like_state_from_hf(named, config, hf)

    def config_to_hf(config: ModelConfig, meta: dict[str, Any]) -> dict[str, Any]:
        base = meta.get("hf_config") if isinstance(meta.get("hf_config"), dict) else {}
        return {**config_to(config, meta), "architectures": [hf_class],
                "tie_word_embeddings": bool(base.get("tie_word_embeddings", config.tie_embeddings))}

    def state_to_hf(state: StateDict, config: ModelConfig) -> StateDict:
        return {k.removeprefix("model."): v for k, v in llama_like_state_to_hf(state, config).items()}

    return register(Family(name=name, model_types=(model_type,), task="embedding", hf_class=hf_class,
                           config_from_hf=config_from_hf, state_from_hf=state_from_hf, config_to_hf=config_to_hf,
                           state_to_hf=state_to_hf, architectures=(hf_class,)))


backbone("llama-embedding", "llama", "LlamaModel", llama_config_from_hf, llama_config_to_hf)
backbone("mistral-embedding", "mistral", "MistralModel", mistral_config_from_hf, mistral_config_to_hf)
backbone("qwen2-embedding", "qwen2", "Qwen2Model", qwen2_config_from_hf, qwen2_config_to_hf)
