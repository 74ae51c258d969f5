"""Parity with HF transformers: RoPE (+ linear / NTK / YaRN) vs LLaMA, ALiBi vs BLOOM, relative bias vs T5.

Every reference model is built from a tiny random config (never downloaded); weights are copied into ours.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from aiayn import ModelConfig, build_model
from aiayn.nn import masks as M
from aiayn.nn.attention import MultiHeadAttention
from aiayn.nn.positions import (
    ALiBi,
    RotaryEmbedding,
    T5RelativeBias,
    alibi_slopes,
    apply_rotary,
    rope_inv_freq,
    t5_relative_bucket,
)

transformers = pytest.importorskip("transformers")
from transformers import BloomConfig, LlamaConfig, LlamaForCausalLM, T5Config  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.bloom.modeling_bloom import BloomAttention, build_alibi_tensor  # noqa: E402
from transformers.models.llama.modeling_llama import (  # noqa: E402
    LlamaAttention,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)
from transformers.models.t5.modeling_t5 import T5Attention  # noqa: E402

ATOL = 1e-5


def _randomize(module: nn.Module, std: float = 0.3) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, std)


def _additive(mask: Tensor) -> Tensor:
    """Bool mask (True = may attend) -> the additive float mask HF models take (0 or the fp32 minimum)."""
    return torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)


def _hf_causal(t: int) -> Tensor:
    """(T, T) additive causal mask as HF builds it (0 on and below the diagonal, the fp32 minimum above), written
    out here rather than from aiayn's ``causal_mask``, so the reference never shares our mask."""
    return torch.full((t, t), torch.finfo(torch.float32).min).triu(diagonal=1)


def _llama_config(head_dim: int = 8, heads: int = 4, kv_heads: int = 2, rope: dict | None = None,
                  max_pos: int = 256, **kw: object) -> LlamaConfig:
    params = {"rope_type": "default", "rope_theta": 10000.0, **(rope or {})}
    cfg = LlamaConfig(hidden_size=head_dim * heads, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      head_dim=head_dim, max_position_embeddings=max_pos, rope_parameters=params,
                      attention_bias=False, **kw)
    cfg._attn_implementation = "eager"
    return cfg


# ---------------------------------------------------------------------------------------------- RoPE
ROPES = {
    "default": ({}, dict(scaling="none")),
    "linear": ({"rope_type": "linear", "factor": 4.0}, dict(scaling="linear", factor=4.0)),
    "yarn": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
             dict(scaling="yarn", factor=4.0, original_max_len=64)),
}


@pytest.mark.parametrize("rope", list(ROPES))
def test_rotary_matches_llama(rope: str) -> None:
    hf_params, ours_kw = ROPES[rope]
    head_dim = 64
    hf = LlamaRotaryEmbedding(_llama_config(head_dim=head_dim, rope=hf_params))
    ours = RotaryEmbedding(head_dim, 10000.0, **ours_kw)
    positions = torch.arange(12)[None] + torch.tensor([[0], [37]])  # (2, 12): two different offsets
    q, k = torch.randn(2, 4, 12, head_dim), torch.randn(2, 4, 12, head_dim)
    cos_hf, sin_hf = hf(q, positions)
    cos, sin = ours(positions)
    torch.testing.assert_close(cos, cos_hf, atol=ATOL, rtol=0)
    torch.testing.assert_close(sin, sin_hf, atol=ATOL, rtol=0)
    q_hf, k_hf = apply_rotary_pos_emb(q, k, cos_hf, sin_hf)
    torch.testing.assert_close(apply_rotary(q, cos, sin), q_hf, atol=ATOL, rtol=0)
    torch.testing.assert_close(apply_rotary(k, cos, sin), k_hf, atol=ATOL, rtol=0)


@pytest.mark.parametrize("rope_type", ["linear", "yarn"])
@pytest.mark.parametrize("head_dim", [16, 64, 128])
@pytest.mark.parametrize("factor", [1.0, 2.0, 4.0, 16.0])
@pytest.mark.parametrize("original", [64, 4096])
@pytest.mark.parametrize("theta", [10000.0, 500000.0])
def test_scaled_inv_freq_matches_hf(rope_type: str, head_dim: int, factor: float, original: int,
                                    theta: float) -> None:
    params = {"rope_type": rope_type, "factor": factor, "rope_theta": theta}
    if rope_type == "yarn":
        params["original_max_position_embeddings"] = original
    cfg = _llama_config(head_dim=head_dim, heads=2, kv_heads=2, rope=params, max_pos=int(original * factor))
    want, want_factor = ROPE_INIT_FUNCTIONS[rope_type](cfg)
    got, got_factor = rope_inv_freq(head_dim, theta, rope_type, factor, original)
    torch.testing.assert_close(got, want, atol=0, rtol=1e-6)
    assert got_factor == pytest.approx(want_factor, rel=1e-12)


@pytest.mark.parametrize("head_dim", [8, 64, 128])
@pytest.mark.parametrize("factor", [2.0, 8.0])
def test_ntk_inv_freq_matches_formula_and_hf_dynamic(head_dim: int, factor: float) -> None:
    got, attention_factor = rope_inv_freq(head_dim, 10000.0, "ntk", factor)
    theta = 10000.0 * factor ** (head_dim / (head_dim - 2))  # theta' = theta * factor^(d/(d-2))
    want = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    torch.testing.assert_close(got, want.float(), atol=0, rtol=1e-6)
    assert attention_factor == 1.0
    # HF's dynamic NTK, factor 1, at seq_len = factor * L has the same base: theta * (seq_len / L)^(d/(d-2))
    cfg = _llama_config(head_dim=head_dim, heads=2, kv_heads=2, max_pos=64,
                        rope={"rope_type": "dynamic", "factor": 1.0})
    hf, _ = ROPE_INIT_FUNCTIONS["dynamic"](cfg, seq_len=int(64 * factor))
    torch.testing.assert_close(got, hf, atol=0, rtol=1e-6)


@pytest.mark.parametrize("rope", ["default", "yarn"])
@pytest.mark.parametrize("kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_llama_attention_matches(rope: str, kv_heads: int) -> None:
    hf_params, ours_kw = ROPES[rope]
    cfg = _llama_config(head_dim=8, heads=4, kv_heads=kv_heads, rope=hf_params)
    ref = LlamaAttention(cfg, layer_idx=0).eval()
    _randomize(ref)
    ours = MultiHeadAttention(32, 4, kv_heads, bias=False).eval()
    with torch.no_grad():
        ours.qkv_proj.weight.copy_(torch.cat([ref.q_proj.weight, ref.k_proj.weight, ref.v_proj.weight]))
        ours.out_proj.weight.copy_(ref.o_proj.weight)
    b, t = 2, 9
    x = torch.randn(b, t, 32)
    positions = torch.arange(t)[None] + torch.tensor([[0], [5]])  # (B, T)
    cos_sin = LlamaRotaryEmbedding(cfg)(x, positions)
    with torch.no_grad():
        causal = _hf_causal(t)[None, None]  # (1, 1, T, T)
        want, w_want = ref(x, position_embeddings=cos_sin, attention_mask=causal)
        rotary = RotaryEmbedding(8, 10000.0, **ours_kw)(positions)
        for backend in ("reference", "sdpa"):
            ours.backend = backend
            got, _ = ours(x, rotary=rotary, is_causal=True)
            torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
        _, weights = ours(x, rotary=rotary, is_causal=True, return_weights=True)
    torch.testing.assert_close(weights, w_want, atol=ATOL, rtol=0)


def _llama_pair() -> tuple[nn.Module, LlamaForCausalLM]:
    """Our `llama` preset, shrunk, and LlamaForCausalLM holding the same weights."""
    cfg = _llama_config(head_dim=8, heads=4, kv_heads=2, vocab_size=50, intermediate_size=48,
                        num_hidden_layers=2, rms_norm_eps=1e-6, tie_word_embeddings=False, pad_token_id=0)
    ref = LlamaForCausalLM(cfg).eval()
    _randomize(ref, std=0.2)
    ours = build_model(ModelConfig.preset("llama", vocab_size=50, d_model=32, n_heads=4, n_kv_heads=2,
                                          n_layers=2, d_ff=48, max_len=64)).eval()
    with torch.no_grad():
        ours.embed.weight.copy_(ref.model.embed_tokens.weight)
        ours.lm_head.proj.weight.copy_(ref.lm_head.weight)
        ours.decoder.final_norm.weight.copy_(ref.model.norm.weight)
        for mine, theirs in zip(ours.decoder.layers, ref.model.layers, strict=True):
            a, m = theirs.self_attn, theirs.mlp
            qkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])  # (H*Dh + 2*Hkv*Dh, D)
            mine.self_attn.qkv_proj.weight.copy_(qkv)
            mine.self_attn.out_proj.weight.copy_(a.o_proj.weight)
            mine.self_res.norm.weight.copy_(theirs.input_layernorm.weight)
            mine.ffn_res.norm.weight.copy_(theirs.post_attention_layernorm.weight)
            mine.ffn.w_in.weight.copy_(torch.cat([m.gate_proj.weight, m.up_proj.weight]))  # [gate; up]
            mine.ffn.w_out.weight.copy_(m.down_proj.weight)
    return ours, ref


def test_llama_model_logits_match() -> None:
    ours, ref = _llama_pair()
    ids = torch.randint(1, 50, (2, 10))
    with torch.no_grad():
        want = ref(input_ids=ids).logits
        got = ours(ids).logits
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def test_llama_model_left_padding_matches() -> None:
    ours, ref = _llama_pair()
    ids = torch.randint(1, 50, (2, 10))
    is_token = torch.ones(2, 10, dtype=torch.bool)
    is_token[1, :3] = False  # left padding
    ids[~is_token] = 0
    positions = (is_token.long().cumsum(-1) - 1).clamp(min=0)  # (B, T): real tokens count from 0
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=is_token.long(), position_ids=positions).logits
        got = ours(ids, is_token=is_token, positions=positions).logits
    torch.testing.assert_close(got[is_token], want[is_token], atol=ATOL, rtol=0)


# ---------------------------------------------------------------------------------------------- ALiBi
@pytest.mark.parametrize("n_heads", list(range(1, 17)))
def test_alibi_slopes_match_bloom(n_heads: int) -> None:
    t = 7
    alibi = build_alibi_tensor(torch.ones(1, t), n_heads, torch.float32)  # (H, 1, T) = slope_h * j
    want = alibi[:, 0, 1]
    torch.testing.assert_close(alibi_slopes(n_heads), want, atol=0, rtol=1e-6)
    want_all = alibi_slopes(n_heads)[:, None] * torch.arange(t)  # (H, T)
    torch.testing.assert_close(alibi[:, 0, :], want_all, atol=1e-6, rtol=0)


def _bloom_pair(n_heads: int) -> tuple[MultiHeadAttention, BloomAttention]:
    d = 8 * n_heads
    cfg = BloomConfig(hidden_size=d, n_head=n_heads, attention_dropout=0.0, hidden_dropout=0.0)
    ref = BloomAttention(cfg, layer_idx=0).eval()
    _randomize(ref)
    ours = MultiHeadAttention(d, n_heads).eval()
    with torch.no_grad():
        # BLOOM interleaves per head: rows are (H, 3, Dh) -> ours are [q (H*Dh); k (H*Dh); v (H*Dh)]
        w = ref.query_key_value.weight.view(n_heads, 3, 8, d)
        bias = ref.query_key_value.bias.view(n_heads, 3, 8)
        ours.qkv_proj.weight.copy_(w.permute(1, 0, 2, 3).reshape(3 * d, d))
        ours.qkv_proj.bias.copy_(bias.permute(1, 0, 2).reshape(3 * d))
        ours.out_proj.load_state_dict(ref.dense.state_dict())
    return ours, ref


@pytest.mark.parametrize("n_heads", [4, 6])
def test_bloom_attention_matches_alibi(n_heads: int) -> None:
    ours, ref = _bloom_pair(n_heads)
    b, t = 2, 9
    x = torch.randn(b, t, 8 * n_heads)
    alibi = build_alibi_tensor(torch.ones(b, t), n_heads, torch.float32)  # (B*H, 1, T): slope * key position
    with torch.no_grad():
        want, w_want = ref(x, torch.zeros_like(x), alibi, _hf_causal(t)[None, None])
        positions = torch.arange(t)[None]
        bias = ALiBi(n_heads)(positions, positions)  # (1, H, T, T): -slope * |i - j|
        for backend in ("reference", "sdpa"):
            ours.backend = backend
            got, _ = ours(x, bias=bias, is_causal=True)
            torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
        _, weights = ours(x, bias=bias, is_causal=True, return_weights=True)
    torch.testing.assert_close(weights, w_want, atol=ATOL, rtol=0)


def test_bloom_attention_left_padding_matches_alibi() -> None:
    n_heads, b, t = 4, 2, 8
    ours, ref = _bloom_pair(n_heads)
    x = torch.randn(b, t, 32)
    is_token = torch.ones(b, t, dtype=torch.bool)
    is_token[0, :3] = False
    mask = M.combine(M.causal_mask(t), M.padding_mask(is_token))  # (B, 1, T, T)
    alibi = build_alibi_tensor(is_token.long(), n_heads, torch.float32)  # positions: cumsum - 1 on tokens
    positions = (is_token.long().cumsum(-1) - 1).clamp(min=0)
    hf_mask = _hf_causal(t)[None, None] + _additive(is_token[:, None, None, :])  # (B, 1, T, T), not from ours
    with torch.no_grad():
        want, _ = ref(x, torch.zeros_like(x), alibi, hf_mask.clamp(min=torch.finfo(torch.float32).min))
        got, _ = ours(x, mask=mask, bias=ALiBi(n_heads)(positions, positions))
    torch.testing.assert_close(got[is_token], want[is_token], atol=ATOL, rtol=0)  # pad queries: no reference


# ---------------------------------------------------------------------------------------------- T5
@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (16, 32), (8, 16), (64, 256), (12, 40)])
def test_t5_bucket_matches_hf(bidirectional: bool, num_buckets: int, max_distance: int) -> None:
    rel = torch.arange(-400, 401)[None, :] + torch.zeros(3, 1, dtype=torch.long)  # (3, 801)
    want = T5Attention._relative_position_bucket(rel, bidirectional, num_buckets, max_distance)
    got = t5_relative_bucket(rel, bidirectional, num_buckets, max_distance)
    assert got.dtype == torch.long
    assert torch.equal(got, want)


def _t5_config(is_decoder: bool, d_kv: int = 8, **kw: object) -> T5Config:
    cfg = T5Config(d_model=32, d_kv=d_kv, num_heads=4, dropout_rate=0.0, is_decoder=is_decoder, **kw)
    cfg._attn_implementation = "eager"
    return cfg


@pytest.mark.parametrize("is_decoder", [False, True], ids=["encoder", "decoder"])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 20)])
@pytest.mark.parametrize("past", [0, 5])
def test_t5_relative_bias_matches_compute_bias(is_decoder: bool, num_buckets: int, max_distance: int,
                                               past: int) -> None:
    cfg = _t5_config(is_decoder, relative_attention_num_buckets=num_buckets,
                     relative_attention_max_distance=max_distance)
    ref = T5Attention(cfg, has_relative_attention_bias=True, layer_idx=0)
    ours = T5RelativeBias(4, num_buckets, max_distance, bidirectional=not is_decoder)
    ours.embedding.load_state_dict(ref.relative_attention_bias.state_dict())
    t, s = 40, 40 + past
    with torch.no_grad():
        want = ref.compute_bias(t, s, past_seen_tokens=past)  # (1, H, T, S)
        got = ours(torch.arange(past, past + t)[None], torch.arange(s)[None])
    torch.testing.assert_close(got, want, atol=0, rtol=0)


@pytest.mark.parametrize("is_decoder", [False, True], ids=["encoder", "decoder"])
@pytest.mark.parametrize("d_kv", [8, 16], ids=["inner=d", "inner=2d"])
def test_t5_attention_matches(is_decoder: bool, d_kv: int) -> None:
    ref = T5Attention(_t5_config(is_decoder, d_kv=d_kv), has_relative_attention_bias=True, layer_idx=0).eval()
    _randomize(ref)
    ours = MultiHeadAttention(32, 4, head_dim=d_kv, bias=False, scale=1.0).eval()
    rel_bias = T5RelativeBias(4, 32, 128, bidirectional=not is_decoder)
    with torch.no_grad():
        ours.qkv_proj.weight.copy_(torch.cat([ref.q.weight, ref.k.weight, ref.v.weight]))
        ours.out_proj.weight.copy_(ref.o.weight)
        rel_bias.embedding.weight.copy_(ref.relative_attention_bias.weight)
    b, t = 3, 10
    x = torch.randn(b, t, 32)
    is_token = torch.arange(t)[None, :] < torch.tensor([[t], [7], [4]])  # right padding
    mask = M.padding_mask(is_token)
    hf_mask = _additive(is_token[:, None, None, :])  # (B, 1, 1, T), written independently of aiayn's masks
    if is_decoder:
        mask = M.combine(mask, M.causal_mask(t))
        hf_mask = (hf_mask + _hf_causal(t)).clamp(min=torch.finfo(torch.float32).min)  # (B, 1, T, T)
    positions = torch.arange(t)[None]
    with torch.no_grad():
        want, _, w_want = ref(x, mask=hf_mask)
        bias = rel_bias(positions, positions)
        for backend in ("reference", "sdpa"):
            ours.backend = backend
            got, _ = ours(x, mask=mask, bias=bias)
            torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
        _, weights = ours(x, mask=mask, bias=bias, return_weights=True)
    torch.testing.assert_close(weights, w_want, atol=ATOL, rtol=0)
    assert math.isclose(float(weights.sum(-1).mean()), 1.0, rel_tol=1e-6)
