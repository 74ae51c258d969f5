"""The three model families: parameter/FLOP counts, DeepNorm, attention-weight shapes, heads, prefix-LM."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from aiayn import (
    DecoderModel,
    EncoderDecoderModel,
    EncoderModel,
    ModelConfig,
    build_model,
    count_parameters,
    forward_flops_per_token,
)
from aiayn.models.init import deepnorm_constants


def _tiny(**overrides: Any) -> ModelConfig:
    return ModelConfig.preset("tiny", **{"vocab_size": 50, **overrides})


def _built(seed: int = 0, **overrides: Any) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(_tiny(**overrides)).eval()


# ------------------------------------------------------------------------------------------- counting
def test_build_model_picks_the_class_from_arch() -> None:
    assert isinstance(_built(arch="encoder"), EncoderModel)
    assert isinstance(_built(arch="decoder"), DecoderModel)
    assert isinstance(_built(arch="encoder-decoder"), EncoderDecoderModel)


def test_count_parameters_counts_tied_weights_once() -> None:
    v, d = 50, 32
    tied = _built(arch="decoder", tie_embeddings=True)
    untied = _built(arch="decoder", tie_embeddings=False)
    assert tied.lm_head.proj.weight is tied.embed.weight
    naive = sum(p.numel() for _, p in tied.named_parameters(remove_duplicate=False))
    # one matrix registered three times: model.embed, decoder.embed (the stack's) and lm_head.proj
    assert naive - count_parameters(tied) == 2 * v * d
    assert count_parameters(untied) - count_parameters(tied) == v * d
    # encoder-decoder with shared source/target embeddings and a tied output layer: one V x D matrix
    shared = _built(arch="encoder-decoder")
    separate = _built(arch="encoder-decoder", share_src_tgt_embeddings=False, tie_embeddings=False)
    assert count_parameters(separate) - count_parameters(shared) == 2 * v * d
    assert count_parameters(shared, exclude_embeddings=True) == count_parameters(shared) - v * d
    frozen = _built(arch="decoder")
    frozen.embed.weight.requires_grad_(False)
    assert count_parameters(frozen, trainable_only=True) == count_parameters(frozen) - v * d


def test_forward_flops_are_about_twice_the_parameters_for_a_short_context() -> None:
    c = ModelConfig(arch="decoder", vocab_size=1000, d_model=256, n_heads=4, n_layers=4, d_ff=1024,
                    max_len=64, position="rope", tie_embeddings=True, dropout=0.0)
    with torch.device("meta"):
        n = count_parameters(build_model(c, init=False))  # includes the (tied) V x D output matrix once
    flops = forward_flops_per_token(c, tgt_len=1)
    assert 1.9 * n <= flops <= 2.1 * n, (flops, n)
    # attention over a longer context costs more, linearly in its length
    grow = forward_flops_per_token(c, tgt_len=101) - flops
    assert grow == pytest.approx(2 * c.n_layers * 100 * c.d_model)
    gqa = forward_flops_per_token(c.replace(n_kv_heads=1), tgt_len=1)
    assert gqa < flops


def test_deepnorm_constants_and_residual_scale() -> None:
    dec = _tiny(arch="decoder", n_layers=3, deepnorm=True)
    assert deepnorm_constants(dec)["decoder"] == pytest.approx(((2 * 3) ** 0.25, (8 * 3) ** -0.25))
    model = build_model(dec)
    assert all(layer.self_res.alpha == pytest.approx(6**0.25) for layer in model.decoder.layers)
    assert all(layer.ffn_res.alpha == pytest.approx(6**0.25) for layer in model.decoder.layers)
    # encoder-decoder (DeepNet paper, section 3.2): N encoder and M decoder layers
    n, m = 4, 2
    ed = _tiny(arch="encoder-decoder", n_encoder_layers=n, n_layers=m, deepnorm=True)
    consts = deepnorm_constants(ed)
    assert consts["encoder"] == pytest.approx((0.81 * (n**4 * m) ** (1 / 16), 0.87 * (n**4 * m) ** (-1 / 16)))
    assert consts["decoder"] == pytest.approx(((3 * m) ** 0.25, (12 * m) ** -0.25))
    model = build_model(ed).eval()
    assert model.encoder.layers[0].self_res.alpha == pytest.approx(consts["encoder"][0])
    assert model.decoder.layers[1].cross_res.alpha == pytest.approx(consts["decoder"][0])
    plain = build_model(_tiny(arch="encoder-decoder"))
    assert plain.decoder.layers[0].self_res.alpha == 1.0
    ids = torch.randint(1, 50, (2, 5))
    with torch.no_grad():
        assert torch.isfinite(model(ids, ids).logits).all()


# ------------------------------------------------------------------------------------------- weights
@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_attention_weights_shapes_for_all_three_archs(n_kv_heads: int | None) -> None:
    b, s, t, h, layers = 2, 7, 5, 4, 2
    src, tgt = torch.randint(1, 50, (b, s)), torch.randint(1, 50, (b, t))
    enc = _built(arch="encoder", n_kv_heads=n_kv_heads)(src, return_weights=True).attentions
    assert enc is not None and set(enc) == {"encoder"} and len(enc["encoder"]) == layers
    assert all(w.shape == (b, h, s, s) for w in enc["encoder"])

    dec = _built(arch="decoder", n_kv_heads=n_kv_heads)(tgt, return_weights=True).attentions
    assert dec is not None and set(dec) == {"self"} and len(dec["self"]) == layers
    for w in dec["self"]:
        assert w.shape == (b, h, t, t)
        assert torch.all(w.triu(diagonal=1) == 0)  # causal

    s2s = _built(arch="encoder-decoder", n_kv_heads=n_kv_heads)(src, tgt, return_weights=True).attentions
    assert s2s is not None and set(s2s) == {"encoder", "self", "cross"}
    assert [w.shape for w in s2s["encoder"]] == [(b, h, s, s)] * layers
    assert [w.shape for w in s2s["self"]] == [(b, h, t, t)] * layers
    assert [w.shape for w in s2s["cross"]] == [(b, h, t, s)] * layers
    for name in ("encoder", "self", "cross"):
        for w in s2s[name]:
            torch.testing.assert_close(w.sum(-1), torch.ones(b, h, w.shape[2]))


def test_no_weights_unless_requested() -> None:
    ids = torch.randint(1, 50, (1, 4))
    assert _built(arch="decoder")(ids).attentions is None
    assert _built(arch="encoder")(ids).attentions is None
    assert _built(arch="encoder-decoder")(ids, ids).attentions is None


def test_weights_path_equals_fused_path() -> None:
    """return_weights switches to the reference backend; the outputs must not change."""
    ids = torch.randint(1, 50, (2, 6))
    for arch in ("encoder", "decoder", "encoder-decoder"):
        model = _built(arch=arch, position="alibi")
        args = (ids, ids) if arch == "encoder-decoder" else (ids,)
        with torch.no_grad():
            torch.testing.assert_close(model(*args, return_weights=True).logits, model(*args).logits,
                                       atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------- heads
@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_encoder_heads_shapes(pooling: str) -> None:
    model = _built(arch="encoder", n_classes=3, n_token_labels=5, pooling=pooling)
    ids = torch.tensor([[2, 3, 4, 5, 0, 0], [6, 7, 8, 9, 10, 11]])
    with torch.no_grad():
        mlm = model(ids, task="mlm")
        assert mlm.logits.shape == (2, 6, 50) and mlm.hidden is not None and mlm.hidden.shape == (2, 6, 32)
        cls = model(ids, task="classify").logits
        assert cls.shape == (2, 3)
        assert model(ids, task="tokens").logits.shape == (2, 6, 5)
        assert model(ids, task="hidden").logits.shape == (2, 6, 32)
        # padding does not change the sequence label, whichever the pooling
        more_pad = torch.cat([ids, torch.zeros(2, 3, dtype=torch.long)], dim=1)
        torch.testing.assert_close(model(more_pad, task="classify").logits, cls, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="task="):
        model(ids, task="translate")


def test_encoder_without_heads_says_so() -> None:
    model = _built(arch="encoder")
    ids = torch.randint(1, 50, (1, 4))
    with pytest.raises(ValueError, match="n_classes"):
        model(ids, task="classify")
    with pytest.raises(ValueError, match="n_token_labels"):
        model(ids, task="tokens")


def test_mlm_head_is_tied_to_the_embedding() -> None:
    model = _built(arch="encoder")
    assert model.mlm_head.decoder.proj.weight is model.embed.weight


# ------------------------------------------------------------------------------------------- prefix-LM
@pytest.mark.parametrize("position", ["sinusoidal", "rope", "alibi", "t5"])
def test_prefix_lm_sees_the_whole_prefix_but_nothing_beyond(position: str) -> None:
    model = _built(3, arch="decoder", position=position)
    t, p = 7, 4
    ids = torch.randint(1, 50, (1, t), generator=torch.Generator().manual_seed(0))
    prefix = torch.tensor([p])

    def changed(j: int) -> torch.Tensor:
        out = ids.clone()
        out[0, j] = 1 + int(ids[0, j]) % 49
        return out

    with torch.no_grad():
        base = model(ids, prefix_len=prefix).logits
        # a later prefix token (position 3) reaches every earlier position: the prefix is bidirectional
        later_prefix = model(changed(p - 1), prefix_len=prefix).logits
        assert all(not torch.allclose(later_prefix[0, i], base[0, i], atol=1e-6) for i in range(p))
        # a token beyond the prefix (position 5) reaches nothing before it
        beyond = model(changed(p + 1), prefix_len=prefix).logits
        assert torch.equal(beyond[0, : p + 1], base[0, : p + 1])
        assert not torch.allclose(beyond[0, p + 1:], base[0, p + 1:], atol=1e-6)
        # without a prefix, the same change to position 3 leaves positions 0..2 alone
        plain, plain_changed = model(ids).logits, model(changed(p - 1)).logits
        assert torch.equal(plain_changed[0, : p - 1], plain[0, : p - 1])
        # a zero-length prefix is the plain causal model
        no_prefix = model(ids, prefix_len=torch.tensor([0])).logits
        torch.testing.assert_close(no_prefix, plain, atol=1e-5, rtol=1e-5)


def test_prefix_lm_weights() -> None:
    model = _built(arch="decoder")
    out = model(torch.randint(1, 50, (2, 5)), prefix_len=torch.tensor([3, 1]), return_weights=True)
    assert out.attentions is not None
    w = out.attentions["self"][0]  # (B, H, T, T)
    assert torch.all(w[0, :, :3, 3:] == 0) and bool((w[0, :, :3, :3] > 0).all())
    assert torch.all(w[1].triu(diagonal=1) == 0)
