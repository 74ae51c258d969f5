"""Opt-in int8 inference on CPU: every ``nn.Linear`` (attention, feed-forward, output layer) becomes a
dynamically quantized int8 linear layer.

Weights are stored as int8 with one scale per weight matrix (``quantize_dynamic``'s default per-tensor
scheme); activations are quantized on the fly, one scale per call (PyTorch's fbgemm/x86 kernels). At batch 1
decoding is bound by the bytes of weights read per token, so int8 weights (a quarter of fp32) make each step
several times cheaper; the output layer of a 50k-token vocabulary is most of that.

What changes for users, and what the tests check:

* Outputs are close to, not equal to, the fp32 model's (tests bound the logit error; on the trained Multi30k and
  SST-2 models BLEU and accuracy move by about 0.05 and 0.1 points, docs/BENCHMARKS.md).
* The activation scale is taken over the whole input of each call, so a sentence decoded inside a batch can
  differ slightly from the same sentence decoded alone, and a cached step from an uncached forward; the fp32
  model keeps those equalities exact.
* Inference only (no gradients) and CPU only. The tied output layer gets its own int8 copy; the embedding
  table stays fp32.
"""

from __future__ import annotations

import warnings
from copy import deepcopy as copy_module

import torch
from torch import nn

from aiayn.errors import AiaynError
from aiayn.nn.packed import unpack_output_layers


def quantize_int8(model: nn.Module) -> nn.Module:
    """Return an int8 copy of ``model`` for CPU inference (the fp32 ``model`` is left untouched).

    Args:
        model: an aiayn model (any family) on the CPU, float32 parameters.

    Returns:
        A copy in eval mode whose ``nn.Linear`` modules are dynamically quantized int8 linears; call it exactly
        as the original (same input and output shapes).

    Raises:
        AiaynError: the model is not on the CPU, or this PyTorch build has no x86/fbgemm quantized engine.
    """
    devices = {p.device.type for p in model.parameters()}
    if devices != {"cpu"}:
        raise AiaynError(f"int8 inference runs on the CPU only; the model is on {', '.join(sorted(devices))} "
                         "(drop --int8 or use --device cpu)")
    engines = torch.backends.quantized.supported_engines
    engine = next((e for e in ("x86", "fbgemm", "qnnpack") if e in engines), None)
    if engine is None:
        raise AiaynError(f"this PyTorch build has no int8 engine (supported: {engines}); drop --int8")
    torch.backends.quantized.engine = engine
    with warnings.catch_warnings():
        # torch.ao's eager-mode quantization warns that it is deprecated in favour of torchao; the kernels are
        # the same ones transformers' and torch's own tutorials use, and torch is pinned in pyproject.toml.
        warnings.simplefilter("ignore")
        from torch.ao.quantization import quantize_dynamic

        # a copy whose prepacked fp32 output layers (aiayn.nn.packed) are plain nn.Linear again, so they quantize
        copy = unpack_output_layers(copy_module(model.eval()))
        return quantize_dynamic(copy, {nn.Linear}, dtype=torch.qint8, inplace=True)
