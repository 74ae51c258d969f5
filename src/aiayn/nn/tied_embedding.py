"""Gradients of an embedding tied to the output layer, without a dense (V, D) buffer per lookup on CPU.

torch's embedding backward allocates a zero (V, D) gradient and adds the looked-up rows' gradients into it. When the
weight is also the output layer's (paper section 3.4), autograd then adds that tensor into the projection's dense
(V, D) gradient. On CPU a fresh block above glibc's 32 MiB mmap threshold is zero-filled by the kernel page by page
on first touch: paper-base's shared 32000 x 512 embedding (64 MB) paid for that twice per step, once for the source
lookups and once for the target's, about 140 ms each on the 2-core development host (docs/BENCHMARKS.md).

Here those lookups give row-sparse gradients (``F.embedding(sparse=True)``: the looked-up rows only), which autograd
sums with the projection's dense gradient. Autograd adds a sparse gradient into a dense one in place only when the
dense one arrives *after* it (``InputBuffer::accumulate``); the projection comes last in forward, so its backward
would run first and each sum would allocate a new (V, D) tensor. :func:`plan` therefore hands the output layer the
weight through an identity node made *before* the lookups: the engine runs the ready node made last first, so this
node's backward runs after the lookups' and its dense gradient arrives last. Were the order ever different, the sum
would be the same, computed out of place.

A caller that asks for the output weight and then does not project with it leaves only sparse gradients for the
weight; a hook registered once per weight (:func:`_keep_grad_dense`) turns a sparse ``.grad`` dense, so optimizers,
clipping and checkpoints always see a dense gradient.

Only on CPU, with autograd recording, for a weight that requires grad; accelerators have caching allocators, and
:func:`plan` leaves every lookup dense there.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.utils.weak import WeakIdKeyDictionary

_hooked: WeakIdKeyDictionary = WeakIdKeyDictionary()  # weight -> its densifying hook's handle


class _LateIdentity(torch.autograd.Function):
    """``weight`` as it is; made before the lookups, its backward runs after theirs (see the module docstring)."""

    @staticmethod
    def forward(ctx, weight: Tensor) -> Tensor:  # type: ignore[override]
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:  # type: ignore[override]
        return grad


def applies(weight: Tensor) -> bool:
    """Whether lookups into ``weight`` in this forward pass should give row-sparse gradients: autograd is recording,
    the weight requires grad and lives on the CPU."""
    return torch.is_grad_enabled() and weight.requires_grad and weight.device.type == "cpu"


def plan(output_weight: Tensor, embeddings: Sequence[nn.Embedding]) -> tuple[Tensor | None, list[bool]]:
    """For one forward pass that projects with ``output_weight`` (V, D): the tensor to project with, and for each
    embedding whether its lookups give row-sparse gradients (:func:`lookup`). Call it before any lookup.

    Where an embedding shares the weight and :func:`applies`: the weight through a late identity node, and True for
    the embeddings that share it. Otherwise None (project with the output layer as it is) and all False.
    """
    shared = [e.weight is output_weight for e in embeddings]
    if not any(shared) or not applies(output_weight):
        return None, [False] * len(embeddings)
    _keep_grad_dense(output_weight)
    return _LateIdentity.apply(output_weight), shared


def lookup(embedding: nn.Embedding, ids: Tensor, sparse_grad: bool = False) -> Tensor:
    """``embedding(ids)``: (B, T) ids -> (B, T, D) rows; with ``sparse_grad`` the weight's gradient is row-sparse
    (only where :func:`plan` said so: the output layer's dense gradient must be part of the same graph). The module
    itself is called, its ``sparse`` flag set for the call, so that its hooks run."""
    if not sparse_grad or embedding.sparse:
        return embedding(ids)
    embedding.sparse = True
    try:
        return embedding(ids)
    finally:
        embedding.sparse = False


def _densify(weight: Tensor) -> None:
    if weight.grad is not None and weight.grad.layout != torch.strided:
        weight.grad = weight.grad.to_dense()


def _keep_grad_dense(weight: Tensor) -> None:
    """Register, once per weight, a hook that makes a sparse ``.grad`` dense after accumulation."""
    if weight not in _hooked:
        _hooked[weight] = weight.register_post_accumulate_grad_hook(_densify)
