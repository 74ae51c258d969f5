"""Native CPU kernels for decoding and the loss's softmax, compiled on first use from ``kernels.c``, called through
``ctypes``.

These jobs cost more through PyTorch's kernels than the memory they touch, because each op reads the same data
again or costs more in dispatch than in arithmetic (measured: docs/performance.md):

- beam search's per-row top-k: ``log_softmax`` writes a whole (N, V) tensor, then a blocked top-k reads it again;
  :func:`row_top` reads each row twice (max and best entries, then the exp-sum) and writes only (N, n);
- training's loss gradient, the softmax of a chunk of logits: ``log_softmax`` then ``exp_`` write and read a second
  (N, V) tensor with two exps per entry; :func:`softmax_lse_` turns the logits into their softmax in place, one exp
  per entry, each row in the caches after its first pass (:mod:`aiayn.accel.cpu.fused_loss`);
- one decoding step's attention: :func:`few_query_attention` reads every cached key and value once, grouped query
  heads included (the attention kernel seam, :func:`aiayn.accel.cpu.functional.cpu_attention_kernel`);
- a linear layer at a decoding step's few rows: :func:`rows_linear` streams the (column-major) weight once, each
  thread its own contiguous band of it, where oneDNN's and MKL's kernels read it at a lower rate
  (:meth:`aiayn.accel.cpu.packed.PackedLinear.plan` takes it for up to ``MAX_LINEAR_ROWS`` rows);
- a linear layer at many rows (batched beam search's batch x beams, an encoder's tokens) on CPUs with AVX2 but not
  AVX-512: :func:`panel_linear` multiplies by a copy of the weight packed once into panels, blocked for the caches
  with a 6 x 16 register block, where oneDNN's fp32 kernels are slower (:func:`panel_linear_preferred`).

Each kernel has a plain-PyTorch reference here (``*_reference``); tests hold the two equal. The library is built
with the C compiler ``$CC`` (default ``cc``) with ``-O3 -march=native`` and OpenMP, linked against the OpenMP runtime
torch loaded (so both share one thread pool), into a cache directory (``$XDG_CACHE_HOME/aiayn/native``, else
``~/.cache/aiayn/native``) keyed by the source, the flags, the compiler, the torch it links to and the CPU, once per
machine. Without a compiler, on a build failure, or with ``SETTINGS.native`` off (:mod:`aiayn.accel.cpu.settings`),
:func:`library` is None and callers keep their PyTorch paths: the kernels make decoding and the loss faster, never
different beyond float rounding, and draw no random numbers. Only fp32 CPU tensors come here (:func:`cpu_fp32`).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from aiayn.accel.cpu.settings import SETTINGS
from aiayn.nn.attention import scaled_dot_product_attention

SOURCES = (Path(__file__).with_name("kernels.c"),)
HEADERS = (Path(__file__).with_name("kernels.h"),)  # what the sources share
_I, _P, _F = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
_SIGNATURES = {
    "aiayn_row_top": [_P, _I, _I, _I, _P, _I, _P, _P, _P, _I],
    "aiayn_softmax_lse": [_P, _I, _I, _I, _P, _I],
    "aiayn_few_query_attention": [_P, _I, _I, _I, _P, _P, _I, _I, _I, _P, _I, _P, _I, _I, _P, _I, _I, _I,
                                  _I, _I, _I, _I, _I, _I, _F, _I],
    "aiayn_rows_linear": [_P, _I, _I, _I, _P, _I, _I, _P, _P, _I, _I, _I],
    "aiayn_int8_screen": [_P, _I, _I, _I, _P, _P, _I, _P, _I, _I],
    "aiayn_int8_rows_linear": [_P, _I, _I, _I, _P, _I, _P, _I, _P, _P, _I, _I, _I],
    "aiayn_pack_panels": [_P, _I, _I, _I, _I, _P, _I],
    "aiayn_panel_linear": [_P, _I, _I, _I, _P, _I, _P, _P, _I, _I, _P, _I],
}
_INT_RESULTS = {"aiayn_panel_width": [], "aiayn_panel_block_rows": []}  # functions returning an int64
#: the most rows (batch x beams) :func:`rows_linear` serves in a decoding step: up to here the product is bound by
#: reading the weight, which it streams faster than the oneDNN / MKL products (measured: docs/performance.md)
MAX_LINEAR_ROWS = 4
_lib: ctypes.CDLL | None = None
_tried = False
build_error: str | None = None  # why the last build failed, for diagnostics


def enabled() -> bool:
    """Whether the native kernels may be used (``SETTINGS.native``)."""
    return SETTINGS.native


def library() -> ctypes.CDLL | None:
    """The compiled kernels (built on first call, then loaded from the cache), or None where they cannot be had."""
    global _lib, _tried, build_error
    if not enabled():
        return None
    if not _tried:
        _tried = True
        try:
            _lib = _load(_build())
        except (OSError, subprocess.SubprocessError) as err:
            build_error, _lib = str(err), None
    return _lib


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "aiayn" / "native"


def _cpu_signature() -> str:
    """What ``-march=native`` depends on: the CPU's model and flags (Linux), else the platform's description."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return "\n".join(sorted({ln for ln in lines if ln.startswith(("model name", "flags"))}))
    except OSError:
        return platform.processor() + platform.machine()


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as ``/proc/cpuinfo`` names them (``avx2``, ``avx512_vnni``, ...); empty elsewhere."""
    return frozenset(flag for line in _cpu_signature().splitlines() if line.startswith("flags")
                     for flag in line.partition(":")[2].split())


def _build() -> Path:
    """Compile ``SOURCES`` into one library in the cache (once per source, flags, compiler and CPU); return its path."""
    cc = os.environ.get("CC", "cc")
    torch_lib = Path(torch.__file__).parent / "lib"
    variants = [["-fopenmp", f"-L{torch_lib}", f"-Wl,-rpath,{torch_lib}"], []]  # OpenMP if the compiler has it
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    source = b"\0".join(path.read_bytes() for path in (*SOURCES, *HEADERS))
    errors = []
    for extra in variants:
        flags = ["-O3", "-march=native", "-std=c11", "-ffp-contract=fast", "-shared", "-fPIC", *extra]
        key = hashlib.sha256(b"\0".join([source, " ".join(flags).encode(), version.encode(), str(torch_lib).encode(),
                                         _cpu_signature().encode(), sys.platform.encode()])).hexdigest()[:16]
        cache = _cache_dir()
        try:
            cache.mkdir(parents=True, exist_ok=True)
        except OSError:
            cache = Path(tempfile.gettempdir()) / "aiayn-native"
            cache.mkdir(parents=True, exist_ok=True)
        target = cache / f"kernels-{key}.so"
        if target.exists():
            return target
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=cache)
        os.close(fd)
        done = subprocess.run([cc, *flags, *map(str, SOURCES), "-o", tmp, "-lm"], capture_output=True, text=True,
                              timeout=120)
        if done.returncode == 0:
            os.replace(tmp, target)  # atomic: a concurrent build writes the same file
            return target
        os.unlink(tmp)
        errors.append(done.stderr.strip()[-2000:])
    raise OSError(f"could not compile {' and '.join(map(str, SOURCES))} with {cc}:\n" + "\n".join(errors))


def _load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    for name, args in {**_SIGNATURES, **_INT_RESULTS}.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, _I if name in _INT_RESULTS else None
    return lib


def cpu_fp32(*tensors: Tensor) -> bool:
    """Whether all ``tensors`` are fp32 CPU tensors outside autograd (what the kernels take)."""
    return all(t.device.type == "cpu" and t.dtype == torch.float32 and not (t.requires_grad and torch.is_grad_enabled())
               for t in tensors)


# ---------------------------------------------------------------------------------------------------- row top-n

def row_top_reference(logits: Tensor, n: int, banned: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Each row's n most likely allowed tokens and its log normalizer, in PyTorch.

    Args:
        logits: (N, V) float.
        n: 1 <= n <= V.
        banned: (V,) bool, True at ids never chosen (they still count in the normalizer), or None.
    Returns:
        log-probabilities (N, n) and ids (N, n) long, best first; the log-sum-exp of each row (N,).
    """
    lse = torch.logsumexp(logits.float(), dim=-1)  # (N,)
    log_probs = logits.float() - lse[:, None]
    if banned is not None:
        log_probs = log_probs.masked_fill(banned, float("-inf"))
    values, ids = log_probs.topk(n, dim=-1)
    return values, ids, lse


def row_top(logits: Tensor, n: int, banned: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`row_top_reference` by the native kernel (two passes over each row, nothing (N, V) written).

    Call only where :func:`library` is not None and ``logits`` is fp32 on the CPU (:func:`cpu_fp32`).
    ``banned``: (V,) bool or uint8, contiguous. Equal to the reference up to float rounding (about 1e-6
    relative in the normalizer); among equal log-probabilities the smaller id comes first.
    """
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    N, V = logits.shape
    if not 1 <= n <= V:
        raise ValueError(f"n={n} must be in [1, {V}]")
    values = logits.new_empty(N, n)
    ids = torch.empty(N, n, dtype=torch.long)
    lse = logits.new_empty(N)
    mask = 0 if banned is None else banned.data_ptr()
    library().aiayn_row_top(logits.data_ptr(), N, V, logits.stride(0), mask, n, values.data_ptr(), ids.data_ptr(),
                            lse.data_ptr(), torch.get_num_threads())
    return values, ids, lse


# ---------------------------------------------------------------------------------------- softmax in place

def softmax_lse_reference(x: Tensor) -> tuple[Tensor, Tensor]:
    """Each row's softmax and log-sum-exp, in PyTorch: x (N, V) float -> (softmax (N, V), lse (N,))."""
    lse = torch.logsumexp(x, dim=-1)  # (N,)
    return (x - lse[:, None]).exp(), lse


def softmax_lse_(x: Tensor) -> Tensor:
    """:func:`softmax_lse_reference` by the native kernel, in place: ``x`` (N, V) becomes its rows' softmax; returns
    their log-sum-exp (N,).

    Three passes over each row (its max, the exp-sum, the softmax written back), the row in the caches after the
    first; ``log_softmax`` then ``exp_`` write and read a second (N, V) tensor and take two exps per entry. Equal
    to the reference up to float rounding (about 2 ulp per exp). ``x``: fp32 on the CPU (:func:`cpu_fp32`), last
    dimension contiguous; call only where :func:`library` is not None.
    """
    if x.ndim != 2 or x.stride(-1) != 1:
        raise ValueError(f"softmax_lse_: x must be 2-D with a contiguous last dimension, got {tuple(x.shape)} with "
                         f"strides {x.stride()}")
    N, V = x.shape
    lse = x.new_empty(N)
    library().aiayn_softmax_lse(x.data_ptr(), N, V, x.stride(0), lse.data_ptr(), torch.get_num_threads())
    return lse


# ---------------------------------------------------------------------------------------------------- attention

def few_query_attention_reference(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    """A decoding step's attention in PyTorch (the reference backend of the one attention core): what
    :func:`few_query_attention` computes.

    Args:
        q: (B, H, T, Dh).
        k, v: (B, Hkv, S, Dh) with H a multiple of Hkv.
        mask: (B|1, S) bool, True = may attend, or None.
        scale: the score scale.
    Returns:
        (B, H, T, Dh); a query with no allowed key gives zeros.
    """
    mask = None if mask is None else mask[:, None, None, :]  # (B, 1, 1, S)
    return scaled_dot_product_attention(q, k, v, mask=mask, backend="reference", scale=scale)[0]


def few_query_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float,
                        out: Tensor | None = None) -> Tensor:
    """:func:`few_query_attention_reference` by the native kernel: each key and value read once.

    ``k`` and ``v`` must have the same strides, and every tensor a contiguous last dimension; ``mask`` (B|1, S) bool
    (any strides). ``out``: (B, H, T, Dh) to write into
    (any strides, last dimension contiguous), else a new contiguous tensor. Call only where :func:`library` is not
    None and the tensors are fp32 CPU tensors (:func:`cpu_fp32`).
    """
    B, H, T, D = q.shape
    _, Hkv, S, _ = k.shape
    if k.stride() != v.stride() or q.stride(-1) != 1 or k.stride(-1) != 1 or H % Hkv:
        raise ValueError("few_query_attention: keys and values need equal strides, a contiguous last dimension and "
                         "a head count that divides the query heads")
    if out is None:
        out = q.new_empty(B, H, T, D)
    if mask is None:
        m_ptr, m_sb, m_ss = 0, 0, 0
    else:
        mask = mask.expand(B, S)
        m_ptr, m_sb, m_ss = mask.data_ptr(), mask.stride(0), mask.stride(1)
    library().aiayn_few_query_attention(
        q.data_ptr(), q.stride(0), q.stride(1), q.stride(2), k.data_ptr(), v.data_ptr(), k.stride(0), k.stride(1),
        k.stride(2), 0, 0, m_ptr, m_sb, m_ss, out.data_ptr(), out.stride(0), out.stride(1), out.stride(2),
        B, H, Hkv, T, S, D, scale, torch.get_num_threads())
    return out


# ---------------------------------------------------------------------------------------------------- linear

ACTIVATIONS = {None: 0, "relu": 1, "gelu": 2}  # what rows_linear applies to its result, by name: the kernel's code


def _matrix_rows(x: Tensor, k: int, who: str) -> Tensor:
    """x (..., k) as the (rows, k) matrix with a contiguous last dimension the linear kernels take (a view where it
    can be); ``who`` names the kernel in the error for another width."""
    if x.shape[-1] != k:
        raise ValueError(f"{who}: x (..., {k}) needed, got {tuple(x.shape)}")
    x2 = x if x.dim() == 2 else x.reshape(-1, k)
    return x2 if x2.stride(1) == 1 else x2.contiguous()


def _row_stride(x: Tensor, k: int, who: str) -> int | None:
    """The distance between consecutive rows of x (..., k) seen as a (rows, k) matrix with a contiguous last
    dimension, when x is laid out as one (a kernel then reads x itself: no reshape, no copy); None when it is not.
    ``who`` names the kernel in the error for another width."""
    if x.shape[-1] != k:
        raise ValueError(f"{who}: x (..., {k}) needed, got {tuple(x.shape)}")
    if x.stride(-1) != 1 and k > 1:
        return None
    row = span = None
    for d in range(x.dim() - 2, -1, -1):  # the innermost dimension of more than one sets the row stride; each
        if x.shape[d] == 1:               # outer one steps over the rows inside it
            continue
        if span is None:
            row = span = x.stride(d)
        elif x.stride(d) != span:
            return None
        span *= x.shape[d]
    return k if row is None else row


def _rows_product(x: Tensor, k: int, n: int, who: str) -> tuple[Tensor, int, int, Tensor]:
    """x (..., k) as the kernels take it, and the output they write: (x or a (rows, k) copy, its row stride, rows,
    a new (..., n) output). A decoding step's input is laid out as rows already, and then this is one operation."""
    stride = _row_stride(x, k, who)
    if stride is None:
        x = _matrix_rows(x, k, who)
        stride = x.stride(0)
    rows = x.numel() // k if k else 0
    return x, stride, rows, x.new_empty((*x.shape[:-1], n))


def rows_linear_reference(x: Tensor, wt: Tensor, bias: Tensor | None = None, activation: str | None = None) -> Tensor:
    """``F.linear`` by the transposed weight, then ``activation``: what :func:`rows_linear` computes.

    Args:
        x: (..., K).
        wt: (K, N), the transpose of an (N, K) ``nn.Linear`` weight.
        bias: (N,) or None.
        activation: None, "relu" or "gelu" (exact, erf-based, as ``F.gelu``).
    Returns:
        (..., N).
    """
    y = torch.nn.functional.linear(x, wt.t(), bias)
    return {None: y, "relu": y.relu(), "gelu": torch.nn.functional.gelu(y)}[activation]


def rows_linear(x: Tensor, wt: Tensor, bias: Tensor | None = None, activation: str | None = None) -> Tensor:
    """:func:`rows_linear_reference` by the native kernel, for a few rows (the weight is read once); the same as
    ``rows_linear_plan(wt, bias, activation)(x)``."""
    return rows_linear_plan(wt, bias, activation)(x)


def rows_linear_plan(wt: Tensor, bias: Tensor | None = None,
                     activation: str | None = None) -> Callable[[Tensor], Tensor]:
    """:func:`rows_linear` for a fixed weight, as a function x (..., K) -> (..., N) with the weight's arguments bound
    once (a decoding step calls each layer's product every step, and binding saves most of a call's overhead).

    ``wt`` (K, N) needs contiguous rows (``wt.stride(1) == 1``: the weight stored column-major, as
    :func:`aiayn.accel.cpu.layout.column_major_linears` leaves it); ``bias`` (N,) contiguous. The function holds
    both, and reads them at each call: in-place changes are seen, but not a replaced weight. Call only where
    :func:`library` is not None and the tensors are fp32 CPU tensors (:func:`cpu_fp32`). Equal to the reference up
    to float rounding (GELU's erf to about 1.5e-7).
    """
    K, N = wt.shape
    if wt.stride(1) != 1 or (bias is not None and (bias.shape != (N,) or bias.stride(0) != 1)):
        raise ValueError(f"rows_linear: wt ({K}, {N}) with contiguous rows and bias ({N},) needed; got wt strides "
                         f"{wt.stride()}, bias {None if bias is None else tuple(bias.shape)}")
    kernel, act = library().aiayn_rows_linear, ACTIVATIONS[activation]
    w_ptr, w_sk, b_ptr = wt.data_ptr(), wt.stride(0), 0 if bias is None else bias.data_ptr()
    held = (wt, bias)  # kept alive with the pointers above

    def run(x: Tensor) -> Tensor:
        x2, stride, rows, y = _rows_product(x, K, N, "rows_linear")
        kernel(x2.data_ptr(), stride, rows, K, w_ptr, w_sk, N, b_ptr, y.data_ptr(), N, act, torch.get_num_threads())
        return y if y.dim() == x.dim() else y.view(*x.shape[:-1], N)

    run.held = held  # type: ignore[attr-defined]
    return run


# ----------------------------------------------------------------------------------------------- int8 rows linear

def int8_rows_linear_reference(x: Tensor, q: Tensor, scales: Tensor, bias: Tensor | None = None,
                               activation: str | None = None) -> Tensor:
    """A linear layer whose weight is int8 with a scale per output, on fp32 inputs (weight-only quantization):
    ``activation(x (q * scales[:, None])^T + bias)``; what :func:`int8_rows_linear` computes.

    Args:
        x: (..., K) float32.
        q: (N, K) int8.
        scales: (N,) float32, one per output.
        bias: (N,) or None.
        activation: None, "relu" or "gelu" (exact, erf-based, as ``F.gelu``).
    Returns:
        (..., N) float32.
    """
    return rows_linear_reference(x, (q.to(x.dtype) * scales[:, None].to(x.dtype)).t(), bias, activation)


def int8_rows_linear(x: Tensor, q: Tensor, scales: Tensor, bias: Tensor | None = None,
                     activation: str | None = None) -> Tensor:
    """:func:`int8_rows_linear_reference` by the native kernel, for a decoding step's few rows (the int8 weight, a
    quarter of an fp32 weight's bytes, is read once; x stays fp32); the same as
    ``int8_rows_linear_plan(q, scales, bias, activation)(x)``."""
    return int8_rows_linear_plan(q, scales, bias, activation)(x)


def int8_rows_linear_plan(q: Tensor, scales: Tensor, bias: Tensor | None = None,
                          activation: str | None = None) -> Callable[[Tensor], Tensor]:
    """:func:`int8_rows_linear` for a fixed weight, as a function x (..., K) -> (..., N) with the weight's arguments
    bound once (as :func:`rows_linear_plan`), carrying its ``native_product`` (INT8_ROWS_KIND) for the native
    decoder layers.

    ``q`` (N, K) int8 with contiguous rows, ``scales`` (N,) fp32 contiguous, ``bias`` (N,) fp32 contiguous or None;
    the function holds them. Call only where :func:`library` is not None. Each weight value widens to fp32 exactly
    and the sums are fp32, so the result equals the reference up to float rounding.
    """
    N, K = q.shape
    if (q.dtype != torch.int8 or q.stride(1) != 1 or scales.shape != (N,) or scales.dtype != torch.float32
            or scales.stride(0) != 1
            or (bias is not None and (bias.shape != (N,) or bias.stride(0) != 1 or bias.dtype != torch.float32))):
        raise ValueError(f"int8_rows_linear: q ({N}, {K}) int8 with contiguous rows, scales ({N},) and bias ({N},) "
                         f"contiguous fp32 needed; got q {q.dtype} strides {q.stride()}, scales "
                         f"{tuple(scales.shape)} {scales.dtype}, bias {None if bias is None else tuple(bias.shape)}")
    kernel, act = library().aiayn_int8_rows_linear, ACTIVATIONS[activation]
    q_ptr, q_sn, s_ptr, b_ptr = q.data_ptr(), q.stride(0), scales.data_ptr(), 0 if bias is None else bias.data_ptr()
    held = (q, scales, bias)  # kept alive with the pointers above

    def run(x: Tensor) -> Tensor:
        x2, stride, rows, y = _rows_product(x, K, N, "int8_rows_linear")
        kernel(x2.data_ptr(), stride, rows, K, q_ptr, q_sn, s_ptr, N, b_ptr, y.data_ptr(), N, act,
               torch.get_num_threads())
        return y if y.dim() == x.dim() else y.view(*x.shape[:-1], N)

    run.held = held  # type: ignore[attr-defined]
    return run


# ---------------------------------------------------------------------------------------------------- panel linear

#: where :func:`panel_linear_preferred`, PackedLinear takes :func:`panel_linear` from this many rows (below, a
#: step's few rows go to :func:`rows_linear`) and from PANEL_MIN_MACS multiply-adds (rows x in x out)
PANEL_MIN_ROWS = MAX_LINEAR_ROWS + 1
PANEL_MIN_MACS = 1 << 16
#: ... and from two rows for layers at least this wide in and out, where panels beat rows_linear on a beam's few
#: rows; narrower layers keep 1-4 rows on rows_linear (measured: docs/performance.md)
PANEL_FEW_ROWS_MIN_FEATURES = 512


class _Scratch(threading.local):
    def __init__(self) -> None:
        self.buffers: dict[str, Tensor] = {}  # "x": panel_linear's packed input; "w": panel_linear_once's weight block


_scratch = _Scratch()


def _kept_floats(name: str, floats: int) -> int:
    """The address of this thread's buffer ``name``, at least ``floats`` long: kept and grown as needed (a fresh
    allocation of that size would cost page faults at every call), freed with the thread."""
    buf = _scratch.buffers.get(name)
    if buf is None or buf.numel() < floats:
        buf = _scratch.buffers[name] = torch.empty(max(floats, 1))
    return buf.data_ptr()


def _packed_x_scratch(m: int, k: int, block_rows: int) -> int:
    """:func:`_kept_floats` for :func:`panel_linear`'s packed input: ``m`` rows rounded up to whole register blocks
    of ``block_rows`` (:func:`_panel_shape`, bound once by the caller), times ``k``."""
    return _kept_floats("x", -(-m // block_rows) * block_rows * k)


def _check_panel_bias(bias: Tensor | None, n: int, who: str) -> None:
    """A panel product's bias must be (n,) contiguous (or None)."""
    if bias is not None and (bias.shape != (n,) or bias.stride(0) != 1):
        raise ValueError(f"{who}: bias ({n},) contiguous needed, got {tuple(bias.shape)} strides {bias.stride()}")


def panel_linear_preferred() -> bool:
    """Whether fp32 products of more than ``MAX_LINEAR_ROWS`` rows go to :func:`panel_linear`: on CPUs where torch
    runs its AVX2 kernels (AVX2 without AVX-512, where oneDNN's fp32 kernels are slower than the panels), with the
    kernels built and on."""
    return torch.backends.cpu.get_cpu_capability() == "AVX2" and library() is not None


def panel_width() -> int:
    """Output columns per panel of :func:`pack_panels` (16 with AVX2, 32 with AVX-512)."""
    return _panel_shape()[0]


@functools.cache
def _panel_shape() -> tuple[int, int]:
    """The compiled library's panel constants, asked once: (output columns per panel, rows of x per register block;
    :func:`panel_linear`'s scratch holds the rows rounded up to whole blocks)."""
    lib = library()
    return int(lib.aiayn_panel_width()), int(lib.aiayn_panel_block_rows())


def pack_panels(weight: Tensor) -> Tensor:
    """An (N, K) fp32 ``nn.Linear`` weight (any strides) packed for :func:`panel_linear`: (ceil(N / W) * W * K,)
    with W = :func:`panel_width`, panel p holding outputs p W .. p W + W - 1 as K rows of W floats (zeros past N).
    Call only where :func:`library` is not None."""
    n, k = weight.shape
    w = panel_width()
    out = weight.new_empty((n + w - 1) // w * w * k)
    library().aiayn_pack_panels(weight.data_ptr(), weight.stride(0), weight.stride(1), n, k, out.data_ptr(),
                                torch.get_num_threads())
    return out


def panel_linear_reference(x: Tensor, weight: Tensor, bias: Tensor | None = None,
                           activation: str | None = None) -> Tensor:
    """``F.linear`` then ``activation``: what :func:`panel_linear` computes. x (..., K), weight (N, K), bias (N,)
    or None -> (..., N)."""
    return rows_linear_reference(x, weight.t(), bias, activation)


def panel_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, activation: str | None = None) -> Tensor:
    """:func:`panel_linear_reference` by the native kernel; ``panel_linear_plan(weight, bias, activation)(x)``."""
    return panel_linear_plan(weight, bias, activation)(x)


def panel_linear_plan(weight: Tensor, bias: Tensor | None = None, activation: str | None = None,
                      packed: Tensor | None = None) -> Callable[[Tensor], Tensor]:
    """:func:`panel_linear` for a fixed weight (N, K) as a function x (..., K) -> (..., N), any number of rows. It
    multiplies by ``packed``, which must be :func:`pack_panels` of ``weight`` (a caller that keeps one across
    plans passes it), or by a copy packed now; either way later changes to ``weight`` are not seen.

    The kernel blocks the product like BLIS: each thread takes its own band of panels; a slice of 512 inputs of one
    panel stays in L1 while every 6-row block of x (packed per call) is multiplied by it in registers, 6 x 16 sums
    (AVX2). ``bias`` (N,) contiguous is read at each call. Call only where :func:`library` is not None and the
    tensors are fp32 CPU tensors (:func:`cpu_fp32`). Equal to the reference up to float rounding (the sums in
    another order; GELU's erf to about 1.5e-7).
    """
    n, k = weight.shape
    _check_panel_bias(bias, n, "panel_linear")
    width, block_rows = _panel_shape()
    if packed is None:
        packed = pack_panels(weight.detach())
    elif packed.numel() != (n + width - 1) // width * width * k:
        raise ValueError(f"panel_linear: packed holds {packed.numel()} floats, not pack_panels of a ({n}, {k}) weight")
    lib, act = library(), ACTIVATIONS[activation]
    kernel, p_ptr, b_ptr = lib.aiayn_panel_linear, packed.data_ptr(), 0 if bias is None else bias.data_ptr()

    def run(x: Tensor) -> Tensor:
        x2, stride, m, y = _rows_product(x, k, n, "panel_linear")
        kernel(x2.data_ptr(), stride, m, k, p_ptr, n, b_ptr, y.data_ptr(), n, act,
               _packed_x_scratch(m, k, block_rows), torch.get_num_threads())
        return y if y.dim() == x.dim() else y.view(*x.shape[:-1], n)

    run.held = (packed, bias)  # type: ignore[attr-defined]
    return run


#: :func:`panel_linear_once` packs a weight this many floats at a time (whole panels; 8 MiB): the block is
#: multiplied while it is still in the last-level cache, and the thread's workspace stays that small however large
#: the weight (a 50257 x 768 output layer would take 154 MiB at once)
PANEL_ONCE_BLOCK_FLOATS = 1 << 21


def panel_linear_once(x: Tensor, weight: Tensor, bias: Tensor | None = None, out: Tensor | None = None) -> Tensor:
    """:func:`panel_linear_reference` (no activation) for a weight that changes between calls, as a training
    step's are: packed block by block of ``PANEL_ONCE_BLOCK_FLOATS`` into a workspace this thread keeps, each block
    multiplied right after it is packed; nothing is kept that a later change to ``weight`` could make stale.

    Args:
        x: (..., K) fp32 CPU.
        weight: (N, K) fp32 CPU, any strides.
        bias: (N,) contiguous, or None.
        out: (rows, N) with contiguous rows (``out.stride(1) == 1``) to write into, or None for a new tensor.
    Returns:
        (..., N), or ``out``. Call only where :func:`library` is not None. Equal to the reference up to float
        rounding (the sums in another order).
    """
    n, k = weight.shape
    x2 = _matrix_rows(x, k, "panel_linear_once")
    m = x2.shape[0]
    _check_panel_bias(bias, n, "panel_linear_once")
    if out is None:
        y = x2.new_empty(m, n)
    elif out.shape != (m, n) or out.stride(1) != 1:
        raise ValueError(f"panel_linear_once: out ({m}, {n}) with contiguous rows needed, got {tuple(out.shape)} "
                         f"strides {out.stride()}")
    else:
        y = out
    width, block_rows = _panel_shape()
    cols = max(width, PANEL_ONCE_BLOCK_FLOATS // max(k, 1) // width * width)  # outputs a block, whole panels
    cols = min(cols, -(-n // width) * width)
    lib, threads, size = library(), torch.get_num_threads(), x2.element_size()
    w_ptr, (w_sn, w_sk) = weight.data_ptr(), weight.stride()
    packed, scratch = _kept_floats("w", cols * k), _packed_x_scratch(m, k, block_rows)
    for n0 in range(0, n, cols):
        nb = min(cols, n - n0)
        lib.aiayn_pack_panels(w_ptr + n0 * w_sn * size, w_sn, w_sk, nb, k, packed, threads)
        lib.aiayn_panel_linear(x2.data_ptr(), x2.stride(0), m, k, packed, nb,
                               0 if bias is None else bias.data_ptr() + n0 * size, y.data_ptr() + n0 * size,
                               y.stride(0), 0, scratch, threads)
    if out is not None:
        return out
    return y if x.dim() == 2 else y.view(*x.shape[:-1], n)


# ---------------------------------------------------------------------------------------------------- int8 screen

def int8_screen_reference(x: Tensor, q: Tensor, scales: Tensor) -> Tensor:
    """Rows times an int8 weight with row scales, in PyTorch: x (M, D) float, q (V, D) int8, scales (V,) ->
    (M, V) in x's dtype, ``(x @ q.T) * scales``."""
    return (x @ q.to(x.dtype).T) * scales


def int8_screen(x: Tensor, q: Tensor, scales: Tensor) -> Tensor:
    """:func:`int8_screen_reference` by the native kernel, reading the int8 weight once per row (a quarter of an fp32
    weight's bytes): greedy search's int8 screen (:mod:`aiayn.accel.cpu.screened_argmax`) where torch's own int8
    kernel is not vectorized.

    ``x``: (M, D) fp32, contiguous last dimension (any M; built for greedy search's one to a few rows: each group of
    four weight rows is read from memory once and then from the cache for every input row); ``q``: (V, D) int8,
    contiguous; ``scales``: (V,) fp32, contiguous. The int8 values widen to fp32 exactly; the sums are fp32 (each
    product fused into them where the CPU has FMA), in another order than the reference's. Call only where
    :func:`library` is not None.
    """
    m, d = x.shape
    if not (x.stride(1) == 1 and q.is_contiguous() and q.dtype == torch.int8
            and q.shape[1] == d and scales.is_contiguous() and scales.dtype == torch.float32
            and scales.shape == (q.shape[0],)):
        raise ValueError(f"native int8 screen: x {tuple(x.shape)} (contiguous rows), "
                         f"q {tuple(q.shape)} {q.dtype} (contiguous int8, as wide as x) and scales "
                         f"{tuple(scales.shape)} {scales.dtype} (one fp32 per row of q) do not fit")
    out = x.new_empty(m, q.shape[0])
    library().aiayn_int8_screen(x.data_ptr(), x.stride(0), m, d, q.data_ptr(), scales.data_ptr(), q.shape[0],
                                out.data_ptr(), out.stride(0), torch.get_num_threads())
    return out
