"""Greedy decoding's argmax over a large fp32 output layer, reading a half or a quarter of the bytes, exactly.

At batch 1 a greedy step of a decoder-only model on CPU is bound by memory bandwidth, and its largest read is the
output layer: 384 x 50257 fp32 weights (77 MB) in the GPT-2-like benchmark model, more than the decoder's other
layers together (42 MB) and more than the CPU's cache. Greedy search needs the argmax of the logits, not the
logits. :class:`GreedyHead` finds it in two passes:

1. **Screen.** Multiply the hidden state, scaled to unit length, by a half-precision copy of the weight (half the
   bytes), or at one row on AVX-512 CPUs an int8 copy (a quarter). (A positive scale leaves the argmax alone and
   keeps every fp16 value in range.) Each screened logit s_i
   is within E of the exactly scaled logit l_i / |h|. So the argmax can only be a token with
   s_i >= max_j s_j - 2E: the *candidates*, usually one to a few (:func:`candidates` finds them from block maxima,
   one pass over the screened logits).
2. **Confirm.** The candidates' logits in fp32, from the fp32 weight rows and the unscaled hidden state. The
   largest wins; the lowest id wins ties, as with ``Tensor.argmax``. A row with a single candidate needs no
   confirming: nothing else can win.

The result equals the argmax of the fp32 logits. Two fp32 products of the same numbers can differ in their
last bit, so near-exact ties may resolve either way, as between any two fp32 kernels.

**The bound.** u is the screen dtype's unit roundoff (2^-11 for fp16, 2^-8 for bf16) and u' = 2^-24 fp32's. D
is the hidden width and m the largest row norm of the weight. The rounding errors are:

- the unit-length input, rounded to fp32, then to the screen dtype: (u' + u) m;
- the weight row in the screen dtype: u m;
- the fp32 sum of D products: D u' m;
- the result, rounded to the screen dtype: u m;
- subnormals: at most 2^-25 absolute per fp16 value (2^-134 in bf16), so sqrt(D) 2^-25 (m + 1) over the input
  and the weight;
- second-order terms.

:func:`screen_bound` takes E = (4u + 2Du') m + 4 sqrt(D) 2^-25 (m + 1) (2^-134 in bf16), which covers the sum
with room to spare.

This assumes the half-precision product accumulates in fp32, as torch's CPU fp16 kernel and oneDNN's bf16
kernels do. The tests check it on the host: same-sign sums, whose accumulation error is largest.

**The int8 screen.** Each weight row i is rounded to int8 times a bf16 scale s_i >= max_j |w_ij| / 127, and the
unit-length input to bf16; torch's weight-only int8 product (``aten._weight_int8pack_mm``, the kernel gpt-fast's
int8 mode uses) multiplies them in fp32 (q_ij s_i is exact there: 7 by 8 significant bits), sums in fp32 and
rounds the result to bf16. With u = 2^-8 (bf16), Delta the largest distance between a row and its int8 version
(measured when the copy is made) and m' = m + Delta, the errors are: the input in bf16, u m'; the rounding of the
weight, at most |x| Delta by Cauchy-Schwarz; the fp32 sum, D u' m'; the result in bf16, u m'.
:func:`int8_screen_bound` takes E = (1 + u)^2 ((2u + 2Du') m' + Delta) plus a subnormal term. Delta is about
sqrt(D / 12) s, so the window is several times the fp16 screen's and grows with the width: still a small
confirming product at a few hundred columns, but often more than ``MAX_CANDIDATES`` candidates at a thousand. The
kernel is fast only on AVX-512 (elsewhere it is scalar) and its rate drops above 512 columns, so only layers up to
``INT8_MAX_WIDTH`` columns are screened in int8.

**Which screen, when.** Only where a screen pays: CPU, an fp32 bias-free output layer (:func:`screen_dtype`):

- one row on AVX-512 (:func:`int8_screen_available`), a width that is a multiple of 16 and at most 512: int8, from
  ``MIN_INT8_SCREENED_WEIGHTS`` weights;
- one row elsewhere: fp16 (``F.linear``), from ``MIN_FP16_SCREENED_WEIGHTS[1]`` weights;
- two rows or more, where the CPU multiplies bf16 natively (AVX512-BF16 or AMX): oneDNN's prepacked bf16 kernel,
  from ``MIN_BF16_SCREENED_WEIGHTS``;
- two rows elsewhere: fp16 from ``MIN_FP16_SCREENED_WEIGHTS[2]``; more rows elsewhere are not screened.

torch's fp16 product on CPU costs about one weight pass per row, while the packed kernels read the weight once
for all rows, which is why fp16 screens stop at two rows and bf16 screens serve more (measured:
docs/performance.md, ``bench/decode_kernels.py``, ``bench/greedy_screen.py``).

Elsewhere, and for any row the screen cannot settle (no candidate, as with NaN input, or more than
``MAX_CANDIDATES``), the full fp32 logits are computed.

**How many candidates.** The window 2E grows with the largest row norm of the weight, and in logit units with
the hidden state's norm too: 2E |h| is about 8u m |h|, where m |h| bounds every logit. Random weights and small
trained models leave a few candidates per row (``bench/greedy_screen.py --checkpoint`` counts them for a
checkpoint), but a model whose m |h| is much larger widens the window in proportion, bf16's 8 times as much as
fp16's. So after ``GreedyHead.MAX_FAILED_SCREENS``
screens in a row that do not settle, a head stops screening for the rest of its generation.

**Memory.** The copy is made once per weight and screen dtype, and kept until the weight changes or is freed:
38.6 MB for the GPT-2-like model. ``SETTINGS.screened_argmax`` (:mod:`aiayn.accel.cpu.settings`) turns the screen
off.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.accel.cpu import native
from aiayn.accel.cpu.packed import onednn_bf16_available, pack_weight, packed_linear, weight_state
from aiayn.accel.cpu.settings import SETTINGS
from aiayn.accel.cpu.topk import row_argmax
from aiayn.models.heads import next_scores

#: rows -> the fewest output-layer weights (vocabulary x width) worth an fp16 screen; fp16's CPU product costs a
#: weight pass per row, so a second row needs a larger layer, and more rows never pay (see the module docstring)
MIN_FP16_SCREENED_WEIGHTS = {1: 1 << 22, 2: 1 << 23}
#: the fewest weights worth a bf16 screen (from two rows up, where the CPU multiplies bf16 natively)
MIN_BF16_SCREENED_WEIGHTS = 1 << 22
#: the fewest weights worth an int8 screen (one row, where torch's int8 kernel has its AVX-512 form)
MIN_INT8_SCREENED_WEIGHTS = 2_000_000
#: the fewest weights worth an int8 screen through aiayn's native kernel (CPUs without AVX-512): below it the fp32
#: product through the native few-row kernel is faster than screening (measured: docs/performance.md)
MIN_NATIVE_INT8_SCREENED_WEIGHTS = 1 << 23
#: the widest output layer screened in int8: the int8 kernel's rate drops above it, and the int8 window grows with
#: the width (at a thousand columns too many candidates for the screen to pay)
INT8_MAX_WIDTH = 512
INT8_ALIGN = 16  # the int8 kernel reads 16 columns at a time with aligned loads: widths must be multiples of 16
MAX_CANDIDATES = 64  # per row; a row with more gets its full fp32 logits
_BLOCK = 128  # columns per block of the candidate search
_FP16_MAX = 65504.0
#: each screen dtype's unit roundoff, and the largest rounding error of a value in its subnormal range
UNIT_ROUNDOFF = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}  # (an int8 screen's inputs and results: bf16)
SUBNORMAL_ERROR = {torch.float16: 2.0 ** -25, torch.bfloat16: 2.0 ** -134}


class Screen(NamedTuple):
    """A low-precision copy of an output layer's weight and the bound of its screened logits.

    Attributes:
        weight: (V, D) fp16 or int8, or oneDNN's prepacked bf16 copy (:func:`aiayn.accel.cpu.packed.pack_weight`).
        dtype: ``torch.float16``, ``torch.bfloat16`` or ``torch.int8``.
        bound: E: every screened logit of a unit-length input is within E of the exact one.
        scales: (V,) the int8 screen's scale of each row: bf16 for torch's kernel, fp32 (the same values) for the
            native one (:func:`int8_screen_kernel`); None for the others.
    """

    weight: Tensor
    dtype: torch.dtype
    bound: float
    scales: Tensor | None = None


def screen_bound(max_row_norm: float, width: int, dtype: torch.dtype = torch.float16) -> float:
    """E for screening in ``dtype`` a weight whose rows have norms of at most ``max_row_norm`` and ``width``
    columns (the derivation is in the module docstring)."""
    u, u32 = UNIT_ROUNDOFF[dtype], 2.0 ** -24
    subnormal = 4 * math.sqrt(width) * SUBNORMAL_ERROR[dtype] * (max_row_norm + 1)
    return (4 * u + 2 * width * u32) * max_row_norm + subnormal


def int8_screen_bound(max_row_norm: float, max_error_norm: float, width: int, io_roundoff: float = 2.0 ** -8) -> float:
    """E for an int8 screen: int8 weight rows times row scales (their largest distance from the fp32 rows
    ``max_error_norm``), fp32 sums of ``width`` products, the input and the results rounded with unit roundoff
    ``io_roundoff``: bf16's for torch's kernel, fp32's (2^-24) for the native one (derivation in the module
    docstring)."""
    u, u32 = io_roundoff, 2.0 ** -24
    m = max_row_norm + max_error_norm  # bounds every dequantized row's norm
    subnormal = 4 * math.sqrt(width) * SUBNORMAL_ERROR[torch.bfloat16] * (m + 1)
    return (1 + u) ** 2 * ((2 * u + 2 * width * u32) * m + max_error_norm) + subnormal


@functools.cache
def _torch_int8_kernel() -> bool:
    return torch.backends.cpu.get_cpu_capability() == "AVX512" and hasattr(torch.ops.aten, "_weight_int8pack_mm")


def int8_screen_kernel() -> str | None:
    """Which int8 screen product this CPU has: ``"torch"``, torch's weight-only int8 product
    (``aten._weight_int8pack_mm``: bf16 input, fp32 sums, bf16 results) where it runs its AVX-512 form; else
    ``"native"``, :func:`aiayn.accel.cpu.native.int8_screen` (fp32 input, sums and results), where the native
    kernels are built and on (``SETTINGS.native``); else None (torch's kernel is scalar elsewhere)."""
    if _torch_int8_kernel():
        return "torch"
    return "native" if native.library() is not None else None


def int8_screen_available() -> bool:
    """Whether this CPU has a fast int8 screen product (:func:`int8_screen_kernel`)."""
    return int8_screen_kernel() is not None


def _int8_screen(weight: Tensor) -> Screen | None:
    """The int8 screen of a (V, D) fp32 weight (D a multiple of ``INT8_ALIGN``, at most ``INT8_MAX_WIDTH``): each
    row rounded to int8 times a bf16 scale of at least its largest magnitude / 127; None if the weight is not
    finite."""
    w = weight.detach().double()
    m = float(torch.linalg.vector_norm(w, dim=1).max())
    if not math.isfinite(m):
        return None
    amax = w.abs().amax(dim=1)
    # bf16 rounds within 2^-9 relative, so amax / 126.5 rounds to at least amax / 127: |w / scale| <= 127
    scales = torch.where(amax > 1e-30, amax / 126.5, 1.0).to(torch.bfloat16)
    s = scales.double()[:, None]
    q = torch.round(w / s).clamp_(-127, 127)
    error = float(torch.linalg.vector_norm(w - q * s, dim=1).max())  # q * s is exact in fp32, as the kernel has it
    q8 = q.to(torch.int8, memory_format=torch.contiguous_format)  # (the weight may be column-major)
    if int8_screen_kernel() == "native":  # the same scales in fp32, exactly; fp32 input and results
        return Screen(q8, torch.int8, int8_screen_bound(m, error, w.shape[1], 2.0 ** -24), scales.float())
    return Screen(q8, torch.int8, int8_screen_bound(m, error, w.shape[1]), scales)


def make_screen(weight: Tensor, dtype: torch.dtype = torch.float16) -> Screen | None:
    """The fp16, (prepacked) bf16 or int8 screen of a (V, D) fp32 weight; None if its rows are too long for fp16's
    range (or not finite)."""
    with torch.no_grad():
        if dtype == torch.int8:
            return _int8_screen(weight)
        m = float(torch.linalg.vector_norm(weight, dim=1).max())
        if not math.isfinite(m) or m > _FP16_MAX / 4:  # a unit-length input's logits stay below m
            return None
        if dtype == torch.bfloat16:
            copy = pack_weight(weight.to(torch.bfloat16, memory_format=torch.contiguous_format))
        else:
            copy = weight.to(torch.float16, memory_format=torch.contiguous_format)
        return Screen(copy, dtype, screen_bound(m, weight.shape[1], dtype))


def screen_dtype(rows: int, weights: int, width: int | None = None) -> torch.dtype | None:
    """Which screen pays for ``rows`` rows times an fp32 output layer of ``weights`` weights (``width`` columns;
    None: any up to ``INT8_MAX_WIDTH``) on this CPU, if any: int8 at one row where torch's int8 kernel has its AVX-512
    form (:func:`int8_screen_kernel`) and the width is a multiple of ``INT8_ALIGN`` up to ``INT8_MAX_WIDTH``, else
    fp16 at one row (and two without native bf16), oneDNN's prepacked bf16 from two rows up where the CPU multiplies
    bf16 natively (:func:`aiayn.accel.cpu.packed.onednn_bf16_available`). Where the int8 kernel is aiayn's native
    one (CPUs without AVX-512), only int8 at one row, from ``MIN_NATIVE_INT8_SCREENED_WEIGHTS``: there the fp32
    product goes through the native few-row kernel too, which no fp16 screen beats. See the module docstring."""
    kernel = int8_screen_kernel()
    if kernel == "native":  # the fp32 product streams the weight through the native few-row kernel: only int8 pays
        fits = width is None or width <= INT8_MAX_WIDTH
        return torch.int8 if rows == 1 and weights >= MIN_NATIVE_INT8_SCREENED_WEIGHTS and fits else None
    if (kernel == "torch" and rows == 1 and weights >= MIN_INT8_SCREENED_WEIGHTS
            and (width is None or (width <= INT8_MAX_WIDTH and width % INT8_ALIGN == 0))):
        return torch.int8
    if rows == 1 or (rows == 2 and not onednn_bf16_available()):
        return torch.float16 if weights >= MIN_FP16_SCREENED_WEIGHTS[rows] else None
    if onednn_bf16_available() and weights >= MIN_BF16_SCREENED_WEIGHTS:
        return torch.bfloat16
    return None


def screened_logits(h: Tensor, screen: Screen) -> Tensor:
    """h (N, D) fp32, scaled to unit length, times the screen's weight: (N, V) in the screen's dtype (bf16 for
    an int8 screen)."""
    unit = h / torch.linalg.vector_norm(h, dim=1, keepdim=True)
    if screen.dtype == torch.int8:
        if screen.scales.dtype == torch.float32:  # the native kernel's screen (_int8_screen)
            # (the kernels switched off since the screen was made: their reference, slowly)
            product = native.int8_screen if native.library() is not None else native.int8_screen_reference
            return product(unit, screen.weight, screen.scales)
        return torch.ops.aten._weight_int8pack_mm(unit.to(torch.bfloat16), screen.weight, screen.scales)
    unit = unit.to(screen.dtype)
    if screen.dtype == torch.bfloat16:
        return packed_linear(unit, screen.weight)
    return F.linear(unit, screen.weight)


def candidates(s: Tensor, margin: float, block: int = _BLOCK) -> tuple[Tensor, Tensor]:
    """Every entry of each row of ``s`` (N, V) within ``margin`` of the row's maximum, as (row, column) pairs.

    One pass over ``s`` takes the maxima of its blocks of ``block`` columns; only the blocks that reach the
    row's maximum minus ``margin`` are searched. A NaN row has no pair.

    Returns:
        rows (M,) and cols (M,) long, in no particular order.
    """
    n, v = s.shape
    n_blocks = v // block
    body = n_blocks * block
    blocks = s[:, :body].reshape(n, n_blocks, block)
    block_max = blocks.amax(dim=-1) if n_blocks else s.new_full((n, 0), float("-inf"))  # (N, n_blocks)
    tail = s[:, body:]  # (N, V - body): fewer than `block` columns
    maxima = [block_max] + ([tail] if body < v else [])
    top = torch.stack([m.amax(dim=1) for m in maxima if m.shape[1]]).amax(dim=0)[:, None]  # (N, 1)
    floor = top.float() - margin  # (N, 1)
    r, b = (block_max >= floor).nonzero().unbind(1)  # (P,) the (row, block) pairs worth searching
    pr, pc = (blocks[r, b] >= floor.index_select(0, r)).nonzero().unbind(1)
    rows, cols = r.index_select(0, pr), b.index_select(0, pr) * block + pc
    if body < v:
        tr, tc = (tail >= floor).nonzero().unbind(1)
        rows, cols = torch.cat([rows, tr]), torch.cat([cols, tc + body])
    return rows, cols


def screened_argmax(h: Tensor, weight: Tensor, screen: Screen, banned: Tensor | None = None,
                    max_candidates: int = MAX_CANDIDATES) -> Tensor | None:
    """The argmax of ``h @ weight.T`` per row, banned columns excluded, found through ``screen``.

    Args:
        h: (N, D) fp32 hidden states.
        weight: (V, D) fp32 output layer (the fp32 rows confirm the candidates).
        screen: :func:`make_screen` of ``weight``.
        banned: (K,) long column ids never chosen, or None.
        max_candidates: a row with more candidates than this is not settled.
    Returns:
        (N,) long ids (the lowest on exact ties), or None when some row is not settled (no candidate, as with
        a NaN input, or too many); then compute the logits in full.
    """
    n = h.shape[0]
    s = screened_logits(h, screen)  # (N, V)
    if banned is not None:
        s.index_fill_(1, banned, float("-inf"))
    rows, cols = candidates(s, 2 * screen.bound)  # (M,) each
    counts = torch.bincount(rows, minlength=n)  # (N,)
    fewest, most = (int(c) for c in counts.aminmax())
    if fewest == 0 or most > max_candidates:  # a NaN row, or too many candidates
        return None
    if most == 1:  # one candidate per row, the usual case: it is the argmax
        return cols.new_empty(n).index_copy_(0, rows, cols)
    exact = (h.index_select(0, rows) * weight.index_select(0, cols)).sum(1)  # (M,) fp32 logits
    best = exact.new_full((n,), float("-inf")).scatter_reduce_(0, rows, exact, "amax")
    win = exact == best.index_select(0, rows)
    return cols.new_full((n,), weight.shape[0]).scatter_reduce_(0, rows[win], cols[win], "amin")


class _ScreenCache:
    """One screen per live weight tensor and screen dtype, rebuilt when the weight changes
    (:func:`aiayn.accel.cpu.packed.weight_state`) and dropped when it is freed. Kept outside the module, so
    ``state_dict``, pickles and copies never carry it."""

    def __init__(self) -> None:
        self._entries: dict[tuple[int, torch.dtype], tuple[weakref.ref, tuple, Screen | None]] = {}

    def get(self, weight: Tensor, dtype: torch.dtype) -> Screen | None:
        slot, key = (id(weight), dtype), weight_state(weight)
        entry = self._entries.get(slot)
        if entry is not None and entry[0]() is weight and entry[1] == key:
            return entry[2]
        ref = weakref.ref(weight, lambda _, slot=slot: self._entries.pop(slot, None))
        self._entries[slot] = (ref, key, make_screen(weight, dtype))
        return self._entries[slot][2]


_screens = _ScreenCache()


def screen_for(h: Tensor, proj: nn.Module) -> torch.dtype | None:
    """The screen dtype :class:`GreedyHead` uses for ``proj(h)`` (:func:`screen_dtype`), or None: only on CPU, for
    fp32 ``h`` and a bias-free fp32 weight that is not an inference tensor (it has no version counter to tell a
    stale screen by), and while ``SETTINGS.screened_argmax``."""
    w = getattr(proj, "weight", None)
    if not (isinstance(w, Tensor) and w.dim() == 2 and getattr(proj, "bias", None) is None and h.dim() == 2
            and w.dtype == h.dtype == torch.float32 and w.device.type == h.device.type == "cpu"
            and not w.is_inference() and SETTINGS.screened_argmax):
        return None
    return screen_dtype(h.shape[0], w.numel(), w.shape[1])


class GreedyHead:
    """A chooser over hidden states: the greedy token of each row of ``proj(h)``, banned ids excluded.

    ``decode_loop`` drives it like :func:`aiayn.generate.sampling.greedy_choice`, with a stepper that returns
    hidden states (``LMStepper(..., project=False)``). Screened where :func:`screen_for` says so, otherwise the
    full logits and :func:`aiayn.accel.cpu.topk.row_argmax`; both give the fp32 argmax.

    Args:
        proj: the output layer (``LMHead.proj``): any module mapping (N, D) to (N, V) logits.
        banned_ids: ids never chosen (e.g. PAD).
    """

    #: screens in a row that did not settle (every row within its candidate limit) before this head stops trying:
    #: where the model's logits are flat next to the bound, each failed screen is a wasted weight pass
    MAX_FAILED_SCREENS = 4

    def __init__(self, proj: nn.Module, banned_ids: Sequence[int] = ()) -> None:
        self.proj, self.banned_ids = proj, list(banned_ids)
        self._banned: Tensor | None = None
        self.failed_in_a_row = 0

    def __call__(self, h: Tensor) -> Tensor:
        """h (N, D) -> (N,) long token ids. ``decode_loop`` hands over the states in fp32; those of a bf16 or fp16
        model go back to its dtype, exactly (fp32 holds every bf16 and fp16 value)."""
        w = getattr(self.proj, "weight", None)
        if isinstance(w, Tensor) and w.is_floating_point() and h.dtype != w.dtype:
            h = h.to(w.dtype)
        dtype = screen_for(h, self.proj) if self.failed_in_a_row < self.MAX_FAILED_SCREENS else None
        screen = _screens.get(w, dtype) if dtype is not None else None
        if screen is not None:
            if self.banned_ids and self._banned is None:
                self._banned = torch.tensor(self.banned_ids, dtype=torch.long, device=h.device)
            ids = screened_argmax(h, w, screen, self._banned)
            self.failed_in_a_row = 0 if ids is not None else self.failed_in_a_row + 1
            if ids is not None:
                return ids
        return row_argmax(next_scores(self.proj(h), self.banned_ids))
