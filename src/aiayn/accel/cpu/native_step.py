"""A decoding step's layers as one native call each (``aiayn/accel/cpu/native/decoder_layer.c``), for
:class:`~aiayn.accel.cpu.fast_step.FastDecoderStep`.

The flat program of :mod:`aiayn.accel.cpu.fast_step` already runs each layer's products and attention in native
kernels, but between them a layer still makes about twenty dispatched torch ops (norms, residual sums, the cache
write, views, fresh outputs) and as many lines of Python, a noticeable share of a batched decode (measured:
docs/performance.md). :class:`NativeLayers` hands each layer to
``aiayn_decoder_layer_step``: the same products, by the kernels each layer's plan chose (``plan.native_product``:
the panel or the few-rows kernel), the same attention kernel, and in C the glue: the norms, the residual sums, RoPE,
a gated activation, the new position's keys and values copied into the cache. What stays in Python per layer is a
dozen fields of a ``ctypes`` structure (the cache's address and length, the deferred reorders' row table, the masks).
An encoder's pass at inference goes the same way (:meth:`NativeLayers.encode`,
:class:`~aiayn.accel.cpu.fast_step.FastEncoder`): each token attends over its own sentence's keys.

It serves a step only where everything in it has a native form (:meth:`NativeLayers.build`): every product planned
to a native kernel; norms that are LayerNorm, RMSNorm or none; a feed-forward network with ReLU/exact GELU fused into
its first product, or a gated one (SwiGLU, GeGLU with the exact GELU: the gate applied in C); RoPE or no rotary
embedding (applied in C to the queries and new keys); self-attention over the cache through the native kernel (no
ALiBi/T5 position bias) and, for an encoder-decoder, cross-attention through it too. Otherwise the Python loop runs
(SiLU and GELU's tanh approximation among them); ``SETTINGS.native_layers`` off (:mod:`aiayn.accel.cpu.settings`)
keeps it always. The results equal the Python loop's up to float rounding (the norms' moments are summed in another
order); tests hold them equal.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.accel.cpu import native
from aiayn.accel.cpu.functional import fused_activation
from aiayn.accel.cpu.packed import PackedLinear
from aiayn.accel.cpu.quantize import Int8Linear
from aiayn.accel.cpu.settings import SETTINGS
from aiayn.nn.cache import DecoderCache
from aiayn.nn.norms import RMSNorm

if TYPE_CHECKING:
    from aiayn.accel.cpu.fast_step import _Layer, _Product, _Wiring

GATED = {"swiglu": 1, "geglu": 2}  # a gated feed-forward network's activation, by name: decoder_layer.c's code
GATE_FNS = {"swiglu": F.silu, "geglu": F.gelu}  # the gate's function that each code computes (exact GELU)
_I, _P, _F = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float


class _CProduct(ctypes.Structure):
    _fields_ = [("kind", _I), ("w", _P), ("w_sk", _I), ("bias", _P), ("n", _I), ("k", _I), ("act", _I),
                ("scales", _P)]


class _CWiring(ctypes.Structure):
    _fields_ = [("pre", _I), ("alpha", _F), ("norm", _I), ("weight", _P), ("bias", _P), ("eps", _F)]


class _CLayer(ctypes.Structure):
    _fields_ = [("d", _I), ("hq", _I), ("hkv", _I), ("dh", _I), ("cross", _I), ("gated", _I), ("self_scale", _F),
                ("cross_scale", _F), *[(name, _CProduct) for name in
                                       ("qkv", "self_out", "cross_q", "cross_out", "w_in", "w_out")],
                *[(name, _CWiring) for name in ("self_res", "cross_res", "ffn_res")]]


class _CStep(ctypes.Structure):
    _fields_ = [("n", _I), ("kv", _P), ("kv_st", _I), ("kv_sb", _I), ("kv_sh", _I), ("kv_v", _I), ("length", _I),
                ("rows", _P), ("r_ss", _I), ("mask", _P), ("m_sb", _I), ("m_ss", _I), ("ck", _P), ("cv", _P),
                ("c_sb", _I), ("c_sh", _I), ("c_ss", _I), ("c_len", _I), ("group", _I), ("c_mask", _P),
                ("cm_sb", _I), ("cm_ss", _I), ("cos", _P), ("sin", _P), ("rot_sb", _I), ("scratch", _P),
                ("threads", _I)]


def enabled() -> bool:
    """Whether decoding steps may take the native layers (``SETTINGS.native_layers``)."""
    return SETTINGS.native_layers


def _wiring(w: _Wiring, d: int) -> _CWiring | None:
    """A residual wiring as C takes it, or None where its norm is not LayerNorm or RMSNorm over the last dimension,
    or none."""
    norm = w.module
    if type(norm) is nn.Identity:
        return _CWiring(pre=int(w.pre), alpha=float(w.alpha), norm=0, weight=None, bias=None, eps=0.0)
    if type(norm) is RMSNorm:
        kind, weight, bias = 2, norm.weight, None
    elif type(norm) is nn.LayerNorm and tuple(norm.normalized_shape) == (d,):
        kind, weight, bias = 1, norm.weight, norm.bias
    else:
        return None
    if not all(t is None or (t.shape == (d,) and t.is_contiguous() and native.cpu_fp32(t)) for t in (weight, bias)):
        return None
    return _CWiring(pre=int(w.pre), alpha=float(w.alpha), norm=kind, eps=float(norm.eps),
                    weight=None if weight is None else weight.data_ptr(),
                    bias=None if bias is None else bias.data_ptr())


def _mask_args(mask: Tensor | None) -> tuple[int | None, int, int]:
    """A (B|1, S) bool key mask as C takes it: its address (None: no mask), batch stride (0 to broadcast one row
    over the batch) and key stride."""
    if mask is None:
        return None, 0, 0
    return mask.data_ptr(), mask.stride(0) * (mask.shape[0] > 1), mask.stride(1)


def _product(product: _Product, rows: int, width: int, activation: str | None = None) -> _CProduct | None:
    """The plan ``product`` takes for (rows, width) fp32 inputs, as C takes it; None where it is not a native kernel."""
    spec = getattr(product.plan_for(torch.Size((rows, width)), torch.float32, activation), "native_product", None)
    return None if spec is None else _CProduct(*spec)


class NativeLayers:
    """Every layer of a decoder stack for steps of ``rows`` rows, as native calls (see the module docstring)."""

    def __init__(self, layers: list[_Layer], rows: int, c_layers: list[_CLayer]) -> None:
        self.layers, self.rows, self.c_layers = layers, rows, c_layers
        lib = native.library()
        self._step_fn = lib.aiayn_decoder_layer_step
        floats = max(lib.aiayn_decoder_layer_scratch(ctypes.byref(c), rows) for c in c_layers)
        self._scratch = torch.empty(floats)  # kept across steps: no fresh pages to fault in
        self._step = _CStep(n=rows, scratch=self._scratch.data_ptr())

    @classmethod
    def build(cls, layers: list[_Layer], rows: int, d: int) -> NativeLayers | None:
        """The native layers for ``rows``-row steps of a stack of width ``d``, or None where some part of a layer has
        no native form (the products' plans are made, or taken, for those rows: call inside the decoding call's
        frozen block, as :class:`~aiayn.accel.cpu.fast_step.FastDecoderStep` does)."""
        if not enabled() or native.library() is None:
            return None
        c_layers = []
        for lay in layers:
            ffn = lay.ffn
            gated = GATED.get(ffn.activation, 0) if ffn.gated and ffn.act is GATE_FNS.get(ffn.activation) else 0
            if lay.self_backend == "reference" or (ffn.gated and not gated):
                return None
            # without a gate the activation is fused into w_in's product, which a PackedLinear or an Int8Linear does
            fused = fused_activation(ffn)
            if not gated and not (fused is not None and isinstance(ffn.w_in, (PackedLinear, Int8Linear))):
                return None
            if lay.cross and lay.cross_backend == "reference":
                return None
            qw, kvw = lay.q_width, 2 * lay.hkv * lay.dh
            products = {"qkv": _product(lay.qkv, rows, d), "self_out": _product(lay.self_out, rows, qw),
                        "w_in": _product(lay.w_in, rows, d, None if gated else fused)}
            hidden = None if products["w_in"] is None else products["w_in"].n // (2 if gated else 1)
            products["w_out"] = None if hidden is None else _product(lay.w_out, rows, hidden)
            wirings = {"self_res": _wiring(lay.self_res, d), "ffn_res": _wiring(lay.ffn_res, d)}
            if lay.cross:
                products["cross_q"] = _product(lay.cross_q, rows, d)
                products["cross_out"] = _product(lay.cross_out, rows, qw)
                wirings["cross_res"] = _wiring(lay.cross_res, d)
            if any(v is None for v in (*products.values(), *wirings.values())):
                return None
            if (products["qkv"].n != qw + kvw or products["self_out"].n != d or products["w_out"].n != d
                    or (lay.cross and (products["cross_q"].n != qw or products["cross_out"].n != d))):
                return None
            c_layers.append(_CLayer(d=d, hq=lay.hq, hkv=lay.hkv, dh=lay.dh, cross=int(lay.cross), gated=gated,
                                    self_scale=lay.native_scale,
                                    cross_scale=lay.cross_native_scale if lay.cross else 0.0,
                                    **products, **wirings))
        return cls(layers, rows, c_layers)

    def __call__(self, x: Tensor, cache: DecoderCache, key_mask: Tensor | None, memory_key_mask: Tensor | None,
                 rotary: tuple[Tensor, Tensor] | None = None) -> Tensor | None:
        """Every layer's step on x (rows, d): its output (rows, d), the cache appended to; None (nothing done) where
        a cross-attention cache's keys and values do not share strides or a mask is shorter than what it covers.

        Args:
            x: (rows, d) the stack's input (not changed).
            cache: the stack's cache, its self-attention store with a buffer (its reorders deferred, ``lazy``).
            key_mask: (rows|1, length + 1) bool over the cache after this step's write, or None.
            memory_key_mask: (memory rows|1, source length) bool, or None.
            rotary: RoPE's (cos, sin), each (rows|1, 1, Dh) for this step's position, or None.
        """
        cross, length = cache.cross_attn, cache.self_attn[0].length
        if key_mask is not None and key_mask.shape[-1] < length + 1:
            return None
        if cross and any(c.k.stride() != c.v.stride() or c.k.stride(-1) != 1 or (
                memory_key_mask is not None and memory_key_mask.shape[-1] < c.k.shape[2]) for c in cross):
            return None
        step, store = self._step, cache.self_attn[0].store
        if rotary is None:
            step.cos = step.sin = None
        else:
            cos, sin = rotary
            dh = self.layers[0].dh
            shape_ok = cos.dim() == 3 and cos.shape[1:] == (1, dh) and cos.shape[0] in (1, self.rows)
            if not (shape_ok and cos.shape == sin.shape and cos.stride() == sin.stride() and cos.stride(-1) == 1
                    and native.cpu_fp32(cos, sin)):
                return None
            step.cos, step.sin, step.rot_sb = cos.data_ptr(), sin.data_ptr(), cos.stride(0) * (cos.shape[0] > 1)
        x = x.contiguous().clone()
        step.threads = torch.get_num_threads()
        step.mask, step.m_sb, step.m_ss = _mask_args(key_mask)
        step.c_mask, step.cm_sb, step.cm_ss = _mask_args(memory_key_mask)
        run, x_ptr = self._step_fn, x.data_ptr()
        data = store.claim(length + 1)  # (capacity, B_buffer, L, 2, Hkv, Dh), grown if needed; every layer's length
        s_t, s_b, s_l, s_kv, s_h, _ = data.stride()
        kv, layer_bytes = data.data_ptr(), data.element_size() * s_l
        step.kv_st, step.kv_sb, step.kv_sh, step.kv_v, step.length = s_t, s_b, s_h, s_kv, length
        rows = store.rows  # (capacity, rows) deferred reorders' buffer rows, or None
        step.rows, step.r_ss = (None, 0) if rows is None else (rows.data_ptr(), rows.stride(0))
        for i, c_layer in enumerate(self.c_layers):
            sc = cache.self_attn[i]
            step.kv = kv + i * layer_bytes  # this layer's keys at (0, 0)
            if cross:
                cc = cross[i]
                step.ck, step.cv, step.group, step.c_len = cc.k.data_ptr(), cc.v.data_ptr(), cc.group, cc.k.shape[2]
                step.c_sb, step.c_sh, step.c_ss = cc.k.stride(0), cc.k.stride(1), cc.k.stride(2)
            run(ctypes.byref(c_layer), ctypes.byref(step), x_ptr)
            sc.length += 1
        return x

    def encode(self, x: Tensor, length: int, key_mask: Tensor | None) -> Tensor:
        """An encoder stack's layers (no cross-attention) on x (rows, d): rows / ``length`` sequences of ``length``
        tokens each, every token attending over its own sequence's keys (no cache, no RoPE).

        Args:
            x: (rows, d) the embedded tokens, sequence by sequence (not changed).
            length: tokens per sequence.
            key_mask: (rows / length | 1, length) bool, False at padding, or None.
        Returns:
            (rows, d) the last layer's output (no final norm).
        """
        step = self._step
        step.threads, step.kv, step.length, step.cos, step.sin, step.rows = torch.get_num_threads(), None, length, \
            None, None, None
        step.mask, step.m_sb, step.m_ss = _mask_args(key_mask)
        x = x.contiguous().clone()
        for c_layer in self.c_layers:
            self._step_fn(ctypes.byref(c_layer), ctypes.byref(step), x.data_ptr())
        return x

