"""The output projection and the label-smoothed loss in one pass: the fast twin of ``losses.label_smoothed_nll``.

A language model's last two steps, ``logits = h @ W.T`` and the cross-entropy over those logits, are the
most memory-hungry part of training: for GPT-2 small at 1024 tokens the logits alone are 206 MB of float32,
and autograd keeps the logits, their log-softmax and a dense gradient of each alive. Because the loss is a
scalar, its gradient with respect to the logits is known in the forward pass
(``softmax(z) - (1 - eps) * onehot(y) - eps * u``), so this function computes the loss *and* the gradients
of ``h`` and ``W`` chunk by chunk of rows, overwriting each chunk's logits in place, and the backward pass
only scales them by the incoming gradient. Same FLOPs as the plain path (three matmuls), a fraction of the
memory traffic, and memory bounded by one chunk of logits.

``label_smoothed_nll(h @ W.T, labels, eps, ignore_vocab_id=k)`` is the reference; tests hold the two equal
(loss, nll and both gradients).
"""

from __future__ import annotations

import torch
from torch import Tensor

from aiayn.train.losses import IGNORE_INDEX, label_smoothed_nll

#: logits elements per chunk on accelerators (float32: 256 MB): few, large kernels
CHUNK_ELEMENTS = 1 << 26
#: rows per chunk on CPU (0: as on accelerators), so the passes over a chunk's logits run in cache: within 3% of one
#: large chunk at d_model 128-768 (bench/cpu_train_kernels.py), clearly better than fewer rows (64 rows starve the
#: matmuls at d_model 512: 1.34x slower), and it bounds the logits in memory to 512 x V
CPU_CHUNK_ROWS = 512


class _LinearSmoothedNLL(torch.autograd.Function):
    """Autograd function; see :func:`linear_label_smoothed_nll`."""

    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, labels: Tensor, epsilon: float,  # type: ignore[override]
                ignore_vocab_id: int | None, chunk_rows: int) -> tuple[Tensor, Tensor, Tensor]:
        n_smooth = weight.shape[0] if ignore_vocab_id is None else weight.shape[0] - 1  # classes sharing eps
        spread = epsilon / n_smooth  # smoothing mass per class
        w = weight.to(h.dtype)  # (V, D); a no-op without mixed precision
        keep_all = labels != IGNORE_INDEX  # (N,)
        grad_h = torch.empty_like(h) if ctx.needs_input_grad[0] else None  # (N, D)
        grad_w = (torch.zeros(weight.shape, dtype=torch.float32, device=h.device) if ctx.needs_input_grad[1]
                  else None)  # (V, D)
        loss_sum = torch.zeros((), dtype=torch.float32, device=h.device)
        nll_sum = torch.zeros((), dtype=torch.float32, device=h.device)
        if epsilon > 0:
            # sum over classes of z = h @ (sum of the weight rows): a mat-vec instead of a pass over the logits
            w_total = weight.float().sum(0)  # (D,)
            if ignore_vocab_id is not None:
                w_total = w_total - weight[ignore_vocab_id].float()
        for start in range(0, h.shape[0], chunk_rows):
            rows = slice(start, start + chunk_rows)
            hc, keep = h[rows], keep_all[rows]  # (n, D), (n,)
            safe = labels[rows].masked_fill(~keep, 0)[:, None]  # (n, 1)
            z = (hc @ w.T).float()  # (n, V) logits
            z_label = z.gather(1, safe).squeeze(1)  # (n,)
            top = z.amax(-1, keepdim=True)  # (n, 1)
            e = z.sub_(top).exp_()  # (n, V) exp(z - max), in place over z
            total_e = e.sum(-1)  # (n,)
            lse = top.squeeze(1) + total_e.log()  # (n,) log-sum-exp
            nll = lse - z_label  # (n,)
            loss = nll
            keep_f = keep.float()
            if epsilon > 0:
                smooth = lse - (hc.float() @ w_total) / n_smooth  # (n,) mean negative log-prob, smoothed classes
                loss = (1.0 - epsilon) * nll + epsilon * smooth
            loss_sum += (loss * keep_f).sum()
            nll_sum += (nll * keep_f).sum()
            # d(loss)/dz = softmax(z) - (1 - eps) * onehot(y) - eps * u, zero on ignored rows: in place over e,
            # the softmax scaled by keep, minus the spread (none on the ignored class), then a scatter for the label
            g = e.mul_((keep_f / total_e)[:, None])  # (n, V) softmax on kept rows, in place
            if epsilon > 0:
                g.sub_((spread * keep_f)[:, None])
                if ignore_vocab_id is not None:
                    g[:, ignore_vocab_id] += spread * keep_f
            g.scatter_add_(1, safe, (-(1.0 - epsilon) * keep_f)[:, None])
            gc = g.to(h.dtype)
            if grad_h is not None:
                torch.matmul(gc, w, out=grad_h[rows])
            if grad_w is not None:
                grad_w.addmm_(gc.T.to(grad_w.dtype), hc.to(grad_w.dtype))
        # gradients of the loss sum, already complete: backward only scales them (they are not inputs or outputs,
        # so they live on ctx rather than in save_for_backward)
        ctx.grad_h = grad_h
        ctx.grad_w, ctx.weight_dtype = grad_w, weight.dtype
        n_tokens = keep_all.sum()
        ctx.mark_non_differentiable(nll_sum, n_tokens)
        return loss_sum, nll_sum, n_tokens

    @staticmethod
    def backward(ctx, g_loss: Tensor, _g_nll: Tensor, _g_n: Tensor):  # type: ignore[override]
        dh = None if ctx.grad_h is None else ctx.grad_h * g_loss.to(ctx.grad_h.dtype)
        dw = None if ctx.grad_w is None else (ctx.grad_w * g_loss).to(ctx.weight_dtype)
        return dh, dw, None, None, None, None


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
    ignore_vocab_id)`` (see :mod:`aiayn.train.losses`). Only the smoothed loss is differentiable; the returned
    NLL is for logging and perplexity. Without gradients (evaluation) it simply calls the reference.

    Args:
        hidden: (N, D) or (B, T, D) final hidden states (float32, or bf16/fp16 under mixed precision).
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
    return _LinearSmoothedNLL.apply(h, weight, labels.reshape(-1), float(epsilon), ignore_vocab_id, int(chunk_rows))
