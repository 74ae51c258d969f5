"""Position schemes: the paper's sinusoids, RoPE's rotation properties, ALiBi, T5 buckets, length limits."""

from __future__ import annotations

import math

import pytest
import torch

from aiayn import AiaynError, ModelConfig, build_model
from aiayn.nn.positions import (
    ALiBi,
    LearnedPositions,
    RotaryEmbedding,
    SinusoidalPositions,
    T5RelativeBias,
    alibi_slopes,
    apply_rotary,
    rope_inv_freq,
    sinusoidal_table,
    t5_relative_bucket,
)


@pytest.mark.parametrize("pos, i", [(0, 0), (1, 0), (3, 1), (17, 5), (100, 63), (511, 200), (1023, 255)])
def test_sinusoidal_table_matches_the_paper(pos: int, i: int) -> None:
    d = 512
    table = sinusoidal_table(1024, d)
    assert table.shape == (1024, d) and table.dtype == torch.float32
    angle = pos / 10000 ** (2 * i / d)
    assert float(table[pos, 2 * i]) == pytest.approx(math.sin(angle), abs=1e-6)
    assert float(table[pos, 2 * i + 1]) == pytest.approx(math.cos(angle), abs=1e-6)


def test_sinusoidal_module_looks_up_the_table() -> None:
    enc = SinusoidalPositions(8, 16)
    out = enc(torch.tensor([[0, 3, 15]]))
    assert out.shape == (1, 3, 8)
    torch.testing.assert_close(out[0], sinusoidal_table(16, 8)[[0, 3, 15]])
    assert not list(enc.parameters())  # fixed, not learned


@pytest.mark.parametrize("module", [SinusoidalPositions(8, 16), LearnedPositions(8, 16)],
                         ids=["sinusoidal", "learned"])
def test_absolute_positions_beyond_max_len_raise(module: torch.nn.Module) -> None:
    assert module(torch.arange(16)[None]).shape == (1, 16, 8)
    with pytest.raises(AiaynError, match="beyond max_len=16"):
        module(torch.arange(17)[None])


@pytest.mark.parametrize("arch", ["encoder", "decoder", "encoder-decoder"])
@pytest.mark.parametrize("position", ["sinusoidal", "learned"])
def test_models_reject_inputs_longer_than_max_len(arch: str, position: str) -> None:
    model = build_model(ModelConfig.preset("tiny", arch=arch, position=position, max_len=8)).eval()
    ok, too_long = torch.ones(1, 8, dtype=torch.long), torch.ones(1, 9, dtype=torch.long)
    with torch.no_grad():
        model(ok, ok) if arch == "encoder-decoder" else model(ok)
        with pytest.raises(AiaynError, match="max_len=8"):
            model(too_long, ok) if arch == "encoder-decoder" else model(too_long)


@pytest.mark.parametrize("position", ["sinusoidal", "learned"])
def test_cached_decoding_past_max_len_raises(position: str) -> None:
    """Decoding steps check their positions on the host (no device read-back) and still stop at max_len."""
    model = build_model(ModelConfig.preset("tiny", arch="decoder", position=position, max_len=8)).eval()
    cache = model.new_cache(8)
    with torch.no_grad():
        model(torch.ones(1, 7, dtype=torch.long), cache=cache)  # positions 0..6
        model(torch.ones(1, 1, dtype=torch.long), cache=cache)  # position 7: the last one
        with pytest.raises(AiaynError, match="position 8 is beyond max_len=8"):
            model(torch.ones(1, 1, dtype=torch.long), cache=cache)


# ------------------------------------------------------------------------------------------- RoPE
ROPE_KINDS = [("none", 1.0), ("linear", 4.0), ("ntk", 4.0), ("yarn", 4.0)]


@pytest.mark.parametrize("scaling, factor", ROPE_KINDS)
def test_rope_preserves_norms(scaling: str, factor: float) -> None:
    rope = RotaryEmbedding(16, scaling=scaling, factor=factor, original_max_len=64)
    x = torch.randn(2, 3, 50, 16, generator=torch.Generator().manual_seed(0))  # (B, H, T, Dh)
    cos, sin = rope(torch.arange(50)[None])
    assert cos.shape == sin.shape == (1, 50, 16)
    y = apply_rotary(x, cos, sin)
    # a rotation; YaRN additionally multiplies by its attention factor 0.1 ln(s) + 1
    expected = 0.1 * math.log(factor) + 1 if scaling == "yarn" else 1.0
    assert rope.attention_factor == pytest.approx(expected)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1) * expected, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(y[..., 0, :], x[..., 0, :] * expected)  # position 0 is not rotated


@pytest.mark.parametrize("scaling, factor", ROPE_KINDS)
def test_rope_scores_depend_only_on_relative_position(scaling: str, factor: float) -> None:
    rope = RotaryEmbedding(8, scaling=scaling, factor=factor, original_max_len=32)
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 1, 1, 8, generator=g), torch.randn(1, 1, 1, 8, generator=g)

    def score(m: int, n: int) -> float:
        qm = apply_rotary(q, *rope(torch.tensor([[m]])))
        kn = apply_rotary(k, *rope(torch.tensor([[n]])))
        return float((qm * kn).sum())

    for m, n in [(5, 2), (2, 5), (7, 7), (40, 3)]:
        for shift in (1, 13, 200):
            assert score(m + shift, n + shift) == pytest.approx(score(m, n), abs=1e-3)
    assert score(5, 2) != pytest.approx(score(2, 5), abs=1e-3)  # ...but it does depend on m - n


def test_rope_scaling_frequencies() -> None:
    base, _ = rope_inv_freq(16)
    torch.testing.assert_close(base, 1.0 / 10000 ** (torch.arange(0, 16, 2).float() / 16))
    linear, _ = rope_inv_freq(16, scaling="linear", factor=4.0)
    torch.testing.assert_close(linear, base / 4)
    ntk, _ = rope_inv_freq(16, scaling="ntk", factor=4.0)
    torch.testing.assert_close(ntk, 1.0 / (10000 * 4 ** (16 / 14)) ** (torch.arange(0, 16, 2).float() / 16))
    yarn, att = rope_inv_freq(16, scaling="yarn", factor=4.0, original_max_len=2048)
    assert att == pytest.approx(0.1 * math.log(4) + 1)
    assert float(yarn[0]) == pytest.approx(float(base[0]))  # fastest dimension extrapolated (kept)
    assert float(yarn[-1]) == pytest.approx(float(base[-1]) / 4)  # slowest interpolated
    assert bool(((yarn >= base / 4 - 1e-9) & (yarn <= base + 1e-9)).all())


def test_rope_model_has_even_head_dim_and_no_absolute_table() -> None:
    model = build_model(ModelConfig.preset("tiny", arch="decoder", position="rope"))
    assert model.decoder.abs_pos is None and model.decoder.rotary is not None


# ------------------------------------------------------------------------------------------- biases
def test_alibi_slopes_and_bias() -> None:
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    torch.testing.assert_close(alibi_slopes(4), torch.tensor([2.0 ** -(2 * (i + 1)) for i in range(4)]))
    # non-power of two: the 4 of alibi(4), then odd ones of alibi(8)
    torch.testing.assert_close(alibi_slopes(6), torch.tensor([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1,
                                                              2.0**-3]))
    bias = ALiBi(2)(torch.arange(3)[None], torch.arange(3)[None])
    assert bias.shape == (1, 2, 3, 3)
    torch.testing.assert_close(bias[0, 0], -(2.0**-4) * torch.tensor([[0.0, 1, 2], [1, 0, 1], [2, 1, 0]]))


def test_t5_buckets() -> None:
    rel = torch.arange(-6, 7)
    # bidirectional with 8 buckets: 4 per direction, exact below 2, log-spaced up to max_distance 8
    assert t5_relative_bucket(rel, True, 8, 8).tolist() == [3, 3, 3, 2, 2, 1, 0, 5, 6, 6, 7, 7, 7]
    # causal: only keys in the past are distinguished; future keys share bucket 0
    assert t5_relative_bucket(rel, False, 8, 16).tolist()[6:] == [0] * 7
    assert t5_relative_bucket(torch.tensor([-1, -2, -3, -4]), False, 8, 16).tolist() == [1, 2, 3, 4]
    assert int(t5_relative_bucket(torch.tensor([-1000]), False, 8, 16)) == 7
    bias = T5RelativeBias(4, 8, 8)(torch.arange(3)[None], torch.arange(5)[None])
    assert bias.shape == (1, 4, 3, 5)


@pytest.mark.parametrize("cls", [SinusoidalPositions, LearnedPositions])
def test_span_equals_the_gather_of_those_positions_and_checks_max_len(cls: type) -> None:
    """A decoding step's default positions come as a slice of the table: the same values as forward()."""
    pos = cls(8, max_len=10)
    for start, t in ((0, 10), (3, 1), (9, 1)):
        assert torch.equal(pos.span(start, t), pos(torch.arange(start, start + t)[None]))
    with pytest.raises(AiaynError, match="position 10 is beyond max_len=10"):
        pos.span(10, 1)
