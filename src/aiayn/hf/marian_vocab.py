"""A translation model trained here, in the vocabulary layout that Marian's converters expect.

aiayn's tokenizers put pad at id 0 and start the decoder from ``<s>``; MarianMTModel as CTranslate2 converts it
has pad as the vocabulary's last token (the converter drops that row and token) and starts the decoder from a zero
embedding. So the folder gets one more token, ``<pad>`` at id V (aiayn's V tokens keep their ids; aiayn's own
pad token, which a translation never reads or outputs, is renamed :data:`RENAMED_PAD`), whose embedding is zero
and whose logit is the float32 minimum (no probability: the softmax over the other V ids is aiayn's). The decoder
starts from it, and the decoder's position table row 0 holds ``PE(0) + embed_scale * embedding(<s>)``, which is
what aiayn's decoder reads at its first position: the first input is aiayn's, whether it comes from transformers
(``<pad>``'s zero row + row 0) or from CTranslate2 (its zero embedding + row 0). Rows 1... are the plain table.
The output layer is untied (its rows are aiayn's output layer, whose pad row is not zero), so the folder holds
the encoder's and decoder's token embeddings too (transformers ties them to ``model.shared`` only with a tied output
layer).
"""

from __future__ import annotations

import json
from typing import Any

import torch
from tokenizers import Tokenizer as HFTokenizer

from aiayn.config import ModelConfig
from aiayn.hf.family import StateDict
from aiayn.hf.folder import TokenizerForm
from aiayn.nn.positions import sinusoidal_table
from aiayn.tokenize import Tokenizer
from aiayn.tokenize.base import PAD

#: the name aiayn's pad token gets in the exported vocabulary (``<pad>`` is the added last token)
RENAMED_PAD = "<aiayn-pad>"


def needs_pad_last(tok: Tokenizer, vocab_size: int) -> bool:
    """Whether ``tok`` (for a model of ``vocab_size`` rows) differs from Marian's layout: pad not the last id, or a
    decoder that does not start from pad."""
    return tok.pad_id != vocab_size - 1 or tok.decoder_start_id != tok.pad_id


def pad_last_state(state: StateDict, config: ModelConfig, start_id: int) -> StateDict:
    """transformers' Marian state (``model.shared.weight`` (V, D), ``lm_head.weight`` or the tied embedding,
    ``final_logits_bias`` (1, V)) with the row V of the added ``<pad>``, the untied output layer, and both position
    tables (``model.{encoder,decoder}.embed_positions.weight`` (max_len, D), the decoder's row 0 holding the start
    token's embedding).

    Args:
        state: Marian's state as :func:`aiayn.hf.bart.marian_state_to_hf` gives it (the width in Marian's order).
        config: the aiayn model's config (``max_len``, ``d_model``, ``scale_embeddings``).
        start_id: the token aiayn's decoder starts from (the tokenizer's ``decoder_start_id``).
    """
    shared = state["model.shared.weight"]  # (V, D)
    zero = shared.new_zeros(1, shared.shape[1])
    out = dict(state)
    out["model.shared.weight"] = torch.cat([shared, zero])  # (V + 1, D)
    for stack in ("encoder", "decoder"):  # transformers ties them to model.shared only with a tied output layer
        out[f"model.{stack}.embed_tokens.weight"] = out["model.shared.weight"]
    out["lm_head.weight"] = torch.cat([state.get("lm_head.weight", shared), zero])
    bias = state["final_logits_bias"].reshape(1, -1)
    out["final_logits_bias"] = torch.cat([bias, bias.new_full((1, 1), torch.finfo(torch.float32).min)], dim=1)
    table = sinusoidal_table(config.max_len, config.d_model, "halves")  # (max_len, D), Marian's columns
    scale = config.d_model ** 0.5 if config.scale_embeddings else 1.0
    decoder = table.clone()
    decoder[0] += shared[start_id] * scale
    out["model.encoder.embed_positions.weight"] = table
    out["model.decoder.embed_positions.weight"] = decoder
    return out


def pad_last_config(hf: dict[str, Any], vocab_size: int) -> dict[str, Any]:
    """transformers' Marian config entries for the vocabulary with ``<pad>`` added at id ``vocab_size``."""
    return {**hf, "vocab_size": vocab_size + 1, "decoder_vocab_size": vocab_size + 1, "pad_token_id": vocab_size,
            "decoder_start_token_id": vocab_size, "tie_word_embeddings": False}


def pad_last_tokenizer(form: TokenizerForm, tok: Tokenizer) -> TokenizerForm:
    """The tokenizer ``form`` (:func:`aiayn.hf.folder.hf_tokenizer` of ``tok``) with aiayn's pad token renamed
    :data:`RENAMED_PAD` (a special token, so never produced from text) and ``<pad>`` added at id V."""
    hf, specials, clean_up = form
    data = json.loads(hf.to_str())
    old = tok.id_to_token(tok.pad_id)
    vocab = data["model"].get("vocab")
    if isinstance(vocab, dict) and old in vocab:  # WordLevel, BPE, WordPiece: token -> id
        vocab[RENAMED_PAD] = vocab.pop(old)
    elif isinstance(vocab, list):  # Unigram: [piece, score] by id
        vocab[tok.pad_id][0] = RENAMED_PAD
    entry = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
    added = [a for a in data.get("added_tokens") or [] if a["content"] != old]
    added.append({"id": tok.pad_id, "content": RENAMED_PAD, **entry})
    added.append({"id": tok.vocab_size, "content": PAD, **entry})
    data["added_tokens"] = sorted(added, key=lambda a: a["id"])
    renamed = HFTokenizer.from_str(json.dumps(data))
    return renamed, {**specials, "pad": PAD}, clean_up

