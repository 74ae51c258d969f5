"""Pegasus: ``PegasusForConditionalGeneration`` (task "translation"), the pre-LN encoder-decoder.

Pegasus is BART's and Marian's encoder-decoder with each sublayer's norm before it, a final LayerNorm after each
stack (``model.{encoder,decoder}.layer_norm`` -> ``{encoder,decoder}.final_norm``), no LayerNorm after the
embeddings, and Marian's sinusoidal table (all sines, then all cosines; the paper's frequencies). A pre-LN model
trained here (the tiny Multi30k recipes) exports as one: an interleaved table by reordering the width
(:func:`aiayn.hf.bart.width_reordered`), a LayerNorm epsilon other than 1e-5 by scaling the residual stream
(:mod:`aiayn.hf.layernorm_eps`). The folder stores both position tables and an untied output layer.

Pegasus starts its decoder from its pad token (CTranslate2's converter reads the start token as the tokenizer's pad
token), so an export names the token aiayn's decoder starts from (``<s>``) as the pad token; it pads the source too,
where it is masked.
"""

from __future__ import annotations

from typing import Any

import torch

from aiayn.config import ModelConfig
from aiayn.hf.bart import (
    _fields,
    _state_from_hf,
    _state_to_hf,
    _to_hf,
    _wanted,
    halves_order,
    translation_meta,
    width_reordered,
)
from aiayn.hf.family import Family, StateDict, mismatches, refuse, register
from aiayn.hf.folder import TokenizerForm
from aiayn.hf.layernorm_eps import eps_rescaled
from aiayn.nn.positions import sinusoidal_table
from aiayn.tokenize import Tokenizer

#: transformers' PegasusConfig keys that CTranslate2's converter reads (as BART's loader does) and Pegasus implies
CTRANSLATE2_KEYS = {"normalize_before": True, "normalize_embedding": False}
_FINAL = (("model.encoder.layer_norm", "encoder.final_norm"), ("model.decoder.layer_norm", "decoder.final_norm"))
_TABLES = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")


def pegasus_config_from_hf(hf: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    fields, problems = _fields({k: v for k, v in hf.items() if k not in CTRANSLATE2_KEYS}, "pegasus", "gelu")
    if hf.get("normalize_embedding"):
        problems.append("normalize_embedding=true: Pegasus has no LayerNorm after the embeddings")
    refuse("pegasus", problems)
    return {**fields, "norm_position": "pre", "position": "sinusoidal", "sinusoidal_layout": "halves",
            "embedding_norm": False}, translation_meta(hf)


def pegasus_config_to_hf(config: ModelConfig, meta: dict[str, Any]) -> dict[str, Any]:
    wanted = {**_wanted(config), "norm_position": "pre", "position": "sinusoidal",
              "sinusoidal_layout": ("halves", "interleaved"), "position_offset": 0, "embedding_norm": False}
    refuse("pegasus", mismatches(config, wanted, "Pegasus"))
    return {**_to_hf(config, "pegasus", "PegasusForConditionalGeneration"), **CTRANSLATE2_KEYS,
            "tie_word_embeddings": False}


def pegasus_state_from_hf(state: StateDict, config: ModelConfig, hf: dict[str, Any]) -> StateDict:
    state = dict(state if any(k.startswith("model.") for k in state) else {
        (k if k == "final_logits_bias" or k.startswith("lm_head.") else "model." + k): v for k, v in state.items()})
    table = sinusoidal_table(config.max_len, config.d_model, "halves")  # (max_len, D)
    for key in _TABLES:
        stored = state.pop(key, None)
        if stored is not None and (stored.shape != table.shape or not torch.allclose(stored.float(), table,
                                                                                      atol=1e-4)):
            refuse("pegasus", [f"{key}: not the sinusoidal table (a folder aiayn exported from a model whose norms "
                               "have another epsilon than 1e-5): convert the aiayn checkpoint it was exported from "
                               "instead"])
    final = {}
    for theirs, mine in _FINAL:
        for p in ("weight", "bias"):
            if f"{theirs}.{p}" not in state:
                refuse("pegasus", [f"the weights lack {theirs}.{p}; the folder is incomplete: download it again"])
            final[f"{mine}.{p}"] = state.pop(f"{theirs}.{p}").float()
    return {**_state_from_hf(state, config, "pegasus", learned_positions=False), **final}


def pegasus_state_to_hf(state: StateDict, config: ModelConfig) -> StateDict:
    """aiayn's state -> Pegasus's: the layers as BART's and Marian's, the final norms, both position tables, the
    output layer untied and both stacks' token embeddings (transformers ties them only with a tied output layer),
    the width in Marian's order and the stream scaled for epsilon 1e-5."""
    if config.sinusoidal_layout == "interleaved":
        state = width_reordered(state, halves_order(config.d_model))
    out = _state_to_hf(state, config, learned_positions=False)
    for theirs, mine in _FINAL:
        for p in ("weight", "bias"):
            out[f"{theirs}.{p}"] = state[f"{mine}.{p}"]
    out["lm_head.weight"] = state["lm_head.proj.weight"]
    for stack in ("encoder", "decoder"):
        out[f"model.{stack}.embed_tokens.weight"] = out["model.shared.weight"]
    for key in _TABLES:
        out[key] = sinusoidal_table(config.max_len, config.d_model, "halves")  # (max_len, D)
    return eps_rescaled(out, config.norm_eps, pre_norm=True)


def start_as_pad(form: TokenizerForm, tok: Tokenizer) -> TokenizerForm:
    """The tokenizer ``form`` of ``tok`` with its decoder's start token as the pad token (Pegasus's start)."""
    hf, specials, clean_up = form
    return hf, {**specials, "pad": tok.id_to_token(tok.decoder_start_id)}, clean_up


register(Family(name="pegasus", model_types=("pegasus",), task="translation",
                hf_class="PegasusForConditionalGeneration", config_from_hf=pegasus_config_from_hf,
                state_from_hf=pegasus_state_from_hf, config_to_hf=pegasus_config_to_hf,
                state_to_hf=pegasus_state_to_hf, architectures=("PegasusForConditionalGeneration",)))
