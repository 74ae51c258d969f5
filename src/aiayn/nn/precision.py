"""Inference in a lower precision: the whole model cast to bf16 (CPU or CUDA) or fp16 (CUDA).

Training keeps fp32 master weights and runs under autocast (``train.dtype``); inference has no weights to update,
so :func:`cast_for_inference` simply casts every parameter and floating buffer, as ``model.to(dtype)`` does, and
everything downstream runs in that dtype: half the weight bytes streamed per decoding step, half the KV cache, and
on CPUs with native bf16 matmuls (AVX512-BF16, AMX) oneDNN's bf16 kernels (the CPU accelerator prepacks every
linear layer of a bf16 model, :func:`aiayn.accel.accelerate`).

What stays in fp32, so the cast costs accuracy only where bf16 rounding does:

* RoPE's inverse frequencies (:class:`aiayn.nn.positions.RotaryEmbedding` keeps them fp32 under any cast, since
  a bf16 frequency times a position in the thousands is off by radians); the angles are computed in fp32;
* every score a decoder compares: beam search, sampling, ensembles, perplexity and classification probabilities
  take ``log_softmax`` / ``softmax`` of the logits in fp32 (:mod:`aiayn.generate`, :mod:`aiayn.evaluate`).

Outputs are close to, not equal to, fp32's: logits differ by about 1% in norm on random tiny models (tests), and on
real checkpoints docs/results.md gives the BLEU. fp16 is CUDA-only: CPU kernels for it are slow or missing, and
fp16's range is the wrong trade on CPUs that have bf16.
"""

from __future__ import annotations

import contextlib
import warnings

import torch
from torch import nn

from aiayn.errors import AiaynError

INFERENCE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def inference_dtype(name: str | torch.dtype) -> torch.dtype:
    """``"float32"`` / ``"bfloat16"`` / ``"float16"`` (or the ``torch.dtype`` itself) -> the ``torch.dtype``.

    Raises:
        AiaynError: any other name, listing the valid ones.
    """
    if isinstance(name, torch.dtype):
        if name in INFERENCE_DTYPES.values():
            return name
        name = str(name).removeprefix("torch.")
    if name not in INFERENCE_DTYPES:
        raise AiaynError(f"unknown inference dtype {name!r}; choose one of {', '.join(INFERENCE_DTYPES)}")
    return INFERENCE_DTYPES[name]


def cast_for_inference(model: nn.Module, dtype: str | torch.dtype) -> nn.Module:
    """Cast ``model`` in place to ``dtype`` for inference (eval mode); returns it (accelerate it afterwards).

    Args:
        model: an aiayn model of any family, on one device, with floating parameters (not int8-quantized).
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"`` (CUDA only), or the ``torch.dtype``.

    Returns:
        ``model`` itself, in eval mode, parameters and floating buffers in ``dtype``; call it exactly as before
        (same input and output shapes; logits come out in ``dtype``).

    Raises:
        AiaynError: an unknown dtype, fp16 on the CPU, or a model that is not a plain floating one.
    """
    dtype = inference_dtype(dtype)
    devices = {p.device.type for p in model.parameters()}
    quantized = any(c.__module__.startswith("torch.ao.nn.quantized") for m in model.modules() for c in type(m).__mro__)
    if quantized or not devices or any(not p.is_floating_point() for p in model.parameters()):
        raise AiaynError("cast_for_inference needs a model with floating parameters (an int8-quantized model "
                         "cannot be cast; pick either int8 or a dtype)")
    if dtype == torch.float16 and "cpu" in devices:
        raise AiaynError("float16 inference runs on CUDA only; on the CPU use bfloat16 (--dtype bfloat16), "
                         "or --int8")
    if dtype == torch.bfloat16 and "cpu" in devices:
        if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            warnings.warn("this CPU has no native bf16 matmuls (no AVX512-BF16 / AMX, as oneDNN reports): bfloat16 "
                          "inference will run, but likely slower than float32", stacklevel=2)
    # weights cast inside inference mode would become inference tensors that no later change could touch; a model built
    # inside inference mode keeps it (its parameters are inference tensors already)
    built_inside = any(p.is_inference() for p in model.parameters())
    with contextlib.nullcontext() if built_inside else torch.inference_mode(False):
        model.to(dtype).eval()
    return model
