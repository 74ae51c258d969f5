"""Parity with torch.nn: our MultiHeadAttention vs nn.MultiheadAttention, the paper's model vs nn.Transformer.

Weights are copied from the torch module into ours (or the reverse), then outputs must agree in fp32.
torch's side always gets torch's own causal masking (``generate_square_subsequent_mask``, ``is_causal=True`` or a
``triu`` written out here), never aiayn's ``causal_mask``: a wrong mask must not be able to agree with itself.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.models.build import build_model
from aiayn.nn import masks as M
from aiayn.nn.attention import MultiHeadAttention, scaled_dot_product_attention

D, H, B, T, S = 32, 4, 3, 5, 7
ATOL = 1e-5


def _randomize(module: nn.Module, std: float = 0.3) -> None:
    """Overwrite every parameter with noise (so zero biases / unit norms cannot hide a wrong copy)."""
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, std)


def _copy_linear(dst: nn.Linear, weight: Tensor, bias: Tensor | None) -> None:
    with torch.no_grad():
        dst.weight.copy_(weight)
        if bias is not None:
            dst.bias.copy_(bias)


def _pair(cross: bool) -> tuple[MultiHeadAttention, nn.MultiheadAttention]:
    """Our attention and torch's, with torch's random weights copied into ours."""
    ref = nn.MultiheadAttention(D, H, batch_first=True)
    _randomize(ref)
    ours = MultiHeadAttention(D, H, cross=cross)
    w, b = ref.in_proj_weight, ref.in_proj_bias  # (3D, D): [W_q; W_k; W_v]
    if cross:
        _copy_linear(ours.q_proj, w[:D], b[:D])
        _copy_linear(ours.kv_proj, w[D:], b[D:])
    else:
        _copy_linear(ours.qkv_proj, w, b)
    _copy_linear(ours.out_proj, ref.out_proj.weight, ref.out_proj.bias)
    return ours.eval(), ref.eval()


def _torch_future(t: int) -> Tensor:
    """(T, T) bool in torch's convention (True = masked): the strictly upper triangle, written out here."""
    return torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)


def _key_is_token(n_keys: int) -> Tensor:
    """(B, S) bool with some right padding (no example fully padded)."""
    lengths = torch.tensor([n_keys, n_keys - 2, 1])
    return torch.arange(n_keys)[None, :] < lengths[:, None]


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
@pytest.mark.parametrize("padding", [False, True], ids=["nopad", "pad"])
def test_self_attention_matches_torch(backend: str, padding: bool) -> None:
    ours, ref = _pair(cross=False)
    ours.backend = backend
    x = torch.randn(B, T, D)
    is_token = _key_is_token(T) if padding else None
    want, _ = ref(x, x, x, key_padding_mask=None if is_token is None else ~is_token, need_weights=False)
    got, _ = ours(x, mask=None if is_token is None else M.padding_mask(is_token))
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
@pytest.mark.parametrize("padding", [False, True], ids=["nopad", "pad"])
def test_cross_attention_matches_torch(backend: str, padding: bool) -> None:
    ours, ref = _pair(cross=True)
    ours.backend = backend
    x, memory = torch.randn(B, T, D), torch.randn(B, S, D)
    is_token = _key_is_token(S) if padding else None
    pad = None if is_token is None else ~is_token  # torch: True = ignore
    want, _ = ref(x, memory, memory, key_padding_mask=pad, need_weights=False)
    got, _ = ours(x, memory, mask=None if is_token is None else M.padding_mask(is_token))
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
@pytest.mark.parametrize("how", ["is_causal", "mask"])
def test_causal_self_attention_matches_torch(backend: str, how: str) -> None:
    ours, ref = _pair(cross=False)
    ours.backend = backend
    x = torch.randn(B, T, D)
    torch_causal = nn.Transformer.generate_square_subsequent_mask(T)  # (T, T) float, -inf above the diagonal
    want, _ = ref(x, x, x, attn_mask=torch_causal, is_causal=True, need_weights=False)
    if how == "is_causal":
        got, _ = ours(x, is_causal=True)
    else:
        got, _ = ours(x, mask=M.causal_mask(T))  # aiayn's mask, held to torch's
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
@pytest.mark.parametrize("t,s", [(T, T), (1, S), (3, S)], ids=["square", "step", "chunk"])
def test_causal_attention_matches_torch_sdpa(backend: str, t: int, s: int) -> None:
    """Against F.scaled_dot_product_attention: its own is_causal when square; with a cache (T < S) the T queries
    are the last T positions, so query i may see keys j <= S - T + i (a tril written out here)."""
    q, k, v = torch.randn(B, H, t, D // H), torch.randn(B, H, s, D // H), torch.randn(B, H, s, D // H)
    if t == s:
        want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        allowed = torch.ones(t, s, dtype=torch.bool).tril(diagonal=s - t)  # (T, S), True = may attend
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    got, _ = scaled_dot_product_attention(q, k, v, is_causal=True, backend=backend)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    got, _ = scaled_dot_product_attention(q, k, v, mask=M.causal_mask(t, s), backend=backend)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def test_causal_and_padding_together_match_torch() -> None:
    ours, ref = _pair(cross=False)
    x = torch.randn(B, T, D)
    is_token = _key_is_token(T)
    want, _ = ref(x, x, x, attn_mask=_torch_future(T), key_padding_mask=~is_token, need_weights=False)
    got, _ = ours(x, mask=M.padding_mask(is_token), is_causal=True)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    got, _ = ours(x, mask=M.combine(M.causal_mask(T), M.padding_mask(is_token)))
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
def test_attention_weights_match_torch(cross: bool) -> None:
    ours, ref = _pair(cross=cross)
    x = torch.randn(B, T, D)
    kv = torch.randn(B, S, D) if cross else x
    is_token = _key_is_token(kv.shape[1])
    out_avg, w_avg = ref(x, kv, kv, key_padding_mask=~is_token, need_weights=True, average_attn_weights=True)
    _, w_heads = ref(x, kv, kv, key_padding_mask=~is_token, need_weights=True, average_attn_weights=False)
    got, weights = ours(x, kv if cross else None, mask=M.padding_mask(is_token), return_weights=True)
    assert weights is not None and weights.shape == (B, H, T, kv.shape[1])
    torch.testing.assert_close(got, out_avg, atol=ATOL, rtol=0)
    torch.testing.assert_close(weights.mean(dim=1), w_avg, atol=ATOL, rtol=0)
    torch.testing.assert_close(weights, w_heads, atol=ATOL, rtol=0)
    assert bool((weights[~M.padding_mask(is_token).expand_as(weights)] == 0).all())  # padded keys: exactly 0


# ---------------------------------------------------------------------------------------------- full model
def _paper_pair() -> tuple[nn.Module, nn.Transformer]:
    """A shrunk paper-base model and a torch.nn.Transformer holding the same weights.

    torch.nn.Transformer applies a final LayerNorm after each stack even when post-LN; the paper's model has
    none (each post-LN layer already ends in a norm), so those two norms are removed.
    """
    cfg = ModelConfig.preset("paper-base", vocab_size=50, d_model=D, n_heads=H, d_ff=64, n_layers=2,
                             dropout=0.0, norm_eps=1e-5)
    model = build_model(cfg).eval()
    _randomize(model, std=0.2)
    tr = nn.Transformer(d_model=D, nhead=H, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=64,
                        dropout=0.0, activation="relu", batch_first=True, norm_first=False,
                        layer_norm_eps=1e-5)
    tr.encoder.norm = nn.Identity()
    tr.decoder.norm = nn.Identity()
    tr.encoder.enable_nested_tensor = tr.encoder.use_nested_tensor = False  # no nested-tensor fast path
    _randomize(tr, std=0.2)
    with torch.no_grad():
        # attention in-projections torch -> ours (fused [W_q; W_k; W_v]); everything else ours -> torch
        for mine, theirs in zip(model.encoder.layers, tr.encoder.layers, strict=True):
            sa = theirs.self_attn
            _copy_linear(mine.self_attn.qkv_proj, sa.in_proj_weight, sa.in_proj_bias)
            for src, dst in ((mine.self_attn.out_proj, sa.out_proj), (mine.self_res.norm, theirs.norm1),
                             (mine.ffn.w_in, theirs.linear1), (mine.ffn.w_out, theirs.linear2),
                             (mine.ffn_res.norm, theirs.norm2)):
                dst.load_state_dict(src.state_dict())
        for mine, theirs in zip(model.decoder.layers, tr.decoder.layers, strict=True):
            sa = theirs.self_attn
            _copy_linear(mine.self_attn.qkv_proj, sa.in_proj_weight, sa.in_proj_bias)
            w, b = theirs.multihead_attn.in_proj_weight, theirs.multihead_attn.in_proj_bias
            _copy_linear(mine.cross_attn.q_proj, w[:D], b[:D])
            _copy_linear(mine.cross_attn.kv_proj, w[D:], b[D:])
            for src, dst in ((mine.self_attn.out_proj, theirs.self_attn.out_proj),
                             (mine.cross_attn.out_proj, theirs.multihead_attn.out_proj),
                             (mine.self_res.norm, theirs.norm1), (mine.cross_res.norm, theirs.norm2),
                             (mine.ffn.w_in, theirs.linear1), (mine.ffn.w_out, theirs.linear2),
                             (mine.ffn_res.norm, theirs.norm3)):
                dst.load_state_dict(src.state_dict())
    return model, tr.eval()


def _embed(stack: nn.Module, ids: Tensor) -> Tensor:
    """What our stack feeds its first layer: Emb(ids) * sqrt(D) + PE (dropout is 0), via its own modules."""
    positions = torch.arange(ids.shape[1])[None]  # (1, T)
    return stack.embed(ids) * stack.embed_scale + stack.abs_pos(positions)


def test_embedding_input_is_the_papers() -> None:
    """Section 3.4/3.5: embeddings times sqrt(d_model), plus PE(pos, 2i) = sin(pos / 10000^(2i/d)),
    PE(pos, 2i+1) = cos(pos / 10000^(2i/d)), written out here independently of the library."""
    model, _ = _paper_pair()
    ids = torch.randint(1, 50, (B, T))
    pos = torch.arange(T, dtype=torch.float64)[:, None]  # (T, 1)
    two_i = torch.arange(0, D, 2, dtype=torch.float64)[None, :]  # (1, D/2)
    pe = torch.zeros(T, D, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos / 10000 ** (two_i / D))
    pe[:, 1::2] = torch.cos(pos / 10000 ** (two_i / D))
    want = model.src_embed.weight[ids] * D**0.5 + pe.float()
    for stack in (model.encoder, model.decoder):
        torch.testing.assert_close(_embed(stack, ids), want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_paper_model_matches_torch_transformer(backend: str) -> None:
    model, tr = _paper_pair()
    for mod in model.modules():
        if isinstance(mod, MultiHeadAttention):
            mod.backend = backend
    src = torch.randint(1, 50, (B, S))
    src[1, 5:] = 0  # right padding (pad_id 0)
    src[2, 2:] = 0
    tgt = torch.randint(1, 50, (B, T))
    src_pad = src == 0  # torch: True = ignore
    with torch.no_grad():
        out = model(src, tgt)
        src_x, tgt_x = _embed(model.encoder, src), _embed(model.decoder, tgt)
        memory = tr.encoder(src_x, src_key_padding_mask=src_pad)
        want = tr.decoder(tgt_x, memory, tgt_mask=nn.Transformer.generate_square_subsequent_mask(T),
                          memory_key_padding_mask=src_pad, tgt_is_causal=True)
        ours_memory, _, _ = model.encode(src)
    real = ~src_pad
    torch.testing.assert_close(ours_memory[real], memory[real], atol=ATOL, rtol=0)
    torch.testing.assert_close(out.hidden, want, atol=ATOL, rtol=0)
    # tied output projection (paper section 3.4): logits = hidden @ E^T
    torch.testing.assert_close(out.logits, want @ model.src_embed.weight.T, atol=1e-4, rtol=0)


def test_paper_model_matches_torch_transformer_forward() -> None:
    """The same comparison through nn.Transformer.forward (its own mask plumbing)."""
    model, tr = _paper_pair()
    src = torch.randint(1, 50, (B, S))
    src[0, 4:] = 0
    tgt = torch.randint(1, 50, (B, T))
    with torch.no_grad():
        want = tr(_embed(model.encoder, src), _embed(model.decoder, tgt),
                  tgt_mask=nn.Transformer.generate_square_subsequent_mask(T), src_key_padding_mask=src == 0,
                  memory_key_padding_mask=src == 0, tgt_is_causal=True)
        got = model(src, tgt).hidden
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
