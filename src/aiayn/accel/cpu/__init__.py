"""The CPU accelerator: native C kernels (compiled on first use where a C compiler exists), the choice between
oneDNN and MKL for fp32 products, prepacked weights, a fused training loss, screened greedy search, int8 layers.
Applied to a reference model by :func:`for_training` or :func:`for_decoding` (through
:func:`aiayn.accel.accelerate`): each kernel goes into one named seam of a core module
(:mod:`aiayn.accel.cpu.functional`), and linear layers become packed ones; the core's own code runs every layer,
stack and decoding step.
"""

from __future__ import annotations

from torch import nn

from aiayn.accel.cpu.functional import set_kernels
from aiayn.accel.cpu.layout import cpu_inference_layout
from aiayn.accel.cpu.packed import frozen_weights, use_fast_cpu_linears


def for_training(model: nn.Module) -> nn.Module:
    """Put in place, in ``model``, what speeds up CPU training steps without changing their results beyond float
    rounding: the attention kernel, the fused loss and, where oneDNN is the faster fp32 library, packed linear layers
    (:class:`~aiayn.accel.cpu.packed.PackedLinear`); validation decoding inside training takes the decoding kernels
    too. Random streams (dropout) are the core's. Returns ``model``."""
    set_kernels(model, decoding=True)
    model.decoding_scope = frozen_weights
    return use_fast_cpu_linears(model)


def for_decoding(model: nn.Module) -> nn.Module:
    """Put in place, in ``model``, everything of the accelerator that speeds up CPU inference: the weight layout
    (:func:`~aiayn.accel.cpu.layout.cpu_inference_layout`: column-major, packed layers), the attention kernel, fused
    activations, the fused loss and the choosers of greedy and beam search; decoding calls then run in one
    :func:`~aiayn.accel.cpu.packed.frozen_weights` block (the model's ``decoding_scope``). Outputs equal the
    reference's up to float rounding. Returns ``model``."""
    cpu_inference_layout(model)
    set_kernels(model, decoding=True)
    model.decoding_scope = frozen_weights
    return model
