"""The config options that pretrained families need, held equal to Hugging Face transformers' own modules and models.

Each option is checked piece by piece (an MLP, an embedding layer, a position table, an attention module, RoPE's
frequencies) and as a whole model (GPT-2, BERT, BART, Marian, T5 v1.0, Qwen2, LLaMA 3): our preset or config, the
reference's weights copied in by a key map, and the logits compared at 1e-5 in fp32. Each reference model is built
from a tiny random config (never downloaded). Where an option is what closes the gap, the test also shows the gap
without it, so that a broken option fails the test. The last section holds the defaults to the models as they were.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn import ModelConfig, build_model
from aiayn.nn.attention import MultiHeadAttention
from aiayn.nn.feedforward import FeedForward
from aiayn.nn.positions import LearnedPositions, RotaryEmbedding, rope_inv_freq, sinusoidal_table

transformers = pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    BartConfig,
    BartForConditionalGeneration,
    BertConfig,
    BertForMaskedLM,
    BertForSequenceClassification,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MarianConfig,
    MarianMTModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    T5Config,
    T5ForConditionalGeneration,
)
from transformers.activations import ACT2FN  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.bart.modeling_bart import BartLearnedPositionalEmbedding  # noqa: E402
from transformers.models.bert.modeling_bert import BertEmbeddings  # noqa: E402
from transformers.models.gpt2.modeling_gpt2 import GPT2MLP  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402
from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding  # noqa: E402
from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention, Qwen2RotaryEmbedding  # noqa: E402
from transformers.models.t5.modeling_t5 import T5DenseGatedActDense  # noqa: E402

ATOL = 1e-5
V, D, H, FF, L = 50, 32, 4, 48, 2  # the tiny models' vocabulary, width, heads, hidden width, layers
SMALL = dict(vocab_size=V, d_model=D, n_heads=H, n_layers=L, d_ff=FF, max_len=64, dropout=0.0)


def _eager(cfg: Any) -> Any:
    cfg._attn_implementation = "eager"
    return cfg


def _randomize(module: nn.Module, std: float = 0.2) -> None:
    """Every trainable parameter of the reference drawn from N(0, std) (norm weights included); frozen tables such as
    Marian's sinusoidal positions stay as they are."""
    with torch.no_grad():
        for p in module.parameters():
            if p.requires_grad:
                p.normal_(0.0, std)


@torch.no_grad()
def _copy(dst: nn.Module, src: nn.Module, transpose: bool = False) -> None:
    """A linear layer, norm or embedding's weight (transposed for GPT-2's Conv1D) and bias."""
    dst.weight.copy_(src.weight.t() if transpose else src.weight)
    if getattr(dst, "bias", None) is not None:
        dst.bias.copy_(src.bias)
    else:
        assert getattr(src, "bias", None) is None, "the reference has a bias where ours has none"


@torch.no_grad()
def _fuse(dst: nn.Linear, *parts: nn.Linear) -> None:
    """Several linear layers as one fused one: [q; k; v] or [k; v] (or [gate; up]), weights and biases stacked."""
    dst.weight.copy_(torch.cat([p.weight for p in parts]))
    if dst.bias is not None:
        dst.bias.copy_(torch.cat([p.bias for p in parts]))
    else:
        assert all(p.bias is None for p in parts), "the reference has biases where ours has none"


def _close(got: Tensor, want: Tensor) -> None:
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def _far(got: Tensor, want: Tensor) -> None:
    assert (got - want).abs().max() > 10 * ATOL, "without the option the models agree: the test cannot fail"


# ---------------------------------------------------------------------------------------------- GELU (tanh) and SiLU
def test_gelu_tanh_matches_gpt2_mlp() -> None:
    ref = GPT2MLP(FF, GPT2Config(n_embd=D, activation_function="gelu_new", resid_pdrop=0.0)).eval()
    _randomize(ref, 0.5)
    ours = FeedForward(D, FF, "gelu", gelu_approximate="tanh").eval()
    _copy(ours.w_in, ref.c_fc, transpose=True)
    _copy(ours.w_out, ref.c_proj, transpose=True)
    x = 2.0 * torch.randn(3, 5, D)
    with torch.no_grad():
        want = ref(x)
        _close(ours(x), want)
        ours.act = F.gelu  # the exact GELU is measurably different on this input
        _far(ours(x), want)


def test_geglu_tanh_matches_t5_v1_1_gated_gelu() -> None:
    cfg = T5Config(d_model=D, d_ff=FF, dropout_rate=0.0, feed_forward_proj="gated-gelu")
    ref = T5DenseGatedActDense(cfg).eval()
    _randomize(ref, 0.5)
    ours = FeedForward(D, FF, "geglu", bias=False, gelu_approximate="tanh").eval()
    _fuse(ours.w_in, ref.wi_0, ref.wi_1)  # [gate; up]
    _copy(ours.w_out, ref.wo)
    x = 2.0 * torch.randn(3, 5, D)
    with torch.no_grad():
        _close(ours(x), ref(x))


def test_silu_is_the_plain_ungated_swish() -> None:
    ours = FeedForward(D, FF, "silu").eval()
    x = torch.randn(3, 5, D)
    swish = ACT2FN["swish"]
    with torch.no_grad():
        _close(ours(x), ours.w_out(swish(ours.w_in(x))))
    assert ours.w_in.out_features == FF  # ungated: one projection of width d_ff


def _gpt2_pair() -> tuple[nn.Module, GPT2LMHeadModel]:
    ref = GPT2LMHeadModel(_eager(GPT2Config(vocab_size=V, n_positions=64, n_embd=D, n_layer=L, n_head=H, n_inner=FF,
                                            activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                                            attn_pdrop=0.0, bos_token_id=0, eos_token_id=0))).eval()
    _randomize(ref, 0.5)  # wide enough that the two GELUs differ
    ours = build_model(ModelConfig.preset("gpt2-small", **SMALL)).eval()
    t = ref.transformer
    _copy(ours.embed, t.wte)
    _copy(ours.decoder.abs_pos.weight, t.wpe)
    for mine, blk in zip(ours.decoder.layers, t.h, strict=True):
        _copy(mine.self_attn.qkv_proj, blk.attn.c_attn, transpose=True)
        _copy(mine.self_attn.out_proj, blk.attn.c_proj, transpose=True)
        _copy(mine.ffn.w_in, blk.mlp.c_fc, transpose=True)
        _copy(mine.ffn.w_out, blk.mlp.c_proj, transpose=True)
        _copy(mine.self_res.norm, blk.ln_1)
        _copy(mine.ffn_res.norm, blk.ln_2)
    _copy(ours.decoder.final_norm, t.ln_f)
    assert ref.lm_head.weight is t.wte.weight
    return ours, ref


def _same_weights(model: nn.Module, **changes: Any) -> nn.Module:
    """``model`` built again with some config fields changed, holding the same weights."""
    other = build_model(model.config.replace(**changes)).eval()
    other.load_state_dict(model.state_dict())
    return other


def test_gpt2_small_preset_is_gpt2() -> None:
    ours, ref = _gpt2_pair()
    ids = torch.randint(0, V, (2, 12))
    with torch.no_grad():
        want = ref(input_ids=ids).logits
        _close(ours(ids).logits, want)
        _far(_same_weights(ours, gelu_approximate="none")(ids).logits, want)


# ---------------------------------------------------------------------------------------------- BERT
def _bert_config() -> BertConfig:
    return _eager(BertConfig(vocab_size=V, hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                             intermediate_size=FF, max_position_embeddings=64, type_vocab_size=2,
                             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=0))


def _bert_pair(head: type) -> tuple[nn.Module, nn.Module]:
    """Our bert-base preset (shrunk) and a BertForMaskedLM or BertForSequenceClassification holding its weights."""
    ref = head(_bert_config()).eval()
    _randomize(ref)
    ours = build_model(ModelConfig.preset("bert-base", **SMALL)).eval()
    bert = ref.bert
    e = bert.embeddings
    _copy(ours.embed, e.word_embeddings)
    _copy(ours.encoder.abs_pos.weight, e.position_embeddings)
    _copy(ours.encoder.token_type_embed, e.token_type_embeddings)
    _copy(ours.encoder.embed_norm, e.LayerNorm)
    for mine, lay in zip(ours.encoder.layers, bert.encoder.layer, strict=True):
        a = lay.attention
        _fuse(mine.self_attn.qkv_proj, a.self.query, a.self.key, a.self.value)
        _copy(mine.self_attn.out_proj, a.output.dense)
        _copy(mine.self_res.norm, a.output.LayerNorm)
        _copy(mine.ffn.w_in, lay.intermediate.dense)
        _copy(mine.ffn.w_out, lay.output.dense)
        _copy(mine.ffn_res.norm, lay.output.LayerNorm)
    if head is BertForMaskedLM:
        p = ref.cls.predictions
        assert p.decoder.weight is e.word_embeddings.weight
        _copy(ours.mlm_head.dense, p.transform.dense)
        _copy(ours.mlm_head.norm, p.transform.LayerNorm)
        with torch.no_grad():
            ours.mlm_head.bias.copy_(p.decoder.bias)
    else:
        _copy(ours.cls_head.dense, bert.pooler.dense)
        _copy(ours.cls_head.out, ref.classifier)
    return ours, ref


def _segments() -> tuple[Tensor, Tensor, Tensor]:
    """ids (3, 10) right-padded with 0, their is_token flags, and token types: segment B from position 4."""
    ids = torch.randint(1, V, (3, 10))
    is_token = torch.arange(10)[None, :] < torch.tensor([[10], [7], [5]])
    ids[~is_token] = 0
    types = (torch.arange(10)[None, :] >= 4).long().expand(3, 10) * is_token
    return ids, is_token, types


def test_token_types_and_embedding_norm_match_bert_embeddings() -> None:
    ref = BertEmbeddings(_bert_config()).eval()
    _randomize(ref)
    ours = build_model(ModelConfig.preset("bert-base", **SMALL)).eval()
    _copy(ours.embed, ref.word_embeddings)
    _copy(ours.encoder.abs_pos.weight, ref.position_embeddings)
    _copy(ours.encoder.token_type_embed, ref.token_type_embeddings)
    _copy(ours.encoder.embed_norm, ref.LayerNorm)
    ids, _, types = _segments()
    with torch.no_grad():
        got = ours.encoder.prepare(ids, token_type_ids=types)[0]
        _close(got, ref(input_ids=ids, token_type_ids=types))
        _close(ours.encoder.prepare(ids)[0], ref(input_ids=ids))  # no types given: every token of type 0
        _far(got, ref(input_ids=ids))  # the types count


def test_bert_masked_lm_matches_with_segments_and_padding() -> None:
    ours, ref = _bert_pair(BertForMaskedLM)
    ids, is_token, types = _segments()
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=is_token.long(), token_type_ids=types).logits
        got = ours(ids, is_token=is_token, token_type_ids=types).logits
    _close(got[is_token], want[is_token])


def test_bert_pooler_and_classifier_match_the_classification_head() -> None:
    ours, ref = _bert_pair(BertForSequenceClassification)
    ids, is_token, types = _segments()
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=is_token.long(), token_type_ids=types).logits
        got = ours(ids, is_token=is_token, token_type_ids=types, task="classify").logits
    assert got.shape == (3, 2)
    _close(got, want)


def test_token_types_on_a_model_without_them_are_an_error() -> None:
    model = build_model(ModelConfig.preset("bert-base", **SMALL, n_token_types=None))
    with pytest.raises(ValueError, match="n_token_types"):
        model(torch.ones(1, 3, dtype=torch.long), token_type_ids=torch.zeros(1, 3, dtype=torch.long))


# ---------------------------------------------------------------------------------------------- BART and Marian
def test_position_offset_matches_bart_learned_positions() -> None:
    ref = BartLearnedPositionalEmbedding(64, D)
    _randomize(ref)
    ours = LearnedPositions(D, 64, offset=2)
    assert ours.weight.weight.shape == ref.weight.shape == (66, D)
    _copy(ours.weight, ref)
    with torch.no_grad():
        want = ref(torch.zeros(2, 9, dtype=torch.long), cache_length=5)  # positions 5 .. 13
        _close(ours(torch.arange(5, 14)[None]).expand(2, 9, D), want)
        _close(ours.span(5, 9).expand(2, 9, D), want)
        _far(ref.weight[5:14], want[0])  # rows 5 .. 13 of the table are not positions 5 .. 13


@pytest.mark.parametrize("n_pos,dim", [(64, 32), (30, 6), (512, 512)])
def test_halves_layout_matches_marian_sinusoidal_positions(n_pos: int, dim: int) -> None:
    want = MarianSinusoidalPositionalEmbedding(n_pos, dim).create_weight()
    got = sinusoidal_table(n_pos, dim, "halves")
    _close(got, want)
    _far(sinusoidal_table(n_pos, dim), want)  # the paper's interleaved columns
    assert torch.equal(got[:, : dim // 2], sinusoidal_table(n_pos, dim)[:, 0::2])  # the same sines, regrouped


def _seq2seq_pair(preset: str, ref: nn.Module, layernorm_embedding: bool, **overrides: Any) -> nn.Module:
    """Our BART or Marian preset (shrunk) holding ``ref``'s weights (the key map shared by both)."""
    ours = build_model(ModelConfig.preset(preset, **{**SMALL, **overrides})).eval()
    m = ref.model
    _copy(ours.src_embed, m.shared)
    with torch.no_grad():
        ours.lm_head.proj.bias.copy_(ref.final_logits_bias[0])
    for stack, theirs in ((ours.encoder, m.encoder), (ours.decoder, m.decoder)):
        if layernorm_embedding:
            _copy(stack.abs_pos.weight, theirs.embed_positions)
            _copy(stack.embed_norm, theirs.layernorm_embedding)
        for mine, lay in zip(stack.layers, theirs.layers, strict=True):
            a = lay.self_attn
            _fuse(mine.self_attn.qkv_proj, a.q_proj, a.k_proj, a.v_proj)
            _copy(mine.self_attn.out_proj, a.out_proj)
            _copy(mine.self_res.norm, lay.self_attn_layer_norm)
            if mine.cross_attn is not None:
                c = lay.encoder_attn
                _copy(mine.cross_attn.q_proj, c.q_proj)
                _fuse(mine.cross_attn.kv_proj, c.k_proj, c.v_proj)
                _copy(mine.cross_attn.out_proj, c.out_proj)
                _copy(mine.cross_res.norm, lay.encoder_attn_layer_norm)
            _copy(mine.ffn.w_in, lay.fc1)
            _copy(mine.ffn.w_out, lay.fc2)
            _copy(mine.ffn_res.norm, lay.final_layer_norm)
    assert ref.lm_head.weight is m.shared.weight
    return ours


def _source_and_target(pad_id: int) -> tuple[Tensor, Tensor, Tensor]:
    src = torch.randint(3, V - 1, (3, 9))
    src_is_token = torch.arange(9)[None, :] < torch.tensor([[9], [6], [3]])
    src[~src_is_token] = pad_id
    return src, src_is_token, torch.randint(3, V - 1, (3, 7))


def _bart_reference() -> BartForConditionalGeneration:
    cfg = BartConfig(vocab_size=V, d_model=D, encoder_layers=L, decoder_layers=L, encoder_attention_heads=H,
                     decoder_attention_heads=H, encoder_ffn_dim=FF, decoder_ffn_dim=FF, max_position_embeddings=64,
                     dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, activation_function="gelu",
                     scale_embedding=False, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
    ref = BartForConditionalGeneration(_eager(cfg)).eval()
    _randomize(ref)
    with torch.no_grad():
        ref.final_logits_bias.normal_(0.0, 1.0)
    return ref


def test_bart_base_preset_is_bart() -> None:
    """Embedding norm, learned positions from table row 2, the output bias (``final_logits_bias``), GELU, post-LN."""
    ref = _bart_reference()
    ours = _seq2seq_pair("bart-base", ref, layernorm_embedding=True)
    src, src_is_token, tgt = _source_and_target(pad_id=1)
    with torch.no_grad():
        want = ref(input_ids=src, attention_mask=src_is_token.long(), decoder_input_ids=tgt).logits
        _close(ours(src, tgt).logits, want)
        ours.lm_head.proj.bias.zero_()
        _far(ours(src, tgt).logits, want)


def test_marian_preset_is_marian() -> None:
    """SiLU ("swish"), sinusoidal positions in halves, embeddings scaled by sqrt(d), the output bias, post-LN."""
    pad = V - 1
    cfg = MarianConfig(vocab_size=V, d_model=D, encoder_layers=L, decoder_layers=L, encoder_attention_heads=H,
                       decoder_attention_heads=H, encoder_ffn_dim=FF, decoder_ffn_dim=FF, max_position_embeddings=64,
                       dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, activation_function="swish",
                       scale_embedding=True, pad_token_id=pad, eos_token_id=0, decoder_start_token_id=pad)
    ref = MarianMTModel(_eager(cfg)).eval()
    _randomize(ref)
    with torch.no_grad():
        ref.final_logits_bias.normal_(0.0, 1.0)
    ours = _seq2seq_pair("marian", ref, layernorm_embedding=False, pad_id=pad)
    src, src_is_token, tgt = _source_and_target(pad_id=pad)
    with torch.no_grad():
        want = ref(input_ids=src, attention_mask=src_is_token.long(), decoder_input_ids=tgt).logits
        _close(ours(src, tgt).logits, want)
        interleaved = _seq2seq_pair("marian", ref, layernorm_embedding=False, pad_id=pad,
                                    sinusoidal_layout="interleaved")
        _far(interleaved(src, tgt).logits, want)


# ---------------------------------------------------------------------------------------------- T5 v1.0
def _t5_pair() -> tuple[nn.Module, T5ForConditionalGeneration]:
    cfg = T5Config(vocab_size=V, d_model=D, d_kv=D // H, d_ff=FF, num_layers=L, num_decoder_layers=L, num_heads=H,
                   dropout_rate=0.0, feed_forward_proj="relu", pad_token_id=0, decoder_start_token_id=0)
    ref = T5ForConditionalGeneration(_eager(cfg)).eval()
    _randomize(ref)
    assert ref.config.scale_decoder_outputs and ref.lm_head.weight is ref.shared.weight
    ours = build_model(ModelConfig.preset("t5-small", **SMALL)).eval()
    _copy(ours.src_embed, ref.shared)
    for stack, theirs in ((ours.encoder, ref.encoder), (ours.decoder, ref.decoder)):
        _copy(stack.pos_bias.embedding, theirs.block[0].layer[0].SelfAttention.relative_attention_bias)
        _copy(stack.final_norm, theirs.final_layer_norm)
        for mine, blk in zip(stack.layers, theirs.block, strict=True):
            a = blk.layer[0].SelfAttention
            _fuse(mine.self_attn.qkv_proj, a.q, a.k, a.v)
            _copy(mine.self_attn.out_proj, a.o)
            _copy(mine.self_res.norm, blk.layer[0].layer_norm)
            if mine.cross_attn is not None:
                c = blk.layer[1].EncDecAttention
                _copy(mine.cross_attn.q_proj, c.q)
                _fuse(mine.cross_attn.kv_proj, c.k, c.v)
                _copy(mine.cross_attn.out_proj, c.o)
                _copy(mine.cross_res.norm, blk.layer[1].layer_norm)
            ff = blk.layer[-1]
            _copy(mine.ffn.w_in, ff.DenseReluDense.wi)
            _copy(mine.ffn.w_out, ff.DenseReluDense.wo)
            _copy(mine.ffn_res.norm, ff.layer_norm)
    return ours, ref


def test_t5_small_preset_is_t5_v1_0_with_the_tied_output_rescale() -> None:
    """T5 v1.0 multiplies the decoder's output by d_model^-0.5 before its tied output layer; its attention is unscaled
    and its relative bias is computed once per stack (both already so in the core)."""
    ours, ref = _t5_pair()
    src, src_is_token, tgt = _source_and_target(pad_id=0)
    with torch.no_grad():
        want = ref(input_ids=src, attention_mask=src_is_token.long(), decoder_input_ids=tgt).logits
        _close(ours(src, tgt).logits, want)
        _far(_same_weights(ours, tied_output_scale=False)(src, tgt).logits, want)
    assert ours.lm_head.scale == D**-0.5


# ---------------------------------------------------------------------------------------------- Qwen2
def _qwen2_config() -> Qwen2Config:
    return _eager(Qwen2Config(vocab_size=V, hidden_size=D, intermediate_size=FF, num_hidden_layers=L,
                              num_attention_heads=H, num_key_value_heads=2, max_position_embeddings=64,
                              rms_norm_eps=1e-6, tie_word_embeddings=False,
                              rope_parameters={"rope_type": "default", "rope_theta": 10000.0}))


def test_qkv_bias_matches_qwen2_attention() -> None:
    cfg = _qwen2_config()
    ref = Qwen2Attention(cfg, layer_idx=0).eval()
    _randomize(ref, 0.3)
    assert ref.q_proj.bias is not None and ref.o_proj.bias is None
    ours = MultiHeadAttention(D, H, 2, bias=False, qkv_bias=True).eval()
    assert ours.out_proj.bias is None
    _fuse(ours.qkv_proj, ref.q_proj, ref.k_proj, ref.v_proj)
    _copy(ours.out_proj, ref.o_proj)
    t = 9
    x = torch.randn(2, t, D)
    positions = torch.arange(t)[None] + torch.tensor([[0], [4]])
    causal = torch.full((t, t), torch.finfo(torch.float32).min).triu(diagonal=1)[None, None]
    with torch.no_grad():
        want, _ = ref(x, position_embeddings=Qwen2RotaryEmbedding(cfg)(x, positions), attention_mask=causal)
        got, _ = ours(x, rotary=RotaryEmbedding(D // H)(positions), is_causal=True)
        _close(got, want)
        ours.qkv_proj.bias.zero_()
        _far(ours(x, rotary=RotaryEmbedding(D // H)(positions), is_causal=True)[0], want)


def _decoder_like_llama(ref: nn.Module, ours: nn.Module) -> None:
    """The LLaMA key map (Qwen2 the same, with biases on q, k, v)."""
    _copy(ours.embed, ref.model.embed_tokens)
    _copy(ours.lm_head.proj, ref.lm_head)
    _copy(ours.decoder.final_norm, ref.model.norm)
    for mine, lay in zip(ours.decoder.layers, ref.model.layers, strict=True):
        a, m = lay.self_attn, lay.mlp
        _fuse(mine.self_attn.qkv_proj, a.q_proj, a.k_proj, a.v_proj)
        _copy(mine.self_attn.out_proj, a.o_proj)
        _copy(mine.self_res.norm, lay.input_layernorm)
        _copy(mine.ffn_res.norm, lay.post_attention_layernorm)
        _fuse(mine.ffn.w_in, m.gate_proj, m.up_proj)
        _copy(mine.ffn.w_out, m.down_proj)


def test_qwen2_model_matches() -> None:
    ref = Qwen2ForCausalLM(_qwen2_config()).eval()
    _randomize(ref)
    ours = build_model(ModelConfig.preset("llama", **SMALL, n_kv_heads=2, qkv_bias=True)).eval()
    _decoder_like_llama(ref, ours)
    ids = torch.randint(0, V, (2, 11))
    with torch.no_grad():
        _close(ours(ids).logits, ref(input_ids=ids).logits)


# ---------------------------------------------------------------------------------------------- LLaMA 3 RoPE scaling
def _llama3_config(head_dim: int, theta: float, factor: float, low: float, high: float, original: int,
                   **kw: Any) -> LlamaConfig:
    rope = {"rope_type": "llama3", "rope_theta": theta, "factor": factor, "low_freq_factor": low,
            "high_freq_factor": high, "original_max_position_embeddings": original}
    return _eager(LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, num_key_value_heads=2,
                              head_dim=head_dim, max_position_embeddings=int(original * factor),
                              rope_parameters=rope, attention_bias=False, **kw))


@pytest.mark.parametrize("head_dim", [8, 64, 128])
@pytest.mark.parametrize("theta", [10000.0, 500000.0])
@pytest.mark.parametrize("factor,low,high,original", [(8.0, 1.0, 4.0, 8192), (32.0, 1.0, 4.0, 8192),
                                                       (4.0, 2.0, 8.0, 64), (2.0, 1.0, 4.0, 16)])
def test_llama3_inv_freq_matches_hf(head_dim: int, theta: float, factor: float, low: float, high: float,
                                    original: int) -> None:
    want, want_factor = ROPE_INIT_FUNCTIONS["llama3"](_llama3_config(head_dim, theta, factor, low, high, original))
    got, got_factor = rope_inv_freq(head_dim, theta, "llama3", factor, original, low, high)
    torch.testing.assert_close(got, want, atol=0, rtol=1e-6)
    assert got_factor == want_factor == 1.0


def test_llama3_scaling_changes_the_long_waves_only() -> None:
    plain, _ = rope_inv_freq(128, 500000.0)
    scaled, _ = rope_inv_freq(128, 500000.0, "llama3", 8.0, 8192, 1.0, 4.0)
    wavelen = 2 * torch.pi / plain
    assert torch.equal(scaled[wavelen < 8192 / 4], plain[wavelen < 8192 / 4])  # short waves kept
    torch.testing.assert_close(scaled[wavelen > 8192], plain[wavelen > 8192] / 8, atol=0, rtol=1e-6)
    medium = (wavelen >= 8192 / 4) & (wavelen <= 8192)
    assert medium.any() and bool(((scaled[medium] < plain[medium]) & (scaled[medium] > plain[medium] / 8)).all())


def test_llama3_rotary_and_model_match() -> None:
    cfg = _llama3_config(D // H, 500000.0, 8.0, 1.0, 4.0, 16, vocab_size=V, intermediate_size=FF,
                         num_hidden_layers=L, rms_norm_eps=1e-6, tie_word_embeddings=False)
    positions = torch.arange(40)[None]
    x = torch.randn(1, 40, D)
    cos_hf, sin_hf = LlamaRotaryEmbedding(cfg)(x, positions)
    cos, sin = RotaryEmbedding(D // H, 500000.0, "llama3", 8.0, 16, 1.0, 4.0)(positions)
    _close(cos, cos_hf)
    _close(sin, sin_hf)
    ref = LlamaForCausalLM(cfg).eval()
    _randomize(ref)
    ours = build_model(ModelConfig.preset(
        "llama", **SMALL, n_kv_heads=2, rope_theta=500000.0, rope_scaling="llama3", rope_scaling_factor=8.0,
        rope_original_max_len=16, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0)).eval()
    _decoder_like_llama(ref, ours)
    ids = torch.randint(0, V, (2, 40))
    with torch.no_grad():
        want = ref(input_ids=ids).logits
        _close(ours(ids).logits, want)
        _far(_same_weights(ours, rope_scaling="none")(ids).logits, want)


# ---------------------------------------------------------------------------------------------- the accelerator
def test_accelerated_models_with_the_options_equal_the_reference() -> None:
    """Token types, the tanh GELU, the output bias and the tied-output rescale through the accelerated model."""
    from aiayn.accel import accelerate, describe

    ids, is_token, types = _segments()
    bert, _ = _bert_pair(BertForMaskedLM)
    fast = accelerate(_same_weights(bert), "decode", accel="auto")
    assert describe(fast)
    with torch.no_grad(), fast.decoding_scope():
        _close(fast(ids, is_token=is_token, token_type_ids=types).logits,
               bert(ids, is_token=is_token, token_type_ids=types).logits)
        _close(fast(ids, is_token=is_token).logits, bert(ids, is_token=is_token).logits)
    src, _, tgt = _source_and_target(pad_id=0)
    for ours, args in ((_gpt2_pair()[0], (src,)), (_t5_pair()[0], (src, tgt))):
        fast = accelerate(_same_weights(ours), "decode", accel="auto")
        with torch.no_grad(), fast.decoding_scope():
            _close(fast(*args).logits, ours(*args).logits)


# ---------------------------------------------------------------------------------------------- defaults unchanged
#: configs whose models were built before these options existed (new options at their defaults), and per config:
#: the number of state_dict keys, a digest of their names, the absolute sum of the logits of a fixed input, and the
#: last position's first four logits of the first row. Computed with the models as they were before the options.
GOLDEN: dict[str, tuple[dict[str, Any], int, str, float, list[float]]] = {
    "tiny": ({}, 37, "51663c31eac55752", 389.7222060353961,
        [-1.384547, -0.880568, -0.387418, -1.278476]),
    "tiny:decoder": ({"arch": "decoder", "position": "learned"}, 16, "8d210e32a1a5fefd", 565.5307019023458,
        [0.031879, -0.157867, 0.292479, -0.381112]),
    "tiny:encoder": ({"arch": "encoder", "n_classes": 2}, 24, "0bf97573cb31a62c", 489.3182172412053,
        [1.190577, 0.528512, -0.504308, 0.402248]),
    "paper-base": ({}, 37, "51663c31eac55752", 389.7235527097946,
        [-1.384551, -0.880569, -0.387419, -1.27848]),
    "gpt2-small": ({"gelu_approximate": "none"}, 18, "5604c10fb5a85ecf", 70.39767214018502,
        [-0.102604, 0.224228, -0.076608, -0.078648]),
    "bert-base": ({"embedding_norm": False, "n_token_types": None}, 25, "e70a25966072c25d", 63.57702539828824,
        [-0.069811, 0.119307, -0.039482, 0.096706]),
    "t5-small": ({"tied_output_scale": False}, 25, "4f17f3beca07b5a3", 48.919306015915936,
        [-0.00992, -0.117803, -0.01311, 0.112454]),
    "llama": ({"n_kv_heads": 2}, 10, "fb3f44ac6fcbbfb5", 61.63212332814874,
        [-0.115152, 0.254131, 0.087378, -0.051066]),
}


def _golden_model(name: str, overrides: dict[str, Any]) -> tuple[nn.Module, Tensor]:
    preset = name.split(":")[0]
    torch.manual_seed(0)
    model = build_model(ModelConfig.preset(preset, **{**SMALL, "n_layers": 1, "dropout": 0.1, **overrides})).eval()
    ids = torch.randint(1, V, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        if model.config.arch == "encoder-decoder":
            logits = model(ids, ids[:, :5]).logits
        else:
            logits = model(ids).logits
    return model, logits


def _digest(names: list[str]) -> str:
    return hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()[:16]


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_defaults_leave_models_as_they_were(name: str) -> None:
    overrides, n_keys, digest, abs_sum, last = GOLDEN[name]
    model, logits = _golden_model(name, overrides)
    keys = list(model.state_dict())
    assert (len(keys), _digest(keys)) == (n_keys, digest)
    assert float(logits.double().abs().sum()) == pytest.approx(abs_sum, rel=1e-5)
    torch.testing.assert_close(logits[0, -1, :4], torch.tensor(last), atol=1e-5, rtol=0)
