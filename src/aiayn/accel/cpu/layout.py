"""Weight layout for fast decoding on CPU: every linear weight stored column-major.

``nn.Linear`` keeps its weight W as (out, in), row-major, and computes ``x @ W^T``. BLAS then multiplies by a
*transposed* operand. At the handful of rows of a decoding step (batch x beams) MKL's kernel for that case is
much slower than for a plain row-major (in, out) operand (measured: docs/performance.md). HF's GPT-2 stores its
``Conv1D`` weights as (in, out) for this reason.

:func:`column_major_linears` re-lays out every linear weight in place as ``W^T.contiguous().T``: the same
(out, in) shape and values, with strides (1, out), so ``F.linear`` hands BLAS a row-major W^T. Nothing else
changes: module code, ``state_dict`` keys and shapes, tied weights (the output layer and the embedding table
keep sharing one tensor), checkpoint saving (it writes contiguous copies). Results equal the row-major ones up
to float rounding (a different summation order inside BLAS).

Embedding lookups of a tied, column-major table gather strided rows (a few per decoding step). For training
(hundreds of rows per matmul) the layout neither helps nor hurts much, so the trainer leaves weights as they are;
inference entry points (``load_pretrained``, the CLI, the benchmarks) call :func:`cpu_inference_layout` once,
which also prepacks the output layers, and every layer of a bf16 model (:mod:`aiayn.accel.cpu.packed`).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from aiayn.accel.cpu.packed import pack_bf16_linears, pack_output_layers, use_fast_cpu_linears


def column_major_linears(model: nn.Module) -> nn.Module:
    """Store every ``nn.Linear`` weight column-major, in place; returns ``model``.

    Args:
        model: any module; its ``nn.Linear`` weights (out, in) keep their shape, values, identity (the same
            ``nn.Parameter``, so ties survive) and device.

    Returns:
        ``model`` itself. Idempotent; a no-op for weights that are already column-major.
    """
    with torch.no_grad():
        for module in model.modules():
            # a tied weight met a second time is already column-major, so the check below skips it
            if isinstance(module, nn.Linear) and not is_column_major(module.weight):
                module.weight.data = module.weight.data.t().contiguous().t()
    return model


def is_column_major(weight: torch.Tensor) -> bool:
    """Whether a 2-D (out, in) weight is stored column-major (its transpose is contiguous)."""
    return weight.dim() == 2 and weight.t().is_contiguous()


def cpu_inference_layout(model: nn.Module) -> nn.Module:
    """The weight layout for decoding on CPU, in place; returns ``model``.

    Every linear weight column-major (:func:`column_major_linears`), every output layer prepacked for oneDNN
    (:func:`aiayn.accel.cpu.packed.pack_output_layers`) and, in a bf16 model or where oneDNN is the fp32 backend
    (:mod:`aiayn.accel.cpu.gemm`), every linear layer prepacked (:func:`aiayn.accel.cpu.packed.pack_bf16_linears`,
    :func:`aiayn.accel.cpu.packed.use_fast_cpu_linears`); elsewhere (Intel CPUs), wherever the native kernels are built,
    every other fp32 linear layer made a PackedLinear for a decoding step's few rows alone. Values, parameters, ties
    and ``state_dict`` are unchanged.
    """
    with outside_inference_mode(model):
        return use_fast_cpu_linears(pack_bf16_linears(pack_output_layers(column_major_linears(model))), decoding=True)


def outside_inference_mode(model: nn.Module) -> contextlib.AbstractContextManager:
    """Leave ``torch.inference_mode`` for a change of ``model``'s weights, unless they were made inside it.

    A weight replaced inside inference mode becomes an inference tensor, whose in-place changes (a later
    ``load_state_dict`` there) no version counter records, so the packed kernels of :mod:`aiayn.accel.cpu.packed` could
    not tell a stale copy and leave such weights alone. Replaced outside, it stays an ordinary tensor. A model
    built inside inference mode keeps it: giving its parameters ordinary data would make them unusable.
    """
    if any(p.is_inference() for p in model.parameters()):
        return contextlib.nullcontext()
    return torch.inference_mode(False)
