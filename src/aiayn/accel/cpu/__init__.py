"""The CPU accelerator: native C kernels (compiled on first use where a C compiler exists), the choice between
oneDNN and MKL for fp32 products, prepacked weights, a decoding step without module dispatch, a fused training loss,
screened greedy search, int8 layers. Applied to a reference model by :func:`for_training` or :func:`for_decoding`
(through :func:`aiayn.accel.accelerate`); each substitute module declares what it supports
(:mod:`aiayn.accel.cpu.support`) and runs the core's code for everything else.
"""

from __future__ import annotations

from torch import nn

from aiayn.models.heads import LMHead
from aiayn.models.stack import TransformerStack
from aiayn.nn.attention import MultiHeadAttention
from aiayn.nn.feedforward import FeedForward


def for_training(model: nn.Module) -> nn.Module:
    """Substitute, in place, what speeds up CPU training steps without changing their results beyond float rounding:
    attention kernels (:class:`~aiayn.accel.cpu.modules.CPUMultiHeadAttention`), the fused loss
    (:class:`~aiayn.accel.cpu.modules.CPULMHead`) and, where oneDNN is the faster fp32 library, every linear layer
    (:class:`~aiayn.accel.cpu.packed.PackedLinear`); validation decoding inside training takes the fast decoding
    step. Random streams (dropout) are the core's. Returns ``model``."""
    from aiayn.accel.cpu.modules import substitute
    from aiayn.accel.cpu.packed import frozen_weights, use_fast_cpu_linears

    substitute(model, (MultiHeadAttention, FeedForward, TransformerStack, LMHead))
    model.decoding_scope = frozen_weights
    return use_fast_cpu_linears(model)


def for_decoding(model: nn.Module) -> nn.Module:
    """Substitute, in place, everything of the accelerator that speeds up CPU inference: the weight layout
    (:func:`~aiayn.accel.cpu.layout.cpu_inference_layout`), the attention kernels, fused activations, the flat
    decoding step and native encoder pass (:class:`~aiayn.accel.cpu.modules.CPUDecodingStack`), and the head's
    choosers; decoding calls then run in one :func:`~aiayn.accel.cpu.packed.frozen_weights` block (the model's
    ``decoding_scope``). Outputs equal the reference's up to float rounding. Returns ``model``."""
    from aiayn.accel.cpu.layout import cpu_inference_layout
    from aiayn.accel.cpu.modules import substitute
    from aiayn.accel.cpu.packed import frozen_weights

    cpu_inference_layout(model)
    substitute(model, (MultiHeadAttention, FeedForward, TransformerStack, LMHead))
    model.decoding_scope = frozen_weights
    return model
