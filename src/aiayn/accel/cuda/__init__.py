"""The CUDA accelerator: a static, preallocated KV cache and a one-token decoding step compiled with
``torch.compile(mode="reduce-overhead")`` (CUDA graphs), applied to a reference model by :func:`for_decoding` (through
:func:`aiayn.accel.accelerate` for a model on a CUDA device). Training on CUDA takes the core's torch kernels as they
are. The step declares what it supports (:mod:`aiayn.accel.cuda.support`) and runs the core's modules for everything
else; tests hold it equal to the reference's cached decoding.
"""

from __future__ import annotations

import torch
from torch import nn

from aiayn.models.stack import TransformerStack


def for_decoding(model: nn.Module, compile: str = "auto") -> nn.Module:
    """Substitute, in place, :class:`~aiayn.accel.cuda.modules.StaticDecodingStack` for every
    :class:`~aiayn.models.stack.TransformerStack` of ``model`` (exactly that class: a user's subclass is left
    alone); parameters and ``state_dict`` are unchanged. Returns ``model``.

    Args:
        model: an aiayn model, on its final device and dtype.
        compile: how the step runs (:data:`aiayn.accel.cuda.decode_step.COMPILE_MODES`): "auto" (CUDA graphs through
            ``torch.compile(mode="reduce-overhead")`` on CUDA, eager elsewhere), "eager", "default", ...
    """
    from aiayn.accel.cuda.decode_step import resolve_mode
    from aiayn.accel.cuda.modules import StaticDecodingStack

    resolve_mode(compile, torch.device("cpu"))  # validates
    for m in model.modules():
        if type(m) is TransformerStack or type(m) is StaticDecodingStack:
            m.__class__ = StaticDecodingStack
            m.__dict__.pop("_static_step", None)
            m.__dict__["static_compile"] = compile
    return model
