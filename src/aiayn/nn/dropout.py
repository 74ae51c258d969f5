"""Dropout whose CPU masks cost a fraction of ``torch.nn.Dropout``'s random draws.

On CPU, ``torch.nn.functional.dropout`` draws one Bernoulli sample per element from the default
Mersenne-Twister generator, one element at a time: about 15 ms for a 4096 x 256 activation on this project's
2-core machine, the same order as the layer's matmuls. Here the mask comes from 64-bit words of the same
generator (``Tensor.random_``), each word cut into four 16-bit uniforms, so a position is dropped with
probability ``round(p * 65536) / 65536`` (within 1/131072 of ``p``). The mask is then turned into a float
multiplier (0 where dropped, ``1 / (1 - p)`` where kept) and the activation multiplied by it, a vectorized
product in both the forward and the backward pass; ``masked_fill`` with a bool mask, the obvious way, runs
several times slower on CPU in each pass. The forward takes 2.4-2.7x less time than torch's
(``bench/cpu_train_kernels.py``, docs/BENCHMARKS.md). The expectation is unchanged, and the mask is seeded by
``torch.manual_seed`` like any other draw, so runs and resumed runs stay reproducible.

Where aiayn's native kernels are built (:mod:`aiayn.native`: a C compiler on the machine), fp32 CPU dropout goes
further: each element's 16-bit uniform comes from a counter-based generator (SplitMix64 at the element's index, keyed
by a seed drawn from torch's default generator), computed in parallel in the same pass that scales the activation,
and the backward pass recomputes the same numbers from the seed instead of keeping a multiplier for it. The forward
took 0.02 against 0.74 ms for a 512 x 512 activation on the 2-core host, with AVX-512 (docs/BENCHMARKS.md). The
masks then differ from those of the PyTorch path below (another stream, the same drop probability and expectation);
either is seeded by ``torch.manual_seed``, so a run repeats exactly on the same machine and settings
(``AIAYN_NATIVE=0`` pins the PyTorch path).

Elsewhere (CUDA, other accelerators) the fused ``torch.nn.functional.dropout`` is already fast and is used
unchanged. The reference is ``torch.nn.functional.dropout``; tests hold the two to the same statistics,
scaling and gradient.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from aiayn import native

_HALF = 1 << 15  # int16 values are uniform on [-32768, 32768)


def _uniform16(shape: torch.Size | tuple[int, ...], device: torch.device | str) -> Tensor:
    """(*shape) int16, uniform on [-32768, 32768): four per 64-bit word drawn from the default generator."""
    n = math.prod(shape)
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_(-(1 << 63), (1 << 63) - 1)
    return words.view(torch.int16)[:n].view(shape)


def _threshold(p: float) -> int:
    """int16 threshold: a uniform int16 below it is dropped, probability ``round(p * 65536) / 65536`` (the native
    kernel's threshold, :func:`aiayn.native.dropout_threshold`, on int16's range)."""
    return native.dropout_threshold(p) - _HALF


def drop_mask(shape: torch.Size | tuple[int, ...], p: float, device: torch.device | str = "cpu") -> Tensor:
    """A boolean mask of ``shape``, True where an element is dropped, each independently with probability ~p.

    Args:
        shape: the activation's shape.
        p: drop probability in [0, 1]; realized as ``round(p * 65536) / 65536``.
        device: where the mask lives.

    Returns:
        (*shape) bool tensor.
    """
    return _uniform16(shape, device) < _threshold(p)


def keep_scale(shape: torch.Size | tuple[int, ...], p: float, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu") -> Tensor:
    """The dropout multiplier: 0 where :func:`drop_mask` (same draws) would drop, ``1 / (1 - p)`` elsewhere.

    Args:
        shape: the activation's shape.
        p: drop probability in [0, 1).
        dtype: the activation's dtype.
        device: where the multiplier lives.

    Returns:
        (*shape) tensor of ``dtype``.
    """
    return (_uniform16(shape, device) >= _threshold(p)).to(dtype).mul_(1.0 / (1.0 - p))


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Inverted dropout of ``x`` (any shape): zero each element with probability p, scale the rest by 1/(1-p).

    CPU tensors are multiplied by :func:`keep_scale`; other devices call ``torch.nn.functional.dropout``.
    Identity when not training or when ``p == 0``.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p == 1.0:
        return F.dropout(x, p, True)
    if x.dtype == torch.float32 and native.library() is not None:
        seed = int(torch.empty((), dtype=torch.int64).random_())  # one draw of the default generator
        return _SeededDropout.apply(x, p, seed)
    return multiplier_dropout(x, p)


def multiplier_dropout(x: Tensor, p: float) -> Tensor:
    """:func:`dropout`'s PyTorch path on any device and dtype: ``x`` times :func:`keep_scale` (0 <= p < 1)."""
    return x * keep_scale(x.shape, p, x.dtype, x.device)


class _SeededDropout(torch.autograd.Function):
    """:func:`aiayn.native.dropout` with its backward: the gradient dropped and scaled by the same seed's draws."""

    @staticmethod
    def forward(ctx, x: Tensor, p: float, seed: int) -> Tensor:  # noqa: ANN001 - autograd's ctx
        ctx.p, ctx.seed = p, seed
        return native.dropout(x.contiguous(), p, seed)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:  # noqa: ANN001
        return native.dropout(grad.contiguous(), ctx.p, ctx.seed), None, None


class Dropout(nn.Dropout):
    """``torch.nn.Dropout`` with :func:`dropout`'s fast CPU mask; same constructor, no parameters."""

    def forward(self, x: Tensor) -> Tensor:  # noqa: D102 - see the class docstring
        return dropout(x, self.p, self.training)
