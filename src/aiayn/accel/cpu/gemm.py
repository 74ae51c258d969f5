"""Which library multiplies fp32 matrices on the CPU: torch's default BLAS (MKL) or oneDNN.

PyTorch's x86 builds run fp32 ``F.linear`` / ``torch.matmul`` through Intel MKL. On AMD CPUs with AVX-512 (Zen 4,
Zen 5) MKL takes a slower code path, and oneDNN, the library PyTorch ships for its CPU compiler backend
(``torch.ops.mkldnn``), is the faster fp32 library for training's products (measured: docs/performance.md). On
Intel CPUs MKL is at least as fast, so nothing changes there.

:func:`fp32_backend` is the policy: ``"onednn"`` where it wins (AMD CPU with AVX-512, an MKL build of torch and
oneDNN present), else ``"torch"``; ``SETTINGS.fp32_gemm`` (:mod:`aiayn.accel.cpu.settings`: ``auto``, ``onednn``,
``torch``) or :func:`use_fp32_backend` overrides it.

Decoding has a policy of its own, :func:`fp32_inference_backend`: its products have a few rows (a step's batch x
beams) times weights read from memory, where MKL's kernels stream the weights far below the memory's rate on AMD
CPUs, AVX-512 or not (so there oneDNN and aiayn's native few-row kernel decode faster even where MKL trains faster).
So on AMD CPUs :class:`aiayn.accel.cpu.packed.PackedLinear` decodes through oneDNN whichever library trains; the
same override (``SETTINGS.fp32_gemm``, :func:`use_fp32_backend`) sets both.

Where the policy says oneDNN:

* :func:`linear` is ``F.linear`` with oneDNN's kernel for fp32 CPU tensors, differentiable (:class:`OneDNNLinear`:
  the forward product and both backward products through oneDNN, plain (unpacked) weights, so an optimizer may
  change them every step);
* :func:`mm_nt` is ``a @ b.T`` likewise (the fused projection + loss of :mod:`aiayn.accel.cpu.fused_loss`);
* model linear layers become :class:`aiayn.accel.cpu.packed.PackedLinear`
  (:func:`aiayn.accel.cpu.packed.use_fast_cpu_linears`), which calls :func:`linear` when training and a prepacked
  weight at inference.

Results equal torch's up to float rounding (a different summation order); everything that is not an fp32 CPU
tensor outside autocast (CUDA, bf16, float64, autocast regions) takes torch's own path.
"""

from __future__ import annotations

import contextlib
import functools
import platform
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.accel.cpu import native
from aiayn.accel.cpu.settings import SETTINGS

BACKENDS = ("auto", "onednn", "torch")
_override: str | None = None  # set by use_fp32_backend


@functools.cache
def onednn_available() -> bool:
    """Whether this PyTorch build has oneDNN's linear kernel (``torch.ops.mkldnn._linear_pointwise``)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


@functools.cache
def cpu_vendor() -> str:
    """The CPU's vendor string ("GenuineIntel", "AuthenticAMD", ...; "" when unknown)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    text = platform.processor()  # Windows: "AMD64 Family 26 Model 2 Stepping 0, AuthenticAMD"
    for vendor in ("GenuineIntel", "AuthenticAMD", "HygonGenuine"):
        if vendor in text:
            return vendor
    return ""


@functools.cache
def _auto_backend() -> str:
    mkl_on_amd_avx512 = (torch.backends.mkl.is_available() and cpu_vendor() in ("AuthenticAMD", "HygonGenuine")
                         and torch.backends.cpu.get_cpu_capability() == "AVX512")
    return "onednn" if mkl_on_amd_avx512 and onednn_available() else "torch"


@functools.cache
def _auto_inference_backend() -> str:  # (a superset of _auto_backend's oneDNN cases: those are AMD CPUs too)
    return "onednn" if cpu_vendor() in ("AuthenticAMD", "HygonGenuine") and onednn_available() else "torch"


def _resolve(auto: Callable[[], str]) -> str:
    """:func:`use_fp32_backend`'s choice, else ``SETTINGS.fp32_gemm``'s, with ``auto()`` for "auto"."""
    choice = _override or SETTINGS.fp32_gemm
    if choice not in BACKENDS:
        raise ValueError(f"fp32_gemm={choice!r}: choose one of {', '.join(BACKENDS)}")
    if choice == "auto":
        return auto()
    return "onednn" if choice == "onednn" and onednn_available() else "torch"


def fp32_inference_backend() -> str:
    """``"onednn"`` or ``"torch"``: the library for fp32 CPU products at inference (decoding's few-row products;
    :class:`aiayn.accel.cpu.packed.PackedLinear`), where it differs from :func:`fp32_backend`'s (see the module
    docstring).

    Order: :func:`use_fp32_backend`, then ``SETTINGS.fp32_gemm``, then the automatic choice: oneDNN on AMD CPUs
    (so wherever :func:`fp32_backend` says oneDNN, this says it too).
    """
    return _resolve(_auto_inference_backend)


def fp32_backend() -> str:
    """``"onednn"`` or ``"torch"``: the library for fp32 CPU matmuls (see the module docstring).

    Order: :func:`use_fp32_backend`, then ``SETTINGS.fp32_gemm``, then the automatic choice. Asking for oneDNN
    in a build without it gives ``"torch"``.
    """
    return _resolve(_auto_backend)


@contextlib.contextmanager
def use_fp32_backend(choice: str) -> Iterator[None]:
    """Within the block, :func:`fp32_backend` and :func:`fp32_inference_backend` follow ``choice`` ("auto",
    "onednn" or "torch")."""
    global _override
    if choice not in BACKENDS:
        raise ValueError(f"backend {choice!r}: choose one of {', '.join(BACKENDS)}")
    previous, _override = _override, choice
    try:
        yield
    finally:
        _override = previous


def onednn_applies(*tensors: Tensor) -> bool:
    """Whether oneDNN should multiply these tensors: all fp32 on the CPU, no CPU autocast, policy "onednn"."""
    return (all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors)
            and not torch.is_autocast_enabled("cpu") and fp32_backend() == "onednn")


def _onednn_nt(a: Tensor, b: Tensor, bias: Tensor | None = None) -> Tensor:
    """a (M, K) @ b (N, K)^T (+ bias) -> (M, N) through oneDNN (any strides).

    oneDNN takes ``b`` with any strides but makes a strided ``a`` (a weight gradient's g^T) contiguous itself, more
    slowly than ``Tensor.contiguous``, so that copy is made here.
    """
    return torch.ops.mkldnn._linear_pointwise(a.contiguous(), b, bias, "none", [], "")


class OneDNNLinear(torch.autograd.Function):
    """``F.linear`` whose forward and backward products run through oneDNN (fp32 CPU tensors)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:  # type: ignore[override]
        x2 = x.reshape(-1, x.shape[-1])  # (M, in)
        ctx.save_for_backward(x2, weight)
        ctx.has_bias = bias is not None
        return _onednn_nt(x2, weight, bias).view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        return _linear_backward(ctx, grad_out, lambda g, weight: _onednn_nt(g, weight.t()))


def _linear_backward(ctx, grad_out: Tensor, input_grad: Callable[[Tensor, Tensor], Tensor]):  # noqa: ANN001, ANN202
    """A linear layer's three gradients for an autograd Function that saved (x (M, in), weight (out, in)) and
    ``has_bias``: the input's by ``input_grad(g, weight)`` (g @ W, (M, out) -> (M, in)) reshaped like ``grad_out``,
    the weight's by :func:`weight_gradient`, the bias's as a sum over rows."""
    x2, weight = ctx.saved_tensors
    g = grad_out.reshape(-1, weight.shape[0])  # (M, out)
    grad_x = grad_w = grad_b = None
    if ctx.needs_input_grad[0]:
        grad_x = input_grad(g, weight).view(*grad_out.shape[:-1], weight.shape[1])  # g @ W: (..., in)
    if ctx.needs_input_grad[1]:
        grad_w = weight_gradient(g, x2)  # g^T @ x: (out, in)
    if ctx.has_bias and ctx.needs_input_grad[2]:
        grad_b = g.sum(0)
    return grad_x, grad_w, grad_b


def weight_gradient(g: Tensor, x: Tensor, accumulate: Tensor | None = None) -> Tensor:
    """A linear layer's weight gradient ``g^T @ x``: g (M, out), x (M, in) -> (out, in), added into ``accumulate``
    (in place, returned) when given.

    oneDNN needs g^T contiguous, an (out, M) copy; BLAS takes the transpose as it is and is faster wherever
    out >= in, oneDNN where out < in (measured: docs/performance.md). So oneDNN only for out < in where
    :func:`onednn_applies`.
    """
    if g.shape[1] < x.shape[1] and onednn_applies(g, x) and g.numel() and x.numel():
        result = _onednn_nt(g.t(), x.t())
        return result if accumulate is None else accumulate.add_(result)
    return torch.mm(g.t(), x) if accumulate is None else accumulate.addmm_(g.t(), x)


#: :func:`native_forward_applies`'s shapes: an output layer's product, at least this many outputs ...
NATIVE_FORWARD_MIN_OUT = 4096
#: ... from at most this many inputs ...
NATIVE_FORWARD_MAX_IN = 768
#: ... at this many rows or more (fewer rows pay the weight's packing for too little work)
NATIVE_FORWARD_MIN_ROWS = 64


def native_forward_applies(x: Tensor, weight: Tensor) -> bool:
    """Whether ``x @ weight.T`` (x (..., K), M rows in all; weight (N, K)) goes through
    :func:`aiayn.accel.cpu.native.panel_linear_once`: fp32 CPU tensors outside autocast, torch's BLAS the fp32
    training library (:func:`fp32_backend`), the native panel kernel preferred on this CPU (AVX2 without AVX-512,
    kernels built: :func:`aiayn.accel.cpu.native.panel_linear_preferred`), and the shape of a vocabulary-wide output
    layer: N >= ``NATIVE_FORWARD_MIN_OUT``, K <= ``NATIVE_FORWARD_MAX_IN``, M >= ``NATIVE_FORWARD_MIN_ROWS``. Only
    there does the panel kernel, with the weight packed in the call, beat MKL (measured: docs/performance.md).
    """
    if x.dim() < 1 or weight.dim() != 2 or weight.shape[1] != x.shape[-1]:
        return False
    k, n = x.shape[-1], weight.shape[0]
    m = x.numel() // k if k else 0
    if not (n >= NATIVE_FORWARD_MIN_OUT and k <= NATIVE_FORWARD_MAX_IN and m >= NATIVE_FORWARD_MIN_ROWS):
        return False
    if not (x.dtype == weight.dtype == torch.float32 and x.device.type == weight.device.type == "cpu"
            and not torch.is_autocast_enabled("cpu") and fp32_backend() == "torch"):
        return False
    return native.panel_linear_preferred()


class NativeForwardLinear(torch.autograd.Function):
    """``F.linear`` on 2-D x whose forward product runs through :func:`aiayn.accel.cpu.native.panel_linear_once` (the
    weight packed in the call) and whose backward products run through torch's BLAS, as ``F.linear``'s do."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return native.panel_linear_once(x, weight, None if bias is None else bias.contiguous())

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        return _linear_backward(ctx, grad_out, torch.mm)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``: x (..., in), weight (out, in), bias (out,) -> (..., out).

    Through oneDNN (forward and backward) where :func:`onednn_applies`; a vocabulary-wide output layer's forward
    product through aiayn's native panel kernel where :func:`native_forward_applies` (the backward through BLAS);
    else ``F.linear`` itself.
    """
    if (bias is None or bias.dim() == 1) and native_forward_applies(x, weight):
        x2 = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
        if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                        or (bias is not None and bias.requires_grad)):
            y = NativeForwardLinear.apply(x2, weight, bias)
        else:
            y = native.panel_linear_once(x2, weight.detach(), None if bias is None else bias.detach().contiguous())
        return y if x.dim() == 2 else y.view(*x.shape[:-1], weight.shape[0])
    if not (onednn_applies(x, weight) and x.numel()):
        return F.linear(x, weight, bias)
    wants_grad = x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    if torch.is_grad_enabled() and wants_grad:
        return OneDNNLinear.apply(x, weight, bias)
    # no gradient wanted: the kernel itself (an autograd.Function costs as much per call as a small product)
    return _onednn_nt(x.reshape(-1, x.shape[-1]), weight, bias).view(*x.shape[:-1], weight.shape[0])


def mm_nt(a: Tensor, b: Tensor, out: Tensor | None = None) -> Tensor:
    """``a @ b.T``: a (M, K), b (N, K) -> (M, N), written into ``out`` when given. Not differentiable through
    oneDNN: for code that computes its own gradients (:mod:`aiayn.accel.cpu.fused_loss`).

    Through oneDNN where :func:`onednn_applies` (its result is then copied into ``out``), aiayn's native panel kernel
    where :func:`native_forward_applies` (straight into ``out``), else ``torch.matmul``.
    """
    if native_forward_applies(a, b) and (out is None or out.stride(1) == 1):
        return native.panel_linear_once(a, b, out=out)
    if onednn_applies(a, b) and a.numel() and b.numel():
        result = _onednn_nt(a, b)
        return result if out is None else out.copy_(result)
    return torch.matmul(a, b.T, out=out)
