"""Property tests of the core: the seed lesson's two theorems and the invariants every family relies on.

- Self-attention without positions or masks is permutation-equivariant; any position scheme breaks that.
- Under a causal mask no information flows from future tokens, for every position scheme and decoder kind.
- Appending padding never changes the outputs at real tokens (encoder, decoder, cross-attention).
- Attention rows are distributions; masked weights are exactly zero; fully masked rows are all zero.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from aiayn.config import POSITIONS, ModelConfig
from aiayn.models import DecoderModel, EncoderDecoderModel, EncoderModel, build_model
from aiayn.nn.attention import MultiHeadAttention, scaled_dot_product_attention

FAST = settings(max_examples=20, deadline=None)  # cheap examples (one attention call)
MODELS = settings(max_examples=10, deadline=None)  # each example builds and runs a model
POSITIONED = [p for p in POSITIONS if p != "none"]


def _tiny(**overrides: Any) -> ModelConfig:
    base: dict[str, Any] = dict(vocab_size=40, d_model=16, n_heads=4, n_layers=2, d_ff=32, max_len=64,
                                dropout=0.0)
    return ModelConfig.preset("tiny", **{**base, **overrides})


def _model(seed: int = 0, **overrides: Any) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(_tiny(**overrides)).eval()


# ------------------------------------------------------------------------------- permutation equivariance
@FAST
@given(seed=st.integers(0, 2**16), t=st.integers(2, 8), perm_seed=st.integers(0, 2**16))
def test_multi_head_self_attention_is_permutation_equivariant(seed: int, t: int, perm_seed: int) -> None:
    torch.manual_seed(seed)
    mha = MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, t, 16)
    perm = torch.randperm(t, generator=torch.Generator().manual_seed(perm_seed))
    with torch.no_grad():
        out, _ = mha(x)
        out_perm, _ = mha(x[:, perm])
    torch.testing.assert_close(out_perm, out[:, perm], atol=1e-5, rtol=1e-5)


@MODELS
@given(seed=st.integers(0, 2**16), t=st.integers(2, 10), perm_seed=st.integers(0, 2**16),
       norm_position=st.sampled_from(["post", "pre"]), activation=st.sampled_from(["relu", "swiglu"]))
def test_encoder_stack_without_positions_is_permutation_equivariant(
        seed: int, t: int, perm_seed: int, norm_position: str, activation: str) -> None:
    model = _model(seed, arch="encoder", position="none", norm_position=norm_position, activation=activation)
    g = torch.Generator().manual_seed(perm_seed)
    ids = torch.randint(1, 40, (2, t), generator=g)  # no padding
    perm = torch.randperm(t, generator=g)
    with torch.no_grad():
        h = model(ids, task="hidden").logits
        h_perm = model(ids[:, perm], task="hidden").logits
    torch.testing.assert_close(h_perm, h[:, perm], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("position", POSITIONED)
def test_encoder_stack_with_positions_is_not_permutation_equivariant(position: str) -> None:
    model = _model(1, arch="encoder", position=position)
    ids = torch.arange(1, 9)[None]  # 8 distinct tokens
    perm = torch.tensor([3, 0, 6, 1, 7, 2, 5, 4])  # not a reversal (ALiBi's |i - j| is symmetric under it)
    with torch.no_grad():
        h = model(ids, task="hidden").logits
        h_perm = model(ids[:, perm], task="hidden").logits
    assert not torch.allclose(h_perm, h[:, perm], atol=1e-3)


def test_bidirectional_alibi_is_equivariant_to_reversal_only() -> None:
    """ALiBi's bias -slope * |i - j| is unchanged by reversing the sequence, so the outputs just reverse."""
    model = _model(1, arch="encoder", position="alibi")
    ids = torch.arange(1, 9)[None]
    rev = torch.arange(7, -1, -1)
    with torch.no_grad():
        h = model(ids, task="hidden").logits
        h_rev = model(ids[:, rev], task="hidden").logits
    torch.testing.assert_close(h_rev, h[:, rev], atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------- causality
def _future_gradient(model: torch.nn.Module, embed: torch.nn.Embedding, run: Any, t: int) -> torch.Tensor:
    """max |d out[:, i] / d emb[:, j]| for each pair (i, j), as a (T, T) tensor.

    ``run()`` computes the decoder output (B, T, V); ``emb`` is the last output of ``embed`` during it (the
    decoder's, when an encoder shares the embedding and runs first).
    """
    captured: list[torch.Tensor] = []

    def keep(_m: torch.nn.Module, _args: Any, out: torch.Tensor) -> torch.Tensor:
        out = out.detach().requires_grad_(True)
        captured.append(out)
        return out

    handle = embed.register_forward_hook(keep)
    try:
        logits = run()
    finally:
        handle.remove()
    emb = captured[-1]
    grads = torch.zeros(t, t)
    for i in range(t):
        (g,) = torch.autograd.grad(logits[:, i].sum(), emb, retain_graph=True)
        grads[i] = g.abs().amax(dim=(0, 2))  # (T,): over batch and width
    return grads


DECODER_VARIANTS = [dict(position=p) for p in POSITIONS] + [
    dict(position="rope", sliding_window=3),
    dict(position="alibi", sliding_window=2, n_kv_heads=2),
    dict(position="sinusoidal", n_kv_heads=1),
    dict(position="t5", n_kv_heads=2, norm_position="pre", norm="rmsnorm", activation="swiglu"),
]


def _variant_id(variant: dict[str, Any]) -> str:
    return "-".join(f"{k}={x}" for k, x in variant.items())


@pytest.mark.parametrize("variant", DECODER_VARIANTS, ids=_variant_id)
def test_decoder_model_leaks_nothing_from_the_future(variant: dict[str, Any]) -> None:
    model = _model(2, arch="decoder", **variant)
    assert isinstance(model, DecoderModel)
    t = 7
    ids = torch.randint(1, 40, (2, t), generator=torch.Generator().manual_seed(0))
    grads = _future_gradient(model, model.embed, lambda: model(ids).logits, t)
    future = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
    assert torch.all(grads[future] == 0), grads
    assert bool((torch.diagonal(grads) > 0).all())  # each output does depend on its own input
    window = variant.get("sliding_window")
    if window is None:  # and on every earlier one
        assert bool((grads[~future] > 0).all())
    else:  # two layers of a window w reach back 2 (w - 1) positions, no further
        i, j = torch.meshgrid(torch.arange(t), torch.arange(t), indexing="ij")
        out_of_reach = (i - j) > 2 * (window - 1)
        assert bool(out_of_reach.any()) and torch.all(grads[out_of_reach] == 0), grads
        assert bool((grads[~future & ~out_of_reach] > 0).all())


ENC_DEC_VARIANTS = [dict(position=p) for p in POSITIONS] + [dict(position="rope", n_kv_heads=2)]


@pytest.mark.parametrize("variant", ENC_DEC_VARIANTS, ids=_variant_id)
def test_encoder_decoder_decoder_leaks_nothing_from_the_future(variant: dict[str, Any]) -> None:
    model = _model(3, arch="encoder-decoder", **variant)
    assert isinstance(model, EncoderDecoderModel)
    t = 6
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(1, 40, (2, 5), generator=g), torch.randint(1, 40, (2, t), generator=g)
    grads = _future_gradient(model, model.tgt_embed, lambda: model(src, tgt).logits, t)
    future = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
    assert torch.all(grads[future] == 0), grads
    assert bool((grads[~future] > 0).all())


@MODELS
@given(seed=st.integers(0, 2**16), t=st.integers(2, 9), j=st.integers(0, 8),
       position=st.sampled_from(POSITIONS), window=st.sampled_from([None, 2, 4]))
def test_changing_a_future_token_changes_no_earlier_logit(seed: int, t: int, j: int, position: str,
                                                          window: int | None) -> None:
    j = j % t
    model = _model(seed % 7, arch="decoder", position=position, sliding_window=window)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 40, (1, t), generator=g)
    changed = ids.clone()
    changed[0, j] = 1 + (int(ids[0, j]) % 39)  # a different token
    with torch.no_grad():
        a, b = model(ids).logits, model(changed).logits
    assert torch.equal(a[:, :j], b[:, :j])


# ------------------------------------------------------------------------------- padding invariance
@MODELS
@given(seed=st.integers(0, 2**16), t=st.integers(1, 8), n_pad=st.integers(1, 5),
       position=st.sampled_from(POSITIONS))
def test_encoder_padding_does_not_change_real_tokens(seed: int, t: int, n_pad: int, position: str) -> None:
    model = _model(seed % 5, arch="encoder", position=position)
    assert isinstance(model, EncoderModel)
    ids = torch.randint(1, 40, (2, t), generator=torch.Generator().manual_seed(seed))
    padded = torch.cat([ids, torch.zeros(2, n_pad, dtype=torch.long)], dim=1)
    with torch.no_grad():
        h = model(ids, task="hidden").logits
        h_pad = model(padded, task="hidden").logits
    torch.testing.assert_close(h_pad[:, :t], h, atol=1e-5, rtol=1e-5)


@MODELS
@given(seed=st.integers(0, 2**16), t=st.integers(1, 8), n_pad=st.integers(1, 5),
       position=st.sampled_from(POSITIONS), window=st.sampled_from([None, 3]))
def test_decoder_right_padding_does_not_change_real_tokens(seed: int, t: int, n_pad: int, position: str,
                                                           window: int | None) -> None:
    model = _model(seed % 5, arch="decoder", position=position, sliding_window=window)
    ids = torch.randint(1, 40, (2, t), generator=torch.Generator().manual_seed(seed))
    padded = torch.cat([ids, torch.zeros(2, n_pad, dtype=torch.long)], dim=1)
    with torch.no_grad():
        logits = model(ids).logits
        logits_pad = model(padded).logits
    torch.testing.assert_close(logits_pad[:, :t], logits, atol=1e-5, rtol=1e-5)


@MODELS
@given(seed=st.integers(0, 2**16), s=st.integers(1, 7), t=st.integers(1, 6), n_pad=st.integers(1, 5),
       position=st.sampled_from(POSITIONS))
def test_source_padding_does_not_change_cross_attention(seed: int, s: int, t: int, n_pad: int,
                                                        position: str) -> None:
    model = _model(seed % 5, arch="encoder-decoder", position=position)
    g = torch.Generator().manual_seed(seed)
    src, tgt = torch.randint(1, 40, (2, s), generator=g), torch.randint(1, 40, (2, t), generator=g)
    n_real = [s, s - 1 if s > 1 else s]  # ragged batch: row 1 already ends in padding; both get n_pad more
    src[1, n_real[1]:] = 0
    src_pad = torch.cat([src, torch.zeros(2, n_pad, dtype=torch.long)], dim=1)
    tgt_pad = torch.cat([tgt, torch.zeros(2, 2, dtype=torch.long)], dim=1)  # and target right padding
    with torch.no_grad():
        out = model(src, tgt, return_weights=True)
        out_pad = model(src_pad, tgt_pad, return_weights=True)
    torch.testing.assert_close(out_pad.logits[:, :t], out.logits, atol=1e-5, rtol=1e-5)
    assert out_pad.attentions is not None
    for w in out_pad.attentions["cross"]:  # (B, H, T + 2, S + n_pad): no weight on source padding
        for row, n in enumerate(n_real):
            assert torch.all(w[row, ..., n:] == 0)
            torch.testing.assert_close(w[row].sum(-1), torch.ones(w.shape[1:3]))


# ------------------------------------------------------------------------------- attention weights
@st.composite
def _attention_case(draw: st.DrawFn) -> tuple[torch.Tensor, ...]:
    b, h, t, s, d = (draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 6)),
                     draw(st.integers(1, 6)), draw(st.integers(1, 8)))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    q, k, v = torch.randn(b, h, t, d, generator=g), torch.randn(b, h, s, d, generator=g), torch.randn(
        b, h, s, d, generator=g)
    mask = torch.rand(b, h, t, s, generator=g) < draw(st.floats(0.1, 0.9))
    return q, k, v, mask


@FAST
@given(case=_attention_case(), fully_masked_row=st.booleans(), with_bias=st.booleans())
def test_attention_weights_are_distributions_with_exact_zeros(
        case: tuple[torch.Tensor, ...], fully_masked_row: bool, with_bias: bool) -> None:
    q, k, v, mask = case
    mask = mask.clone()
    # every row has at least one allowed key, except (optionally) the first query row of every head
    first_allowed = torch.zeros_like(mask)
    first_allowed[..., 0] = True
    mask = mask | (~mask.any(-1, keepdim=True) & first_allowed)
    if fully_masked_row:
        mask[..., 0, :] = False
    bias = torch.randn(mask.shape, generator=torch.Generator().manual_seed(7)) if with_bias else None
    out, w = scaled_dot_product_attention(q, k, v, mask=mask, bias=bias, backend="reference",
                                          return_weights=True)
    assert w is not None and w.shape == mask.shape
    assert torch.all(w[~mask] == 0)  # exactly zero, not merely small
    assert not torch.isnan(out).any() and not torch.isnan(w).any()
    has_key = mask.any(-1)  # (B, H, T)
    torch.testing.assert_close(w.sum(-1)[has_key], torch.ones(int(has_key.sum())))
    assert torch.all(w.sum(-1)[~has_key] == 0)
    assert torch.all(out[~has_key] == 0)  # a query with nothing to see outputs zeros
    torch.testing.assert_close(out, w @ v)
    # the fused backend agrees, including on fully masked rows
    fused, _ = scaled_dot_product_attention(q, k, v, mask=mask, bias=bias, backend="sdpa")
    torch.testing.assert_close(fused, out, atol=1e-5, rtol=1e-5)


@FAST
@given(case=_attention_case())
def test_causal_weights_are_lower_triangular(case: tuple[torch.Tensor, ...]) -> None:
    q, k, v, _ = case
    t, s = q.shape[2], k.shape[2]
    if t > s:
        q = q[:, :, :s]
        t = s
    _, w = scaled_dot_product_attention(q, k, v, is_causal=True, return_weights=True)
    assert w is not None
    allowed = torch.ones(t, s, dtype=torch.bool).tril(diagonal=s - t)  # queries aligned to the end of keys
    assert torch.all(w[..., ~allowed] == 0)
    torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))
