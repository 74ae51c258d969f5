"""The output projection and the label-smoothed loss in one pass: the fast twin of ``losses.label_smoothed_nll``.

A language model's last two steps, ``logits = h @ W.T`` and the cross-entropy over those logits, are the
most memory-hungry part of training: for GPT-2 small at 1024 tokens the logits alone are 206 MB of float32,
and autograd keeps the logits, their log-softmax and a dense gradient of each alive. Because the loss is a
scalar, its gradient with respect to the logits is known in the forward pass
(``softmax(z) - (1 - eps) * onehot(y) - eps * u``), so this function computes the loss *and* the gradients
of ``h`` and ``W`` chunk by chunk of rows, and the backward pass only scales them by the incoming gradient.
Per chunk: the logits go into one reused buffer, which becomes their softmax in place; the label term is a
scatter, and the constant ``-eps * u`` never touches the logits: it is a rank-1 correction of each gradient. Rows
whose label is ignored (padding) get no logits at all. Same FLOPs as the plain path (three matmuls) or fewer, a
fraction of the memory traffic, and memory bounded by a chunk of logits.

The softmax: on CPU aiayn's native kernel (:func:`aiayn.accel.cpu.native.softmax_lse_`) turns each row into its
softmax in place and returns its log-sum-exp, one exp per entry and each row in the caches after its first pass,
which beats ``log_softmax`` into a second buffer then ``exp_`` over it (measured: docs/performance.md). Elsewhere,
and with ``SETTINGS.native`` off (:mod:`aiayn.accel.cpu.settings`), the log-softmax goes into a second buffer (one
fused row-local kernel), which then becomes the softmax in place.

On CPU the chunk buffers are a workspace kept from one call to the next (per thread; :func:`release_workspace`
frees it, and ``aiayn.train.trainer.train`` calls it when training ends), and backward scales the precomputed
gradients in place and hands them over. glibc ``mmap``s every fresh block above 32 MiB and the kernel zero-fills
its pages on first touch: at GPT-2 small's vocabulary the fresh buffers, the scaled copy of the (V, D) gradient
and the clone autograd made of it while ``ctx`` still held it would cost tens of thousands of page faults per step.
Accelerators have caching allocators and get fresh buffers.

Under ``torch.autocast`` the three matmuls run in autocast's dtype, as a linear layer's would (:func:`compute_dtype`):
the logits are copied into the float32 buffer, the softmax and the sum of the weight gradient over chunks stay
float32, and on CPU the low-precision weight copy, chunk and weight-gradient product are a second workspace.

In float32 on CPUs where oneDNN is the faster matmul library (:mod:`aiayn.accel.cpu.gemm`), the logits and the hidden
states' gradient run through oneDNN; the weight's gradient g^T @ h follows :func:`aiayn.accel.cpu.gemm.weight_gradient`
(BLAS, which takes g^T without a copy, wherever the vocabulary is at least the width), each chunk's product added
in place with ``addmm_``.

``label_smoothed_nll(h @ W.T, labels, eps, ignore_vocab_id=k)`` is the reference; tests hold the two equal
(loss, nll and both gradients).
"""

from __future__ import annotations

import itertools
import math
import threading

import torch
from torch import Tensor

from aiayn.accel.cpu import native
from aiayn.accel.cpu.gemm import mm_nt, weight_gradient
from aiayn.models.losses import IGNORE_INDEX, label_smoothed_nll

#: logits elements per chunk on accelerators (float32: 256 MB): few, large kernels
CHUNK_ELEMENTS = 1 << 26
#: rows per chunk on CPU (0: as on accelerators), so the passes over a chunk's logits run in cache: about as fast
#: as one large chunk, where fewer rows starve the matmuls (measured: docs/performance.md), and it bounds the logits
#: in memory to 512 x V
CPU_CHUNK_ROWS = 512


_cpu_workspace = threading.local()  # .buffers: {dtype: 1-D CPU tensor}, each as large as the largest call needed


def _workspace(shapes: list[tuple[int, ...]], dtype: torch.dtype, device: torch.device) -> list[Tensor]:
    """Tensors of ``shapes`` and ``dtype``: on CPU views of this thread's workspace for ``dtype`` (grown when too
    small, kept across calls), fresh tensors elsewhere."""
    sizes = [math.prod(shape) for shape in shapes]
    if device.type != "cpu":
        flat = torch.empty(sum(sizes), dtype=dtype, device=device)
    else:
        buffers = getattr(_cpu_workspace, "buffers", None)
        if buffers is None:
            buffers = _cpu_workspace.buffers = {}
        flat = buffers.get(dtype)
        if flat is None or flat.numel() < sum(sizes):
            buffers[dtype] = None  # free the old one first: the peak stays at the new size
            buffers[dtype] = flat = torch.empty(sum(sizes), dtype=dtype)
    starts = itertools.accumulate(sizes, initial=0)
    return [flat[start:start + size].view(shape) for start, size, shape in zip(starts, sizes, shapes)]


def _chunk_buffers(rows: int, vocab: int, device: torch.device, native_softmax: bool) -> tuple[Tensor, Tensor | None]:
    """(rows, vocab) float32 buffers (see :func:`_workspace`): the logits, and their log-softmax unless the native
    kernel turns the logits into their softmax in place (``native_softmax``; then None)."""
    buffers = _workspace([(rows, vocab)] * (1 if native_softmax else 2), torch.float32, device)
    return buffers[0], None if native_softmax else buffers[1]


def _native_softmax(device: torch.device) -> bool:
    """Whether each chunk's softmax is :func:`aiayn.accel.cpu.native.softmax_lse_` (fp32 logits on the CPU, kernels
    built)."""
    return device.type == "cpu" and native.library() is not None


def release_workspace() -> None:
    """Free this thread's CPU workspace (a chunk of logits, 103 MB at GPT-2 small's vocabulary, or two without the
    native kernels; under mixed precision also a low-precision copy of the weight, its gradient and a chunk), e.g.
    when a process stops training and goes on with other work; the next call allocates it again."""
    _cpu_workspace.buffers = None


class _LinearSmoothedNLL(torch.autograd.Function):
    """Autograd function; see :func:`linear_label_smoothed_nll`."""

    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, labels: Tensor, epsilon: float,  # type: ignore[override]
                ignore_vocab_id: int | None, chunk_rows: int,
                compute_dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
        with torch.autocast(h.device.type, enabled=False):  # every cast below is explicit
            return _LinearSmoothedNLL._forward(ctx, h, weight, labels, epsilon, ignore_vocab_id, chunk_rows,
                                               compute_dtype)

    @staticmethod
    def _forward(ctx, h: Tensor, weight: Tensor, labels: Tensor, epsilon: float, ignore_vocab_id: int | None,
                 chunk_rows: int, compute_dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
        n_smooth = weight.shape[0] if ignore_vocab_id is None else weight.shape[0] - 1  # classes sharing eps
        spread = epsilon / n_smooth  # smoothing mass per class
        low = compute_dtype != torch.float32  # mixed precision (or float64): the three matmuls in compute_dtype
        kept = (labels != IGNORE_INDEX).nonzero().squeeze(1)  # (K,) only these rows count: the others get no logits
        h_kept, labels_kept = h.index_select(0, kept), labels.index_select(0, kept)[:, None]  # (K, D), (K, 1)
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h_kept = torch.empty_like(h_kept) if need_h else None  # (K, D)
        grad_w = None  # (V, D) float32: the first chunk's gradient, then the sum over chunks
        loss_sum = torch.zeros((), dtype=torch.float32, device=h.device)
        nll_sum = torch.zeros((), dtype=torch.float32, device=h.device)
        if epsilon > 0:
            # the smoothed classes' weight rows summed: sum over them of z = h @ w_smooth, a mat-vec instead of a pass
            # over the logits; and (below) the gradient's constant -spread on every smoothed class as rank-1 corrections
            w_smooth = weight.float().sum(0)  # (D,)
            if ignore_vocab_id is not None:
                w_smooth = w_smooth - weight[ignore_vocab_id].float()
        # (n, V) float32 buffers reused by every chunk (and on CPU by every call): fresh ones cost page faults
        n_max, (vocab, width) = min(chunk_rows, h_kept.shape[0]), weight.shape
        logits_buffer, logp_buffer = _chunk_buffers(n_max, vocab, h.device, _native_softmax(h.device))
        w = weight
        if low:  # and in compute_dtype: the weight, a chunk's logits (then its gradient), the weight's gradient
            w, z_low, grad_w_low = _workspace([(vocab, width), (n_max, vocab), (vocab, width) if need_w else (0,)],
                                              compute_dtype, h.device)
            w.copy_(weight)
        for start in range(0, h_kept.shape[0], chunk_rows):
            rows = slice(start, start + chunk_rows)
            hc, label = h_kept[rows], labels_kept[rows]  # (n, D), (n, 1)
            n = hc.shape[0]
            if low:  # low-precision matmul, float32 logits
                hc_low = hc.to(compute_dtype)
                z = logits_buffer[:n].copy_(torch.matmul(hc_low, w.T, out=z_low[:n]))
            else:  # through oneDNN where it is the faster fp32 CPU library (aiayn.accel.cpu.gemm)
                z = mm_nt(hc, w, out=logits_buffer[:n])  # (n, V) logits
            z_label = z.gather(1, label).squeeze(1)  # (n,)
            if logp_buffer is None:  # the logits become their softmax in place, one exp per entry
                lse = native.softmax_lse_(z)  # (n,) log-sum-exp
                g = z
                nll = lse - z_label  # (n,) -log p(label)
            else:  # log-softmax into the second buffer (one fused, row-local pass), then the softmax over it
                nll = -torch.log_softmax(z, -1, out=logp_buffer[:n]).gather(1, label).squeeze(1)
                lse = z_label + nll
                g = logp_buffer[:n].exp_()
            loss = nll
            if epsilon > 0:
                smooth = lse - (hc.float() @ w_smooth) / n_smooth  # (n,) mean -log p over the smoothed classes
                loss = (1.0 - epsilon) * nll + epsilon * smooth
            loss_sum += loss.sum()
            nll_sum += nll.sum()
            # d(loss)/dz = softmax(z) - (1 - eps) * onehot(y) - spread on every smoothed class: g is the softmax,
            # the label term scattered; the constant -spread is applied after the loop
            g.scatter_add_(1, label, torch.full_like(z_label, -(1.0 - epsilon))[:, None])
            if low:  # each chunk's gradients in compute_dtype; the weight's summed over chunks in float32
                g = z_low[:n].copy_(g)
                if grad_h_kept is not None:
                    grad_h_kept[rows] = g @ w
                if need_w:
                    torch.matmul(g.T, hc_low, out=grad_w_low)
                    grad_w = grad_w_low.float() if grad_w is None else grad_w.add_(grad_w_low)
            else:
                if grad_h_kept is not None:
                    mm_nt(g, w.T, out=grad_h_kept[rows])  # g @ W
                if need_w:  # g^T @ h, each chunk's product added
                    grad_w = weight_gradient(g, hc, grad_w)
        if need_w and grad_w is None:  # no row counted
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=h.device)
        if epsilon > 0:  # the -spread term: each kept row's gradient loses spread * w_smooth ...
            if grad_h_kept is not None:
                grad_h_kept.sub_((spread * w_smooth).to(h.dtype))
            if grad_w is not None:  # ... and each smoothed class's weight row spread * (sum of the kept rows)
                rows_total = h_kept.float().sum(0)  # (D,)
                grad_w.sub_(spread * rows_total)
                if ignore_vocab_id is not None:
                    grad_w[ignore_vocab_id] += spread * rows_total
        grad_h = None
        if grad_h_kept is not None:  # ignored rows: zero gradient
            grad_h = torch.zeros_like(h).index_copy_(0, kept, grad_h_kept)
        # gradients of the loss sum, already complete: backward only scales them (they are not inputs or outputs,
        # so they live on ctx rather than in save_for_backward)
        ctx.grad_h = grad_h
        ctx.grad_w, ctx.weight_dtype, ctx.handed_over = grad_w, weight.dtype, False
        n_tokens = torch.tensor(kept.shape[0], device=h.device)
        ctx.mark_non_differentiable(nll_sum, n_tokens)
        return loss_sum, nll_sum, n_tokens

    @staticmethod
    def backward(ctx, g_loss: Tensor, _g_nll: Tensor, _g_n: Tensor):  # type: ignore[override]
        if ctx.handed_over:
            raise RuntimeError("linear_label_smoothed_nll: backward ran twice through the same loss; its gradients "
                               "were handed over the first time (retain_graph does not keep them). Compute the loss "
                               "again for a second backward.")
        # scale in place and drop ctx's references, so that autograd takes the tensors as they are: with ctx still
        # holding the (V, D) gradient it would clone it (another 154 MB at GPT-2 small's vocabulary)
        grad_h, grad_w = ctx.grad_h, ctx.grad_w
        ctx.grad_h = ctx.grad_w = None
        ctx.handed_over = True
        dh = None if grad_h is None else grad_h.mul_(g_loss.to(grad_h.dtype))
        dw = None if grad_w is None else grad_w.mul_(g_loss).to(ctx.weight_dtype)
        del grad_h, grad_w
        return dh, dw, None, None, None, None, None


def linear_label_smoothed_nll(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    epsilon: float,
    ignore_vocab_id: int | None = None,
    chunk_rows: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Summed label-smoothed cross-entropy of ``hidden @ weight.T`` without materializing all the logits.

    Same conventions and results as ``label_smoothed_nll(hidden @ weight.T, labels, epsilon, "sum",
    ignore_vocab_id)`` (see :mod:`aiayn.models.losses`). Only the smoothed loss is differentiable; the returned
    NLL is for logging and perplexity. Without gradients (evaluation) it simply calls the reference.

    Args:
        hidden: (N, D) or (B, T, D) final hidden states (float32, or bf16/fp16 for a low-precision model). Under
            ``torch.autocast`` the three matmuls run in autocast's dtype, as a linear layer's would (the logits,
            their softmax and the weight gradient's sum over chunks stay float32); see :func:`compute_dtype`.
        weight: (V, D) output projection (possibly tied to an embedding), no bias.
        labels: (N,) or (B, T) class ids, ``-100`` at positions that never count.
        epsilon: label smoothing in [0, 1).
        ignore_vocab_id: a class (the PAD id) that gets no smoothing mass, or None.
        chunk_rows: rows per chunk; default ``CHUNK_ELEMENTS // V`` (256 MB of float32 logits) on accelerators,
            at most ``CPU_CHUNK_ROWS`` (512) on CPU.

    Returns:
        ``(loss, nll, n_tokens)``: 0-d float32 sums and the 0-d int64 count of non-ignored positions.
    """
    if hidden.shape[:-1] != labels.shape:
        raise ValueError(f"linear_label_smoothed_nll: hidden {tuple(hidden.shape)} and labels "
                         f"{tuple(labels.shape)} must share leading dimensions")
    if weight.ndim != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"linear_label_smoothed_nll: weight {tuple(weight.shape)} must be (V, {hidden.shape[-1]})")
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"linear_label_smoothed_nll: epsilon must be in [0, 1), got {epsilon}")
    if not torch.is_grad_enabled() or not (hidden.requires_grad or weight.requires_grad):
        return label_smoothed_nll(hidden @ weight.to(hidden.dtype).T, labels, epsilon, "sum", ignore_vocab_id)
    h = hidden.reshape(-1, hidden.shape[-1])  # (N, D)
    if chunk_rows is None:
        chunk_rows = max(1, CHUNK_ELEMENTS // weight.shape[0])
        if h.device.type == "cpu" and CPU_CHUNK_ROWS:
            chunk_rows = min(chunk_rows, CPU_CHUNK_ROWS)
    return _LinearSmoothedNLL.apply(h, weight, labels.reshape(-1), float(epsilon), ignore_vocab_id, int(chunk_rows),
                                    compute_dtype(h))


def compute_dtype(hidden: Tensor) -> torch.dtype:
    """The dtype of the projection's matmuls: autocast's where autocast is on for ``hidden``'s device (as for
    any linear layer), else ``hidden``'s own (float32, or bf16/fp16 for a model cast to low precision)."""
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type) and hidden.dtype in (torch.float32, torch.float64):
        return torch.get_autocast_dtype(device_type)
    return hidden.dtype
