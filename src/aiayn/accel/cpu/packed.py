"""oneDNN-prepacked linear layers for CPU decoding: the output layer in fp32, every linear layer in bf16.

The output layer (hidden -> vocabulary logits) is the largest matmul of a decoding step: 512 x 32000 at the
paper's base size, 768 x 50257 for GPT-2. oneDNN, which PyTorch ships for its own CPU compiler backend
(``torch.ops.mkldnn``), can reorder such a weight once into the blocked layout its kernel reads best, which beats
``F.linear`` with the column-major weight of :mod:`aiayn.accel.cpu.layout` from a few rows (a sentence's beams) up
(measured: docs/performance.md, ``bench/output_layer.py``). A single row (greedy batch-1 generation) is a
matrix-vector product, where ``F.linear`` is faster, so one-row fp32 calls keep ``F.linear``. Narrow fp32 layers
gain nothing, so only fp32 output layers at least ``MIN_PACKED_IN_FEATURES`` wide are packed; and the decoder's
own, smaller linears gain at some shapes and lose at others, so in fp32 they are left alone.

In bf16 (:mod:`aiayn.nn.precision`) the picture is different: on a CPU with native bf16 matmuls (AVX512-BF16 or
AMX) oneDNN's packed kernel beats ``F.linear`` for *every* linear layer and at every row count, one row included.
So :func:`pack_bf16_linears` packs them all, and the packed path takes bf16 input from one row up.

:func:`pack_output_layers` turns the projection of every :class:`~aiayn.models.heads.LMHead` into a
:class:`PackedLinear`: an ``nn.Linear`` that keeps its weight ``Parameter`` (so ``state_dict``, checkpoint saving
and the tie to the embedding table are unchanged) plus a packed copy used only where it is valid:

* input of the weight's dtype (fp32 from two rows, bf16 from one) on the CPU with autograd off
  (``torch.no_grad`` / ``torch.inference_mode``), oneDNN available (for bf16: with native bf16 support);
  everything else (one fp32 row, training, CUDA, other dtypes) takes ``F.linear`` on the weight itself;
* the copy is rebuilt when the weight changes (its storage, dtype or in-place version counter moved, as after
  ``load_state_dict`` or ``model.to(torch.bfloat16)``) and after any torch optimizer step in the process (a global
  optimizer-step post-hook counts them: fused optimizers such as ``Adam(fused=True)`` move no version counter), so
  it is never stale. Not seen: in-place changes through ``weight.data`` (a tensor with its own version counter)
  outside an optimizer step, and weights that are inference tensors, which are therefore never packed.

Results equal ``F.linear`` up to float rounding (a different summation order). Memory: one extra copy of each
packed weight (65 MB at 512 x 32000 in fp32).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from aiayn.accel.cpu import gemm as cpu_gemm
from aiayn.accel.cpu import native
from aiayn.accel.cpu.gemm import onednn_available
from aiayn.models.heads import LMHead

# dtype -> fewest rows worth the packed kernel: one fp32 row is a matrix-vector product, faster through F.linear;
# in bf16 the packed kernel wins from one row up (see the module docstring)
MIN_PACKED_ROWS = {torch.float32: 2, torch.bfloat16: 1}
MIN_PACKED_IN_FEATURES = 256  # narrower output layers were slower packed (see the module docstring)
#: where oneDNN is the fp32 inference backend (:func:`aiayn.accel.cpu.gemm.fp32_inference_backend`): the fewest
#: multiply-adds per call (rows x in x out) worth its packed kernel; below it ``F.linear``'s lower fixed cost wins
#: (see the module docstring)
MIN_ONEDNN_MACS = 1 << 19
#: there, a product of two or more rows takes the packed kernel from this many multiply-adds: a decoding step reads
#: its weights from memory, not from the caches (the step's weights outgrow them), and on cold weights oneDNN's
#: few-row products stream them faster than MKL's, though warm MKL is faster (measured: docs/performance.md)
MIN_ONEDNN_MACS_FEW_ROWS = 1 << 17
#: there, a single row times a weight of at least this many multiply-adds (below MIN_ONEDNN_MACS) is split into two
#: half-width products on two threads (:func:`_split_row_product`): MKL runs one row on one thread
MIN_SPLIT_ROW_MACS = 1 << 16
_Linear = TypeVar("_Linear", bound=nn.Linear)
_optimizer_steps = 0  # every torch optimizer step so far, in this process (see _count_optimizer_step)


def _count_optimizer_step(optimizer: torch.optim.Optimizer, args: object, kwargs: object) -> None:
    """Global optimizer-step post-hook: a packed copy made before any step is stale after it. Fused optimizers
    (``Adam(fused=True)``, the trainer's default where supported) update weights without moving their version
    counters, so the version alone cannot tell; this count joins the packed copy's key."""
    global _optimizer_steps
    _optimizer_steps += 1


register_optimizer_step_post_hook(_count_optimizer_step)


def weight_state(weight: Tensor) -> tuple[int, int, torch.dtype, int]:
    """What a copy derived from ``weight`` (a packed or half-precision copy) must match to be current: its storage,
    in-place version counter and dtype, and the optimizer steps taken in this process (fused optimizers move no
    version counter; see :func:`_count_optimizer_step`). Not for inference tensors, which have no version counter."""
    return weight.data_ptr(), weight._version, weight.dtype, _optimizer_steps


@functools.cache
def onednn_bf16_available() -> bool:
    """Whether oneDNN can prepack bf16 linear weights and this CPU multiplies bf16 natively (AVX512-BF16 / AMX)."""
    return onednn_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def packable_dtype(dtype: torch.dtype) -> bool:
    """Whether this build and CPU have a prepacked oneDNN kernel worth using for ``dtype`` weights."""
    if dtype == torch.bfloat16:
        return onednn_bf16_available()
    return dtype == torch.float32 and onednn_available()


def pack_weight(weight: Tensor) -> Tensor:
    """oneDNN's prepacked copy of an (out, in) fp32 or bf16 linear weight (an opaque mkldnn tensor)."""
    with torch.no_grad():
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach())


#: activations oneDNN's linear kernel can apply to its result as a post-op: name -> (its post-op, its algorithm).
#: Both match torch's own function exactly in fp32 ("gelu" is the exact, erf-based GELU, as ``F.gelu``); in bf16 the
#: fused activation is applied before the result is rounded to bf16, so it may differ from ``F.gelu`` by one bf16 ulp.
FUSED_ACTIVATIONS = {"relu": ("relu", ""), "gelu": ("gelu", "none")}
ACTIVATION_FNS = {"relu": F.relu, "gelu": F.gelu}  # the functions FUSED_ACTIVATIONS name


def packed_linear(x: Tensor, packed: Tensor, bias: Tensor | None = None, activation: str | None = None) -> Tensor:
    """x (..., in) times a :func:`pack_weight` copy (+ bias) -> (..., out); ``F.linear`` up to rounding.

    ``activation`` (a key of ``FUSED_ACTIVATIONS``) is applied to the result inside the same kernel call.
    """
    attr, algorithm = FUSED_ACTIVATIONS[activation] if activation is not None else ("none", "")
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, attr, [], algorithm)


class PackedLinear(nn.Linear):
    """``nn.Linear`` that multiplies by a oneDNN-prepacked copy of its weight at fp32 or bf16 CPU inference.

    Build it with :meth:`from_linear`; it shares the original's ``weight`` and ``bias`` parameters.
    """

    _packed: Tensor | None
    _packed_key: tuple[int, int, torch.dtype, int] | None
    _halves: Tensor | None
    _halves_key: tuple[int, int, torch.dtype, int] | None
    _panels: Tensor | None
    _panels_key: tuple[int, int, torch.dtype, int] | None
    # (frozen_weights block, what the plans depend on (see _plan_stamp), {(shape, dtype, activation): product})
    _plans: tuple[int, tuple | None, dict] | None = None
    #: made for a decoding step's few rows alone (:func:`use_fast_cpu_linears` with ``decoding`` where oneDNN is not
    #: the fp32 backend): the native few-row kernel up to ``native.MAX_LINEAR_ROWS`` rows, else as ``nn.Linear``
    few_rows_only = False
    #: what :meth:`forward` applies in the product itself (the core's feed-forward seam reads it)
    fused_activations = frozenset(FUSED_ACTIVATIONS)
    _COPIES = ("packed", "halves", "panels")  # the weight-derived copies a PackedLinear keeps (see _derived)

    @classmethod
    def from_linear(cls, linear: nn.Linear, few_rows_only: bool = False) -> PackedLinear:
        """A ``PackedLinear`` sharing ``linear``'s parameters (same ``Parameter`` objects, so ties survive);
        ``few_rows_only``: see the attribute."""
        new = _sharing_parameters(cls, linear)
        if few_rows_only:
            new.few_rows_only = True
        for name in cls._COPIES:
            setattr(new, f"_{name}", None)
            setattr(new, f"_{name}_key", None)
        return new

    def __getstate__(self) -> dict:
        """Copies and pickles leave the weight-derived copies behind (they are rebuilt on first use)."""
        state = super().__getstate__()
        return {**state, **{f"_{name}{suffix}": None for name in self._COPIES for suffix in ("", "_key")},
                "_plans": None}

    def _packable(self) -> bool:
        """Whether this build and CPU can prepack the weight, and may: an inference tensor (made under
        ``torch.inference_mode``) has no version counter to tell a stale copy by, so it is never packed."""
        w = self.weight
        return w.dtype in MIN_PACKED_ROWS and not w.is_inference() and packable_dtype(w.dtype)

    def _derived(self, name: str, make) -> Tensor:  # noqa: ANN001
        """The copy ``name`` of the current weight, remade by ``make(weight)`` if the weight changed since."""
        key = weight_state(self.weight)
        if getattr(self, f"_{name}", None) is None or getattr(self, f"_{name}_key", None) != key:
            setattr(self, f"_{name}", make(self.weight))
            setattr(self, f"_{name}_key", key)
        return getattr(self, f"_{name}")

    def packed_weight(self) -> Tensor:
        """The packed copy of the current weight, rebuilt if the weight changed since it was made."""
        return self._derived("packed", pack_weight)

    def forward(self, x: Tensor, activation: str | None = None) -> Tensor:
        """x (..., in_features) -> (..., out_features); the same values as ``nn.Linear`` up to rounding.

        Training, autocast, CUDA and mixed dtypes take :func:`aiayn.accel.cpu.gemm.linear` (oneDNN for fp32 CPU
        training where it is the fp32 backend, else ``F.linear``). CPU inference in the weight's dtype takes
        ``F.linear`` for fp32 products under ``MIN_ONEDNN_MACS`` multiply-adds (``MIN_ONEDNN_MACS_FEW_ROWS`` for two
        rows or more) where oneDNN is the fp32 inference backend (there BLAS's fixed cost is lower; a single row of
        at least ``MIN_SPLIT_ROW_MACS`` as two half-width products on two threads instead), the packed kernel for
        larger ones there and, on other backends, from ``MIN_PACKED_ROWS`` rows (when :meth:`_packable`), and
        otherwise ``cpu_gemm.linear`` (oneDNN unpacked, or ``F.linear``). Before all of these, where the native
        kernels are built (:mod:`aiayn.accel.cpu.native`): fp32 products on CPUs with AVX2 but not AVX-512 from
        ``native.PANEL_MIN_ROWS`` rows (two for layers 512 wide) take ``native.panel_linear`` (a panel-packed copy
        kept like the oneDNN one), and otherwise up to ``native.MAX_LINEAR_ROWS`` rows by a column-major weight
        ``native.rows_linear``.

        ``activation`` ("relu" or "gelu", see ``FUSED_ACTIVATIONS``) returns that function of the result instead:
        on the packed path oneDNN applies it in the same call, which saves an elementwise pass and its fixed cost
        (a feed-forward layer's first product at inference); elsewhere it is applied afterwards.

        Inside :func:`frozen_weights` the choice is made once per input shape and dtype and kept for the block, and
        for later blocks while nothing it depends on changed (:meth:`frozen_plan`).
        """
        if _frozen.epoch:
            return self.frozen_plan(x, activation)(x)
        return self.plan(x, activation)(x)

    def frozen_plan(self, x: Tensor, activation: str | None = None) -> Callable[[Tensor], Tensor]:
        """:meth:`plan` for inputs of ``x``'s shape and dtype, chosen once per :func:`frozen_weights` block (call it
        inside one), and kept for later blocks while nothing it depends on changed (:meth:`_plan_stamp`): a
        ``translate`` or ``generate`` call then chooses no product again."""
        epoch, plans = _frozen.epoch, self._plans
        if plans is None or plans[0] != epoch:  # a new block: keep the choices if nothing changed since
            stamp = self._plan_stamp()
            kept = plans is not None and stamp is not None and plans[1] == stamp
            plans = self._plans = (epoch, stamp, plans[2] if kept else {})
        key = (x.shape, x.dtype, activation)
        plan = plans[2].get(key)
        if plan is None:
            plan = plans[2][key] = self.plan(x, activation)
        return plan

    def _plan_stamp(self) -> tuple | None:
        """Everything :meth:`plan`'s choices and the copies they hold depend on besides the input's shape and
        dtype: the weight's state (:func:`weight_state`: storage, version, dtype, optimizer steps) and device, the
        bias's storage, autocast, the fp32 backend, the thread count and whether the native kernels are on
        (:mod:`aiayn.accel.cpu.native`, ``SETTINGS.native``). None where plans must not outlive their block: with
        autograd on (an input's ``requires_grad`` then matters too) or an inference-tensor weight (no version counter
        tells an in-place change)."""
        w, b = self.weight, self.bias
        if torch.is_grad_enabled() or w.is_inference() or (b is not None and b.is_inference()):
            return None
        return (weight_state(w), w.device, None if b is None else (b.data_ptr(), b._version, b.dtype),
                _block_settings())

    def plan(self, x: Tensor, activation: str | None = None) -> Callable[[Tensor], Tensor]:
        """The product :meth:`forward` takes for ``x`` now, as a function of inputs of its shape and dtype: x (...,
        in_features) -> (..., out_features), with ``activation`` applied. Valid while the weight, autograd and
        autocast stay as they are (inside a :func:`frozen_weights` block)."""
        w, b = self.weight, self.bias
        if not (x.dtype == w.dtype and x.device.type == "cpu" and w.device.type == "cpu"
                and not (torch.is_grad_enabled() and (w.requires_grad or x.requires_grad))
                and not torch.is_autocast_enabled("cpu")):
            return lambda x: _activate(cpu_gemm.linear(x, w, b), activation)
        # many rows on an AVX2 CPU: a panel-packed copy
        if w.dtype == torch.float32 and not self.few_rows_only and _native_panels(x, w):
            panels = self._derived("panels", lambda w: native.pack_panels(w.detach()))
            return native.panel_linear_plan(w, _detached(b), activation, packed=panels)
        if w.dtype == torch.float32 and _native_rows(x, w):  # a decoding step's few rows: the weight read once
            return native.rows_linear_plan(w.detach().t(), _detached(b), activation)
        if self.few_rows_only:  # as nn.Linear (torch's BLAS), without cpu_gemm.linear's per-call checks
            return lambda x: _activate(F.linear(x, w, b), activation)
        if w.dtype == torch.float32 and cpu_gemm.fp32_inference_backend() == "onednn":  # every fp32 layer, by size
            macs, one_row = x.numel() * w.shape[0], x.numel() == x.shape[-1]
            if macs < (MIN_ONEDNN_MACS if one_row else MIN_ONEDNN_MACS_FEW_ROWS):  # a small product: BLAS
                if (one_row and macs >= MIN_SPLIT_ROW_MACS
                        and w.shape[0] % 2 == 0 and not w.is_inference() and torch.get_num_threads() > 1):
                    halves, bias = self._derived("halves", _weight_halves), _detached(b)
                    return lambda x: _activate(_split_row_product(x, halves, bias), activation)  # both cores
                return lambda x: _activate(F.linear(x, w, b), activation)
            use_packed = True
        else:  # fp32 output layers from MIN_PACKED_ROWS rows (one row is a matrix-vector product), bf16 from one
            min_rows = MIN_PACKED_ROWS.get(w.dtype)
            use_packed = min_rows is not None and x.numel() >= min_rows * x.shape[-1]
        if use_packed and self._packable():
            packed, bias = self.packed_weight(), _detached(b)
            return lambda x: packed_linear(x, packed, bias, activation)
        return lambda x: _activate(cpu_gemm.linear(x, w, b), activation)


class _FrozenState(threading.local):
    epoch = 0  # nonzero inside frozen_weights() in this thread: the block's number
    settings: tuple | None = None  # (epoch, _block_settings()) of the block that read them last


_frozen = _FrozenState()
_blocks = itertools.count(1)  # block numbers, unique across threads


@contextlib.contextmanager
def frozen_weights() -> Iterator[None]:
    """A block in which the caller promises that no weight changes and that autograd and autocast stay as they are
    (one ``generate`` or ``translate`` call, under :func:`aiayn.generate.steppers.eval_mode`).

    Every :class:`PackedLinear` then chooses its product once per input shape and dtype and keeps the choice, its
    packed copy and bias for the block, instead of checking them at every call: a decoding step's Python work costs
    several times its warm time, since the weights streamed between layers evict the interpreter's data from the
    caches (measured: docs/performance.md). Nested blocks share the outermost one's choices; each new outermost
    block checks once per layer whether anything the choices depend on changed (the weight, its bias, autocast, the
    backend, the thread count: :meth:`PackedLinear._plan_stamp`) and starts afresh for a layer where it did, so
    changes made between blocks are seen. The block holds for the thread that entered it only: another thread may
    train or change other models meanwhile.
    """
    outer = _frozen.epoch == 0
    if outer:
        _frozen.epoch = next(_blocks)
    try:
        yield
    finally:
        if outer:
            _frozen.epoch = 0


def _block_settings() -> tuple:
    """What every layer's plans depend on besides its own weight, read once per :func:`frozen_weights` block (which
    promises that they stay as they are within it): autocast, the fp32 backend, the thread count and whether the
    native kernels are on. Read once per block rather than once per layer."""
    epoch, kept = _frozen.epoch, _frozen.settings
    if kept is not None and kept[0] == epoch and epoch:
        return kept[1]
    settings = (torch.is_autocast_enabled("cpu"), cpu_gemm.fp32_inference_backend(), torch.get_num_threads(),
                native.library() is not None)
    _frozen.settings = (epoch, settings)
    return settings


def frozen_block() -> int:
    """The number of the :func:`frozen_weights` block in effect in this thread (a new one for each outermost block),
    0 outside."""
    return _frozen.epoch


def _native_rows(x: Tensor, w: Tensor) -> bool:
    """Whether ``aiayn.accel.cpu.native.rows_linear`` serves fp32 input ``x`` (..., in) times the weight ``w``
    (out, in): at most ``native.MAX_LINEAR_ROWS`` rows, a column-major weight (:mod:`aiayn.accel.cpu.layout`), the
    kernels built."""
    return (x.numel() <= native.MAX_LINEAR_ROWS * x.shape[-1] and w.dim() == 2 and w.stride(0) == 1
            and native.library() is not None)


def _native_panels(x: Tensor, w: Tensor) -> bool:
    """Whether ``aiayn.accel.cpu.native.panel_linear`` serves fp32 input ``x`` (..., in) times the weight ``w``
    (out, in): from ``native.PANEL_MIN_ROWS`` rows (from two where ``w`` is at least
    ``native.PANEL_FEW_ROWS_MIN_FEATURES`` wide in and out) and ``native.PANEL_MIN_MACS`` multiply-adds, where
    ``native.panel_linear_preferred()`` (AVX2 without AVX-512, the kernels built); not for an inference-tensor weight
    (no version counter tells a stale packed copy)."""
    rows = x.numel() // max(x.shape[-1], 1)
    min_rows = 2 if w.dim() == 2 and min(w.shape) >= native.PANEL_FEW_ROWS_MIN_FEATURES else native.PANEL_MIN_ROWS
    return (rows >= min_rows and rows * w.numel() >= native.PANEL_MIN_MACS and w.dim() == 2
            and not w.is_inference() and native.panel_linear_preferred())


def _detached(b: Tensor | None) -> Tensor | None:
    return None if b is None else b.detach()


def _split_row_product(x: Tensor, halves: Tensor, b: Tensor | None) -> Tensor:
    """One row x (..., in) times a weight as two half-width products in one ``bmm`` -> (..., out).

    MKL multiplies a single row by a matrix on one thread; ``bmm`` over the two column halves of the transposed
    weight (``halves``: :func:`_weight_halves`, kept like the packed copy) runs them on two, where oneDNN is the
    fp32 inference backend.
    """
    y = torch.bmm(x.reshape(1, 1, -1).expand(2, 1, x.shape[-1]), halves).view(*x.shape[:-1], -1)
    return y if b is None else y.add_(b)


def _weight_halves(weight: Tensor) -> Tensor:
    """(out, in) weight -> (2, in, out/2) contiguous: the transposed weight's two column halves, for ``bmm``."""
    out_features, in_features = weight.shape
    with torch.no_grad():
        return weight.detach().t().reshape(in_features, 2, out_features // 2).permute(1, 0, 2).contiguous()


def _activate(y: Tensor, activation: str | None) -> Tensor:
    """``activation`` (a key of ``FUSED_ACTIVATIONS``, or None for none) applied to ``y``."""
    return y if activation is None else ACTIVATION_FNS[activation](y)


def pack_output_layers(model: nn.Module, min_in_features: int = MIN_PACKED_IN_FEATURES) -> nn.Module:
    """Make the projection of every ``LMHead`` of ``model`` a :class:`PackedLinear`, in place; returns ``model``.

    A no-op where oneDNN is unavailable, and idempotent. The packed copies are made lazily, on the first fp32
    CPU inference call, so calling this on a model that will move to CUDA costs nothing. (bf16 models get every
    linear packed by :func:`pack_bf16_linears`.)

    Args:
        model: any aiayn model (the output heads of all three families hold an ``LMHead``).
        min_in_features: leave output layers narrower than this (their hidden width) as they are.
    """
    if not onednn_available():
        return model
    for module in model.modules():
        if isinstance(module, LMHead) and type(module.proj) is nn.Linear \
                and module.proj.in_features >= min_in_features:
            module.proj = PackedLinear.from_linear(module.proj)
    return model


def pack_bf16_linears(model: nn.Module) -> nn.Module:
    """Make every bf16 ``nn.Linear`` of ``model`` a :class:`PackedLinear`, in place; returns ``model``.

    For bf16 CPU inference (:func:`aiayn.nn.precision.cast_for_inference`): with native bf16 matmuls every layer,
    narrow or wide, one row or many, was faster packed (see the module docstring). A no-op without native bf16
    support in oneDNN, and idempotent; parameters, ties and ``state_dict`` are unchanged.
    """
    if not onednn_bf16_available():
        return model
    for module in model.modules():
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear and child.weight.dtype == torch.bfloat16:
                setattr(module, name, PackedLinear.from_linear(child))
    return model


def use_fast_cpu_linears(model: nn.Module, decoding: bool = False) -> nn.Module:
    """Where oneDNN is the fp32 CPU inference backend (:func:`aiayn.accel.cpu.gemm.fp32_inference_backend`, which says
    oneDNN wherever the training backend does), and, with ``decoding``, wherever the native kernels are built and on
    (:mod:`aiayn.accel.cpu.native`: any x86-64 CPU with AVX2, Intel's too), make every ``nn.Linear`` of ``model`` a
    :class:`PackedLinear`, in place; returns ``model``.

    Training then runs each layer's three products through :func:`aiayn.accel.cpu.gemm.linear` (oneDNN where it is
    the training backend, else ``F.linear``), and inference through a prepacked weight from ``MIN_ONEDNN_MACS``
    multiply-adds per call up and aiayn's native few-row kernel at a decoding step's rows. Elsewhere (Intel CPUs,
    builds without oneDNN) a no-op, unless ``decoding``: then every fp32 ``nn.Linear`` becomes a ``few_rows_only``
    PackedLinear, so that a decoding step's few-row products take the native kernel (and
    while larger ones keep ``F.linear``.
    Idempotent; parameters, ties and ``state_dict`` are unchanged, and the layers still work on any device and dtype
    (they fall back to ``F.linear``). :func:`aiayn.accel.cpu.for_training` calls it, and
    :func:`aiayn.accel.cpu.layout.cpu_inference_layout` with ``decoding``.
    """
    everywhere = cpu_gemm.fp32_inference_backend() == "onednn"
    if not everywhere and not (decoding and native.library() is not None):
        return model
    for module in model.modules():
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear and (everywhere or child.weight.dtype == torch.float32):
                setattr(module, name, PackedLinear.from_linear(child, few_rows_only=not everywhere))
    return model


def unpack_output_layers(model: nn.Module, few_rows_only: bool = False) -> nn.Module:
    """Undo :func:`pack_output_layers`, :func:`pack_bf16_linears` and :func:`use_fast_cpu_linears` in place (plain
    ``nn.Linear`` with the same parameters); returns ``model``.

    For transformations that match modules by exact type, such as int8 dynamic quantization. With
    ``few_rows_only``, only the layers made for a decoding step's few rows (``PackedLinear.few_rows_only``): the
    layout a host where oneDNN is not the fp32 backend had before those (benchmarks and tests compare the two).
    """
    for module in model.modules():
        for name, child in list(module.named_children()):
            if type(child) is PackedLinear and (child.few_rows_only or not few_rows_only):
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
