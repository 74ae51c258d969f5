"""Decoding-step attention on the CPU: torch's flash kernel or two matmuls, whichever this host runs faster.

A decoding step attends from a few queries (one per row, or a sentence's beams folded into one block over its
source) to a cache of keys. Which kernel is faster for such shapes depends on the CPU: on this project's 2-core
AMD Zen 4 host two matmuls around a softmax took 0.4x the flash kernel's time for beam search's folded
cross-attention at batch 32 and 0.75x for self-attention over 20 keys, while the flash kernel won at batch 1 and
for short caches; on an earlier Intel host the flash kernel won the cross-attention too (docs/BENCHMARKS.md). So
instead of a rule fitted to one host, :func:`few_query_attention` measures, as cuDNN's benchmark mode does: the first
time a shape class of at least ``MIN_MEASURED_BLOCKS`` (batch x head) blocks is seen in a process (smaller ones
keep the flash kernel), both kernels run on the actual inputs (one warm-up and three timed calls
each, alternating), and the faster one serves that class from then on. A class is (dtype, batch x heads, queries,
keys, head width, masked, threads), with batch x heads and keys rounded up to a power of two, so a decode grows
through a handful of classes and the measuring costs a few milliseconds once per process.

The two kernels give the same attention up to float rounding (a different summation order), so a measured choice
can make the last bits of scores differ between processes and hosts. ``AIAYN_DECODE_ATTENTION`` pins it:
``auto`` (measure, the default), ``flash`` (torch's kernel, as before this module) or ``matmul``.
Only CPU inference in fp32 with few queries comes here (:func:`applies`); everything else keeps torch's kernel.
"""

from __future__ import annotations

import os
import statistics
import time

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.nn.packed import frozen_block

ENV_VAR = "AIAYN_DECODE_ATTENTION"
CHOICES = ("auto", "flash", "matmul")
MAX_QUERIES = 8  # queries per (batch, head) block that count as a decoding step (4 beams folded: 4)
MIN_SPEEDUP = 1.15  # the matmul path must be at least this much faster to be chosen (noise must not flip a tie)
#: fewer (batch x head) blocks than this keep the flash kernel unmeasured: there a step's few small kernels run with
#: cold caches, and the measurement (warm, back to back) favoured two matmuls that were slower in real decodes
#: (paper-base beam-4 at batch 1, folded cross-attention of 8 blocks: 0.87-0.90x, docs/BENCHMARKS.md)
MIN_MEASURED_BLOCKS = 64
_TIMED_CALLS = 3
_choice: dict[tuple, str] = {}  # shape class -> "flash" or "matmul", measured in this process
_setting_read: tuple[int, str] = (0, "auto")  # (frozen_weights block, the setting read in it)


def applies(q: Tensor, k: Tensor, dropout_p: float, is_causal: bool) -> bool:
    """Whether this attention call is a decoding step :func:`few_query_attention` may serve: fp32 CPU tensors, no
    autograd, no dropout, no causal flag, at most ``MAX_QUERIES`` queries per block."""
    return (q.device.type == "cpu" and q.dtype == torch.float32 and k.dtype == torch.float32
            and q.shape[-2] <= MAX_QUERIES and dropout_p == 0.0 and not is_causal
            and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)))


def matmul_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    """softmax(q k^T * scale, masked) v as two matmuls and a softmax.

    Args:
        q: (B, H, T, Dh); k, v: (B, H, S, Dh), any strides.
        mask: bool broadcastable to (B, H, T, S), True = may attend; every row must allow at least one key.
        scale: the score scale.
    Returns:
        (B, H, T, Dh).
    """
    scores = torch.matmul(q, k.transpose(-2, -1)).mul_(scale)  # (B, H, T, S)
    if mask is not None:
        scores.masked_fill_(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def _flash(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


_KERNELS = {"flash": _flash, "matmul": matmul_attention}


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def chosen_kernel(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> str:
    """"flash" or "matmul" for this call's shape class: ``AIAYN_DECODE_ATTENTION`` if it pins one, else the
    measured choice (measured now, on these inputs, if the class is new)."""
    setting = _setting()
    if setting != "auto":
        return setting
    b, h, t, dh = q.shape
    if b * h < MIN_MEASURED_BLOCKS:
        return "flash"
    key = (q.dtype, _pow2(b * h), t, _pow2(k.shape[-2]), dh, mask is not None, torch.get_num_threads())
    choice = _choice.get(key)
    if choice is None:
        choice = _choice[key] = _measure(q, k, v, mask, scale)
    return choice


def _setting() -> str:
    """``AIAYN_DECODE_ATTENTION``, validated; read once per :func:`aiayn.nn.packed.frozen_weights` block (a
    ``generate`` or ``translate`` call), at every call elsewhere."""
    global _setting_read
    block = frozen_block()
    if block and _setting_read[0] == block:
        return _setting_read[1]
    setting = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if setting not in CHOICES:
        raise ValueError(f"{ENV_VAR}={setting!r}: choose one of {', '.join(CHOICES)}")
    _setting_read = (block, setting)
    return setting


def _measure(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> str:
    """Time both kernels on these inputs (one warm-up and ``_TIMED_CALLS`` alternating calls each)."""
    times: dict[str, list[float]] = {name: [] for name in _KERNELS}
    for round_ in range(_TIMED_CALLS + 1):
        for name, kernel in _KERNELS.items():
            start = time.perf_counter()
            kernel(q, k, v, mask, scale)
            if round_:
                times[name].append(time.perf_counter() - start)
    flash, matmul = statistics.median(times["flash"]), statistics.median(times["matmul"])
    return "matmul" if matmul * MIN_SPEEDUP < flash else "flash"


def few_query_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    """A decoding step's attention through the kernel :func:`chosen_kernel` picks; shapes as
    :func:`matmul_attention`. Call only where :func:`applies`."""
    return _KERNELS[chosen_kernel(q, k, v, mask, scale)](q, k, v, mask, scale)


def forget_choices() -> None:
    """Drop the measured choices (they are made again on next use)."""
    _choice.clear()
