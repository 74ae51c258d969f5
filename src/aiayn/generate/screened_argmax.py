"""Greedy decoding's argmax over a large fp32 output layer, reading half as many bytes, with the same answer.

At batch 1 a greedy step of a decoder-only model on CPU is bound by memory bandwidth, and its largest read is the
output layer: 384 x 50257 fp32 weights (77 MB) in the GPT-2-like benchmark model, more than the decoder's other
layers together (42 MB) and more than the CPU's cache. Greedy search needs the argmax of the logits, not the
logits. :class:`GreedyHead` finds it in two passes:

1. **Screen.** Multiply the hidden state, scaled to unit length, by an fp16 copy of the weight: half the bytes.
   (A positive scale leaves the argmax alone and keeps every fp16 value in range.) Each screened logit s_i is
   within E of the exactly scaled logit l_i / |h|. So the argmax can only be a token with
   s_i >= max_j s_j - 2E: the *candidates*, usually one to a few.
2. **Confirm.** The candidates' logits in fp32, from the fp32 weight rows and the unscaled hidden state. The
   largest wins; the lowest id wins ties, as with ``Tensor.argmax``.

The result equals the argmax of the fp32 logits. Two fp32 products of the same numbers can differ in their
last bit, so near-exact ties may resolve either way, as between any two fp32 kernels.

**The bound.** u = 2^-11 is fp16's unit roundoff and u' = 2^-24 is fp32's. D is the hidden width and m the
largest row norm of the weight. The rounding errors are:

- the unit-length input, rounded to fp32, then to fp16: (u' + u) m;
- the fp16 weight row: u m;
- the fp32 sum of D products: D u' m;
- the fp16 result: u m;
- fp16 subnormals: at most 2^-25 absolute per value, so sqrt(D) 2^-25 (m + 1) over the input and the weight;
- second-order terms.

:func:`screen_bound` takes E = (4u + 2Du') m + sqrt(D) 2^-23 (m + 1), which covers the sum with room to spare.

This assumes the fp16 product accumulates in fp32, as torch's CPU kernels do. The tests check it on the host:
same-sign sums, whose accumulation error is largest.

**When it applies.** Only where the screen pays: CPU, an fp32 bias-free output layer, one or two rows, and at
least ``MIN_SCREENED_WEIGHTS[rows]`` weights. torch's fp16 product on CPU costs about one weight pass per row,
while the fp32 kernels read the weight once for all rows. On a 2-core AMD EPYC Zen 4, greedy search's whole
argmax over the 384 x 50257 layer, caches evicted before each call (``bench/decode_kernels.py``,
docs/BENCHMARKS.md):

| rows | screened | fp32 product + argmax |
| --- | --- | --- |
| 1 | 1.80 ms | 3.26 ms |
| 2 | 2.89 ms | 3.66 ms |
| 4 | 5.25 ms | 2.82 ms |

Whole greedy generations on the same host (``bench/greedy_screen.py``), screened against fp32:
- one row: 1.02-1.05x at 16384 x 256 (4.2M weights), 1.16-1.21x at 32000 x 512, 1.10-1.28x at 50257 x 384, and
  1.57-1.62x at 50257 x 768; 8000 x 256 (2M weights) is not screened;
- two rows: 0.86-0.88x at 8000 x 256 and 0.89-0.95x at 16384 x 256 (not screened), 1.08-1.09x at 32000 x 512
  (16.4M).

Elsewhere, and for any row the screen cannot settle (no candidate, as with NaN input, or more than
``MAX_CANDIDATES``), the full fp32 logits are computed.

**Memory.** The fp16 copy is made once per weight and kept until the weight changes or is freed: 38.6 MB for the
GPT-2-like model. ``AIAYN_SCREENED_ARGMAX=0`` turns the screen off.
"""

from __future__ import annotations

import math
import os
import weakref
from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.generate.common import next_scores
from aiayn.generate.topk import row_argmax
from aiayn.nn.packed import weight_state

#: rows -> the fewest output-layer weights (vocabulary x width) worth screening; fp16's CPU product costs a weight
#: pass per row, so a second row needs a larger layer, and more rows never pay (see the module docstring)
MIN_SCREENED_WEIGHTS = {1: 1 << 22, 2: 1 << 23}
MAX_CANDIDATES = 64  # per row; a row with more gets its full fp32 logits
_FP16_MAX = 65504.0
ENV_SWITCH = "AIAYN_SCREENED_ARGMAX"


class HalfScreen(NamedTuple):
    """An fp16 copy of an output layer's weight and the bound of its screened logits.

    Attributes:
        weight: (V, D) fp16.
        bound: E: every screened logit of a unit-length input is within E of the exact one.
    """

    weight: Tensor
    bound: float


def screen_bound(max_row_norm: float, width: int) -> float:
    """E for fp16 screening of a weight whose rows have norms of at most ``max_row_norm`` and ``width`` columns
    (the derivation is in the module docstring)."""
    u, u32 = 2.0 ** -11, 2.0 ** -24
    return (4 * u + 2 * width * u32) * max_row_norm + math.sqrt(width) * 2.0 ** -23 * (max_row_norm + 1)


def make_screen(weight: Tensor) -> HalfScreen | None:
    """The fp16 screen of a (V, D) fp32 weight; None if its rows are too long for fp16's range (or not finite)."""
    with torch.no_grad():
        m = float(torch.linalg.vector_norm(weight, dim=1).max())
        if not math.isfinite(m) or m > _FP16_MAX / 4:  # a unit-length input's logits stay below m
            return None
        return HalfScreen(weight.to(torch.float16, memory_format=torch.contiguous_format),
                          screen_bound(m, weight.shape[1]))


def screened_argmax(h: Tensor, weight: Tensor, screen: HalfScreen, banned: Tensor | None = None,
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
    unit = h / torch.linalg.vector_norm(h, dim=1, keepdim=True)  # (N, D)
    s = F.linear(unit.to(torch.float16), screen.weight)  # (N, V) fp16
    if banned is not None:
        s.index_fill_(1, banned, float("-inf"))
    floor = s.amax(dim=1, keepdim=True).float() - 2 * screen.bound  # (N, 1)
    rows, cols = (s >= floor).nonzero().unbind(1)  # (M,) each, by row then column
    counts = torch.bincount(rows, minlength=n)
    if rows.numel() == 0 or int(counts.min()) == 0 or int(counts.max()) > max_candidates:
        return None
    exact = (h.index_select(0, rows) * weight.index_select(0, cols)).sum(1)  # (M,) fp32 logits
    best = exact.new_full((n,), float("-inf")).scatter_reduce_(0, rows, exact, "amax")
    win = exact == best.index_select(0, rows)
    return cols.new_full((n,), weight.shape[0]).scatter_reduce_(0, rows[win], cols[win], "amin")


class _ScreenCache:
    """One screen per live weight tensor, rebuilt when the weight changes (:func:`aiayn.nn.packed.weight_state`)
    and dropped when it is freed. Kept outside the module, so ``state_dict``, pickles and copies never carry it."""

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref, tuple, HalfScreen | None]] = {}

    def get(self, weight: Tensor) -> HalfScreen | None:
        key, entry = weight_state(weight), self._entries.get(id(weight))
        if entry is not None and entry[0]() is weight and entry[1] == key:
            return entry[2]
        wid = id(weight)
        ref = weakref.ref(weight, lambda _, wid=wid: self._entries.pop(wid, None))
        self._entries[wid] = (ref, key, make_screen(weight))
        return self._entries[wid][2]


_screens = _ScreenCache()


def screen_applies(h: Tensor, proj: nn.Module) -> bool:
    """Whether :class:`GreedyHead` screens ``proj(h)``: CPU, fp32, no bias, a weight of at least
    ``MIN_SCREENED_WEIGHTS[rows]`` that is not an inference tensor (it has no version counter to tell a stale
    screen by), and ``AIAYN_SCREENED_ARGMAX`` not 0."""
    w = getattr(proj, "weight", None)
    return (isinstance(w, Tensor) and w.dim() == 2 and getattr(proj, "bias", None) is None and h.dim() == 2
            and w.dtype == h.dtype == torch.float32 and w.device.type == h.device.type == "cpu"
            and w.numel() >= MIN_SCREENED_WEIGHTS.get(h.shape[0], math.inf) and not w.is_inference()
            and os.environ.get(ENV_SWITCH, "1") != "0")


class GreedyHead:
    """A chooser over hidden states: the greedy token of each row of ``proj(h)``, banned ids excluded.

    ``decode_loop`` drives it like :func:`aiayn.generate.sampling.greedy_choice`, with a stepper that returns
    hidden states (``LMStepper(..., project=False)``). Screened where :func:`screen_applies`, otherwise the full
    logits and :func:`aiayn.generate.topk.row_argmax`; both give the fp32 argmax.

    Args:
        proj: the output layer (``LMHead.proj``): any module mapping (N, D) to (N, V) logits.
        banned_ids: ids never chosen (e.g. PAD).
    """

    def __init__(self, proj: nn.Module, banned_ids: Sequence[int] = ()) -> None:
        self.proj, self.banned_ids = proj, list(banned_ids)
        self._banned: Tensor | None = None

    def __call__(self, h: Tensor) -> Tensor:
        """h (N, D) -> (N,) long token ids. ``decode_loop`` hands over the states in fp32; those of a bf16 or fp16
        model go back to its dtype, exactly (fp32 holds every bf16 and fp16 value)."""
        w = getattr(self.proj, "weight", None)
        if isinstance(w, Tensor) and w.is_floating_point() and h.dtype != w.dtype:
            h = h.to(w.dtype)
        if screen_applies(h, self.proj):
            screen = _screens.get(self.proj.weight)
            if screen is not None:
                if self.banned_ids and self._banned is None:
                    self._banned = torch.tensor(self.banned_ids, dtype=torch.long, device=h.device)
                ids = screened_argmax(h, self.proj.weight, screen, self._banned)
                if ids is not None:
                    return ids
        return row_argmax(next_scores(self.proj(h), self.banned_ids))
