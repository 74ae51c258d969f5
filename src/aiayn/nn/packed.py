"""oneDNN-prepacked output layers for fp32 decoding on CPU.

The output layer (hidden -> vocabulary logits) is the largest matmul of a decoding step: 512 x 32000 at the
paper's base size, 768 x 50257 for GPT-2. oneDNN, which PyTorch ships for its own CPU compiler backend
(``torch.ops.mkldnn``), can reorder such a weight once into the blocked layout its kernel reads best. On this
project's 2-core AVX2 machine (2 threads, ``bench/output_layer.py``, docs/BENCHMARKS.md) that made the 512 x 32000
layer 2.1x faster than ``F.linear`` with the column-major weight of :mod:`aiayn.nn.layout` at 4 rows (one
sentence's beams), 1.8x at 16 and 1.25x at 128 (32 sentences x 4 beams), and 384 x 50257 1.7x at 4 and 16 rows;
but a single row (greedy batch-1 generation) is a matrix-vector product, where ``F.linear`` was 1.4x faster than
oneDNN, so one-row calls keep ``F.linear``.
Narrow layers gain nothing (128 x 8000, the tiny Multi30k recipe's, was 0.88-0.93x at 4 to 128 rows), so only
output layers at least ``MIN_PACKED_IN_FEATURES`` wide are packed; and the decoder's own, smaller linears gained
at some shapes and lost at others, so they are left alone.

:func:`pack_output_layers` turns the projection of every :class:`~aiayn.models.heads.LMHead` into a
:class:`PackedLinear`: an ``nn.Linear`` that keeps its weight ``Parameter`` (so ``state_dict``, checkpoint saving
and the tie to the embedding table are unchanged) plus a packed copy used only where it is valid:

* fp32 input of at least two rows on the CPU with autograd off (``torch.no_grad`` / ``torch.inference_mode``),
  oneDNN available; everything else (one row, training, CUDA, other dtypes) takes ``F.linear`` on the weight
  itself;
* the copy is rebuilt when the weight changes (its storage or in-place version counter moved, as after
  ``load_state_dict`` or an optimizer step), so it is never stale.

Results equal ``F.linear`` up to float rounding (a different summation order). Memory: one extra fp32 copy of
each output weight (65 MB at 512 x 32000).
"""

from __future__ import annotations

import functools
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

MIN_PACKED_ROWS = 2  # one row is a matrix-vector product, faster through F.linear (see the module docstring)
MIN_PACKED_IN_FEATURES = 256  # narrower output layers were slower packed (see the module docstring)
_Linear = TypeVar("_Linear", bound=nn.Linear)


@functools.cache
def onednn_available() -> bool:
    """Whether this PyTorch build can prepack linear weights with oneDNN."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def pack_weight(weight: Tensor) -> Tensor:
    """oneDNN's prepacked copy of an (out, in) fp32 linear weight (an opaque mkldnn tensor)."""
    with torch.no_grad():
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach())


def packed_linear(x: Tensor, packed: Tensor, bias: Tensor | None = None) -> Tensor:
    """x (..., in) times a :func:`pack_weight` copy (+ bias) -> (..., out); ``F.linear`` up to rounding."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class PackedLinear(nn.Linear):
    """``nn.Linear`` that multiplies by a oneDNN-prepacked copy of its weight at fp32 CPU inference.

    Build it with :meth:`from_linear`; it shares the original's ``weight`` and ``bias`` parameters.
    """

    _packed: Tensor | None
    _packed_key: tuple[int, int] | None

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> PackedLinear:
        """A ``PackedLinear`` sharing ``linear``'s parameters (same ``Parameter`` objects, so ties survive)."""
        new = _sharing_parameters(cls, linear)
        new._packed, new._packed_key = None, None
        return new

    def __getstate__(self) -> dict:
        """Copies and pickles leave the packed weight behind (it is rebuilt on first use)."""
        state = super().__getstate__()
        return {**state, "_packed": None, "_packed_key": None}

    def _usable(self, x: Tensor) -> bool:
        w = self.weight
        return (x.numel() >= MIN_PACKED_ROWS * x.shape[-1] and x.device.type == "cpu" and w.device.type == "cpu"
                and x.dtype == torch.float32
                and w.dtype == torch.float32 and not (torch.is_grad_enabled() and (w.requires_grad or x.requires_grad))
                and onednn_available())

    def packed_weight(self) -> Tensor:
        """The packed copy of the current weight, rebuilt if the weight changed since it was made."""
        w = self.weight
        key = (w.data_ptr(), w._version)
        if self._packed is None or self._packed_key != key:
            self._packed, self._packed_key = pack_weight(w), key
        return self._packed

    def forward(self, x: Tensor) -> Tensor:
        """x (..., in_features) -> (..., out_features); the same values as ``nn.Linear`` up to rounding."""
        if not self._usable(x):
            return F.linear(x, self.weight, self.bias)
        bias = None if self.bias is None else self.bias.detach()
        return packed_linear(x, self.packed_weight(), bias)


def pack_output_layers(model: nn.Module, min_in_features: int = MIN_PACKED_IN_FEATURES) -> nn.Module:
    """Make the projection of every ``LMHead`` of ``model`` a :class:`PackedLinear`, in place; returns ``model``.

    A no-op where oneDNN is unavailable, and idempotent. The packed copies are made lazily, on the first fp32
    CPU inference call, so calling this on a model that will move to CUDA costs nothing.

    Args:
        model: any aiayn model (the output heads of all three families hold an ``LMHead``).
        min_in_features: leave output layers narrower than this (their hidden width) as they are.
    """
    from aiayn.models.heads import LMHead  # local: models depend on nn, not the other way round

    if not onednn_available():
        return model
    for module in model.modules():
        if isinstance(module, LMHead) and type(module.proj) is nn.Linear \
                and module.proj.in_features >= min_in_features:
            module.proj = PackedLinear.from_linear(module.proj)
    return model


def unpack_output_layers(model: nn.Module) -> nn.Module:
    """Undo :func:`pack_output_layers` in place (plain ``nn.Linear`` with the same parameters); returns ``model``.

    For transformations that match modules by exact type, such as int8 dynamic quantization.
    """
    for module in model.modules():
        for name, child in list(module.named_children()):
            if type(child) is PackedLinear:
                setattr(module, name, _sharing_parameters(nn.Linear, child))
    return model


def _sharing_parameters(cls: type[_Linear], linear: nn.Linear) -> _Linear:
    """A ``cls`` (``nn.Linear`` or a subclass) holding ``linear``'s own weight and bias ``Parameter`` objects."""
    new = cls.__new__(cls)
    nn.Module.__init__(new)
    new.in_features, new.out_features = linear.in_features, linear.out_features
    new.weight, new.bias = linear.weight, linear.bias
    new.train(linear.training)
    return new
