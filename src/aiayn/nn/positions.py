"""Positional schemes: absolute (sinusoidal, learned), rotary (RoPE with scaling), and additive biases.

- Absolute encodings are added to the token embeddings: ``forward(positions (B|1, T)) -> (B|1, T, D)``.
- RoPE rotates queries and keys inside attention: ``forward(positions) -> (cos, sin)`` each (B|1, T, Dh),
  applied with :func:`apply_rotary`.
- ALiBi and T5 produce an additive attention bias: ``forward(q_pos (B|1, T), k_pos (B|1, S)) -> (B|1, H, T, S)``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from aiayn.errors import AiaynError


def _check_len(max_position: int, max_len: int, what: str) -> None:
    """Raise a clear error for a largest position >= max_len."""
    if max_position >= max_len:
        raise AiaynError(f"position {max_position} is beyond max_len={max_len} of the {what} "
                         "positions; truncate the input or build the model with a larger max_len")


def sinusoidal_table(max_len: int, d_model: int, layout: str = "interleaved") -> Tensor:
    """The paper's table: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)).

    Args:
        layout: "interleaved" (the paper's columns, as above) or "halves": the same sines in the first half of the
            columns and the cosines in the second (Marian, fairseq).
    Returns:
        (max_len, d_model) float32.
    """
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]  # (L, 1)
    div = torch.pow(10000.0, torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (ceil(D/2),)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    sin, cos = torch.sin(pos / div), torch.cos(pos / div[: d_model // 2])  # (L, ceil(D/2)), (L, D//2)
    if layout == "halves":
        pe[:, :sin.shape[1]], pe[:, sin.shape[1]:] = sin, cos
    elif layout == "interleaved":
        pe[:, 0::2], pe[:, 1::2] = sin, cos
    else:
        raise ValueError(f"unknown sinusoidal layout {layout!r}")
    return pe.float()


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal encodings (paper section 3.5), added to embeddings; position p reads table row p + ``offset``
    (fairseq's sinusoidal positions start after the padding id)."""

    def __init__(self, d_model: int, max_len: int, layout: str = "interleaved", offset: int = 0) -> None:
        super().__init__()
        self.max_len, self.offset = max_len, offset
        self.register_buffer("table", sinusoidal_table(max_len + offset, d_model, layout), persistent=False)

    def forward(self, positions: Tensor) -> Tensor:
        """positions (B|1, T) long -> (B|1, T, D). Reads their maximum back (a host sync); a decoding step's default
        positions take :meth:`span` instead."""
        if positions.numel() and not torch.compiler.is_compiling():  # compiled steps: the caller checks lengths
            _check_len(int(positions.max()), self.max_len, "sinusoidal")
        return self.table[positions + self.offset if self.offset else positions]

    def span(self, start: int, t: int) -> Tensor:
        """The encodings of positions start .. start + t - 1 for every row: (1, t, D), a slice of the table (the same
        values as ``forward`` of those positions, without a gather: a decoding step's default positions)."""
        _check_len(start + t - 1, self.max_len, "sinusoidal")
        start += self.offset
        return self.table[start:start + t][None]


class LearnedPositions(nn.Module):
    """Learned absolute position embeddings (GPT-2, BERT). Position p reads row p + ``offset`` of a table of
    ``max_len + offset`` rows (BART's offset is 2)."""

    def __init__(self, d_model: int, max_len: int, offset: int = 0) -> None:
        super().__init__()
        self.max_len, self.offset = max_len, offset
        self.weight = nn.Embedding(max_len + offset, d_model)

    def forward(self, positions: Tensor) -> Tensor:
        """positions (B|1, T) long -> (B|1, T, D). Reads their maximum back (a host sync); a decoding step's default
        positions take :meth:`span` instead."""
        if positions.numel() and not torch.compiler.is_compiling():  # compiled steps: the caller checks lengths
            _check_len(int(positions.max()), self.max_len, "learned")
        return self.weight(positions + self.offset if self.offset else positions)

    def span(self, start: int, t: int) -> Tensor:
        """The embeddings of positions start .. start + t - 1 for every row: (1, t, D), a slice of the table (as
        :meth:`SinusoidalPositions.span`)."""
        _check_len(start + t - 1, self.max_len, "learned")
        start += self.offset
        return self.weight.weight[start:start + t][None]


# ---------------------------------------------------------------------------------------------- RoPE
def rope_inv_freq(head_dim: int, theta: float = 10000.0, scaling: str = "none", factor: float = 1.0,
                  original_max_len: int = 2048, low_freq_factor: float = 1.0,
                  high_freq_factor: float = 4.0) -> tuple[Tensor, float]:
    """Inverse frequencies of RoPE and the attention factor multiplying cos/sin.

    - ``linear``: positions divided by ``factor`` (Chen et al. 2023), i.e. inv_freq / factor.
    - ``ntk``: NTK-aware base change, theta' = theta * factor^(d / (d - 2)).
    - ``yarn``: per-dimension blend of interpolation and extrapolation with a linear ramp between
      beta_fast = 32 and beta_slow = 1 rotations, and attention factor 0.1 ln(factor) + 1 (Peng et al. 2023).
    - ``llama3``: by wavelength 2 pi / inv_freq against the original context L: kept below L / high_freq_factor,
      divided by ``factor`` above L / low_freq_factor, and in between a blend with weight
      s = (L / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor) on the kept one (LLaMA 3.1).

    Returns:
        inv_freq (Dh/2,) float32 and the attention factor (1.0 except for YaRN).
    """
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim  # (Dh/2,)
    if scaling == "ntk":
        theta = theta * factor ** (head_dim / (head_dim - 2))
    inv_freq = 1.0 / theta**exponents
    if scaling == "linear":
        return inv_freq / factor, 1.0
    if scaling == "llama3":
        wavelen = 2 * math.pi / inv_freq  # (Dh/2,)
        low_freq_wavelen, high_freq_wavelen = original_max_len / low_freq_factor, original_max_len / high_freq_factor
        long = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)  # the long waves interpolated
        smooth = (original_max_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        blended = (1 - smooth) * long / factor + smooth * long
        medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
        return torch.where(medium, blended, long), 1.0
    if scaling != "yarn":
        return inv_freq, 1.0

    def correction_dim(rotations: float) -> float:
        return head_dim * math.log(original_max_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(correction_dim(32.0)), 0)
    high = min(math.ceil(correction_dim(1.0)), head_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolate = 1 - ramp  # 1 for fast-rotating dims (kept), 0 for slow ones (interpolated)
    inv_freq = (inv_freq / factor) * (1 - extrapolate) + inv_freq * extrapolate
    attention_factor = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    return inv_freq, attention_factor


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (Su et al. 2021) in the rotate-half layout used by LLaMA checkpoints."""

    def __init__(self, head_dim: int, theta: float = 10000.0, scaling: str = "none", factor: float = 1.0,
                 original_max_len: int = 2048, low_freq_factor: float = 1.0, high_freq_factor: float = 4.0) -> None:
        super().__init__()
        inv_freq, self.attention_factor = rope_inv_freq(head_dim, theta, scaling, factor, original_max_len,
                                                        low_freq_factor, high_freq_factor)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def _apply(self, fn, recurse: bool = True):  # noqa: ANN001, ANN202 (nn.Module's signature)
        """Moves follow ``fn`` (``.to(device)``, ``.cuda()``), but ``inv_freq`` stays fp32 under dtype casts
        (``.to(torch.bfloat16)``, ``.half()``): a bf16 frequency times a position in the thousands is off by
        radians (:mod:`aiayn.nn.precision`)."""
        inv_freq = self.inv_freq
        super()._apply(fn, recurse)
        self.inv_freq = inv_freq.to(self.inv_freq.device)
        return self

    def forward(self, positions: Tensor, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
        """positions (B|1, T) long -> cos, sin each (B|1, T, Dh), computed in fp32 then cast to ``dtype``."""
        freqs = positions[..., None].float() * self.inv_freq  # (B, T, Dh/2)
        emb = torch.cat([freqs, freqs], dim=-1)  # (B, T, Dh)
        return (emb.cos() * self.attention_factor).to(dtype), (emb.sin() * self.attention_factor).to(dtype)


def rotate_half(x: Tensor) -> Tensor:
    """(..., Dh) -> (..., Dh): [x1, x2] -> [-x2, x1]."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x (B, H, T, Dh) by cos/sin (B|1, T, Dh)."""
    cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, Dh): broadcast over heads
    return x * cos + rotate_half(x) * sin


# ---------------------------------------------------------------------------------------------- biases
def alibi_slopes(n_heads: int) -> Tensor:
    """Per-head ALiBi slopes (Press et al. 2022), geometric from 2^(-8/n); non-powers of two interleave.

    Returns:
        (H,) float32.
    """
    closest = 2 ** math.floor(math.log2(n_heads))
    base = 2 ** (-(2 ** -(math.log2(closest) - 3)))
    slopes = base ** torch.arange(1, closest + 1, dtype=torch.float32)
    if closest != n_heads:
        extra_base = 2 ** (-(2 ** -(math.log2(2 * closest) - 3)))
        n_extra = min(closest, n_heads - closest)
        slopes = torch.cat([slopes, extra_base ** torch.arange(1, 1 + 2 * n_extra, 2, dtype=torch.float32)])
    return slopes


class ALiBi(nn.Module):
    """Attention with Linear Biases: bias[h, i, j] = -slope_h * |pos_i - pos_j| (no learned parameters)."""

    def __init__(self, n_heads: int) -> None:
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)

    def forward(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """q_pos (B|1, T), k_pos (B|1, S) long -> (B|1, H, T, S) float32 bias.

        For causal attention only keys j <= i are visible, where this equals BLOOM's ``slope * pos_j`` up to a
        per-row constant, which softmax ignores.
        """
        dist = (q_pos[:, :, None] - k_pos[:, None, :]).abs().float()  # (B, T, S)
        return -self.slopes[None, :, None, None] * dist[:, None]


def t5_relative_bucket(relative_position: Tensor, bidirectional: bool, num_buckets: int,
                       max_distance: int) -> Tensor:
    """T5's bucketing of ``key_pos - query_pos``: exact buckets for small distances, log-spaced up to
    ``max_distance``; with ``bidirectional`` half the buckets are for keys after the query.

    Returns:
        Long tensor of bucket ids, same shape as ``relative_position``.
    """
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = -torch.clamp(relative_position, max=0)
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    large = max_exact + (
        torch.log(distance.float().clamp(min=1) / max_exact) / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).long()
    large = large.clamp(max=num_buckets - 1)
    return buckets + torch.where(is_small, distance, large)


class T5RelativeBias(nn.Module):
    """T5's learned, bucketed relative position bias, one scalar per (bucket, head)."""

    def __init__(self, n_heads: int, num_buckets: int = 32, max_distance: int = 128,
                 bidirectional: bool = True) -> None:
        super().__init__()
        self.num_buckets, self.max_distance, self.bidirectional = num_buckets, max_distance, bidirectional
        self.embedding = nn.Embedding(num_buckets, n_heads)

    def forward(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """q_pos (B|1, T), k_pos (B|1, S) long -> (B|1, H, T, S) bias."""
        rel = k_pos[:, None, :] - q_pos[:, :, None]  # (B, T, S)
        bucket = t5_relative_bucket(rel, self.bidirectional, self.num_buckets, self.max_distance)
        return self.embedding(bucket).permute(0, 3, 1, 2)  # (B, T, S, H) -> (B, H, T, S)
