"""Opt-in int8 inference on CPU: every ``nn.Linear`` (attention, feed-forward, output layer) becomes a
dynamically quantized int8 linear layer.

Weights are stored as int8 with one scale per weight matrix (``quantize_dynamic``'s default per-tensor
scheme); activations are quantized on the fly, one scale per call (PyTorch's fbgemm/x86 kernels). At batch 1
decoding is bound by the bytes of weights read per token, so int8 weights (a quarter of fp32) make each step
several times cheaper; the output layer of a 50k-token vocabulary is most of that.

What changes for users, and what the tests check:

* Outputs are close to, not equal to, the fp32 model's (tests bound the logit error; the effect on BLEU and
  accuracy of trained models: docs/results.md).
* The activation scale is taken over the whole input of each call, so a sentence decoded inside a batch can
  differ slightly from the same sentence decoded alone, and a cached step from an uncached forward; the fp32
  model keeps those equalities exact.
* Inference only (no gradients) and CPU only. The tied output layer gets its own int8 copy; the embedding
  table stays fp32.

**A decoding step's few rows.** Every layer is an :class:`Int8Linear`: torch's dynamic int8 layer, except that at
up to ``aiayn.accel.cpu.native.MAX_LINEAR_ROWS`` fp32 rows (a beam-4 step at batch 1, a greedy step of up to 4
prompts), where a product is bound by reading its weight, it multiplies the same int8 weight by the unrounded fp32
rows through ``aiayn.accel.cpu.native.int8_rows_linear`` (weight-only: the values widen to fp32 exactly and the sums
are fp32, so no activation scale rounds the rows). torch's kernel rounds every row of a call to 8 bits
with one scale per call, which makes a step's rows depend on each other; this path keeps them independent, so it is
closer to the fp32 model, and a sentence decoded alone at batch 1 does not change with the other beams' values.
Many rows (an encoder's tokens, a batched beam search) keep torch's int8 kernel, which is faster there. So do a
step's few rows times a weight of at least :data:`DOT_PRODUCT_MIN_WEIGHT` bytes on CPUs with int8 dot-product
instructions (AVX-512 VNNI, :func:`int8_dot_product`), where torch's kernel multiplies int8 by int8 faster than the
weight-only kernel widens the weight (docs/performance.md); there a step's rows share one activation scale, as many
rows do everywhere.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from copy import deepcopy as copy_module

import torch
from torch import nn

from aiayn.accel.cpu import native
from aiayn.accel.cpu.packed import ACTIVATION_FNS, unpack_output_layers
from aiayn.errors import AiaynError


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
        # a copy whose prepacked fp32 output layers (aiayn.accel.cpu.packed) are plain nn.Linear again, so they quantize
        copy = unpack_output_layers(copy_module(model.eval()))
        # eval(): the int8 layers quantize_dynamic makes start in training mode, which every decoding call would
        # then switch off and on again (eval_mode), a cost paid on every call
        return quantize_dynamic(copy, {nn.Linear}, dtype=torch.qint8, mapping={nn.Linear: Int8Linear},
                                inplace=True).eval()


#: the int8 weight size from which torch's kernel takes a step's few rows on CPUs with int8 dot products (smaller
#: weights stay in cache, where the two kernels run alike and the weight-only one keeps rows independent)
DOT_PRODUCT_MIN_WEIGHT = 1 << 20


def int8_dot_product() -> bool:
    """Whether this CPU has AVX-512 VNNI, the int8 dot-product instructions torch's int8 kernel (fbgemm) uses."""
    return "avx512_vnni" in native.cpu_flags()


with warnings.catch_warnings():  # (see quantize_int8)
    warnings.simplefilter("ignore")
    from torch.ao.nn.quantized.dynamic import Linear as _DynamicLinear
    from torch.ao.quantization import quantize_dynamic


class Int8Linear(_DynamicLinear):
    """torch's dynamically quantized int8 ``Linear`` (weight int8, one scale per tensor, activations rounded to 8
    bits per call), whose few-row fp32 calls go through aiayn's native weight-only kernel instead (see the module
    docstring). Made by :func:`quantize_int8`; the same state, ``state_dict`` and results elsewhere."""

    def __getstate__(self) -> dict:
        """Copies and pickles leave the int8 rows read for the native kernel behind (read again on first use)."""
        state = dict(super().__getstate__())
        state.pop("_aiayn_rows", None)
        return state

    #: what :meth:`forward` applies to its result itself (the core's feed-forward seam reads it)
    fused_activations = frozenset({"relu", "gelu"})

    def forward(self, x: torch.Tensor, activation: str | None = None) -> torch.Tensor:
        """x (..., in) -> (..., out), ``activation`` ("relu" or "gelu") applied: the native kernel at up to
        ``native.MAX_LINEAR_ROWS`` fp32 rows where it is built (the activation fused), torch's int8 kernel
        otherwise (and for large weights on CPUs with :func:`int8_dot_product`)."""
        plan = self.rows_plan(x.shape, x.dtype, activation)
        if plan is not None:
            return plan(x)
        y = super().forward(x)
        return y if activation is None else ACTIVATION_FNS[activation](y)

    def rows_plan(self, shape: torch.Size, dtype: torch.dtype,
                  activation: str | None = None) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """The native product for inputs of ``shape`` and ``dtype`` (``activation``, "relu" or "gelu", applied in
        it), as a function x -> y carrying its ``native_product``; None where it does not serve (more rows, another
        dtype, no native kernels, a large weight on a CPU with :func:`int8_dot_product`, a weight with nonzero zero
        points)."""
        if int8_dot_product() and self.in_features * self.out_features >= DOT_PRODUCT_MIN_WEIGHT:
            return None
        if dtype != torch.float32 or not shape or shape.numel() > native.MAX_LINEAR_ROWS * shape[-1]:
            return None
        if native.library() is None:
            return None
        weight = self._weight_rows()
        if weight is None:
            return None
        plans = weight[1]
        if activation not in plans:
            plans[activation] = native.int8_rows_linear_plan(*weight[2:], activation)
        return plans[activation]

    def _weight_rows(self) -> tuple | None:
        """(the packed params it was read from, {activation: plan}, q (N, K) int8, scales (N,), bias (N,) or None),
        read from torch's packed weight once and again whenever ``set_weight_bias`` replaced it; None where a zero
        point is not 0 (symmetric int8 is what quantize_int8 makes)."""
        packed = self._packed_params._packed_params
        kept = getattr(self, "_aiayn_rows", None)
        if kept is not None and kept[0] is packed:
            return kept
        w, b = self._weight_bias()
        if w.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
            if w.q_zero_point() != 0:
                return None
            scales = torch.full((w.shape[0],), w.q_scale(), dtype=torch.float32)
        elif w.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric) and w.q_per_channel_axis() == 0:
            if bool(w.q_per_channel_zero_points().ne(0).any()):
                return None
            scales = w.q_per_channel_scales().to(torch.float32).contiguous()
        else:
            return None
        bias = None if b is None else b.detach().to(torch.float32).contiguous()
        kept = self._aiayn_rows = (packed, {}, w.int_repr().contiguous(), scales, bias)
        return kept
