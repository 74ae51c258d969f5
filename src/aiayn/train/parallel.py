"""torch.distributed's own data-parallel engines for the trainer: DistributedDataParallel and FSDP2.

The trainer computes a step's loss through one module, :class:`TaskLoss` (the task's summed loss and a
mixture-of-experts model's router loss, inside one ``forward``), so that the engine sees every forward pass:

- ``ddp``: ``torch.nn.parallel.DistributedDataParallel`` over :class:`TaskLoss`. Gradients are all-reduced in
  buckets overlapped with the backward pass, once per optimizer step (``no_sync`` across the micro-batches of
  an accumulated step). Every rank holds the whole model and optimizer state.
- ``fsdp``: FSDP2, ``torch.distributed.fsdp.fully_shard`` on every :class:`~aiayn.nn.layers.TransformerLayer`
  and then on :class:`TaskLoss` (the embeddings, final norms and output layer). Parameters, gradients and
  optimizer state are sharded over the ranks; ``bfloat16`` runs under a mixed-precision policy (bf16
  parameters in compute, fp32 gradient reduction); ``train.fsdp_cpu_offload`` keeps the shards in CPU memory
  (CUDA only: offloading moves them off an accelerator).

Both engines average gradients over the ranks; the trainer's losses are sums divided by the target count of the
whole step, so :meth:`Parallel.loss_scale` multiplies each rank's loss by the world size and the average becomes
the sum a single process accumulating every micro-batch would get.

:class:`Parallel` is the trainer's whole view of the engine (``single`` for one process): the micro-batch context
(gradients synchronized after the last micro-batch of a step only), the gradient norm over every rank's shard, the
loss scale, sums over the ranks, every rank's RNG state gathered for a checkpoint, and the module rank 0 evaluates
and saves (:attr:`Parallel.weights`: the model itself, or under FSDP a whole copy that :meth:`Parallel.refresh_weights`
fills from the shards). :func:`parallelize` builds it for a run.

:func:`prepare_model` applies the single-model options first: activation checkpointing of every layer
(``train.activation_checkpointing``, recomputed in backward with the same dropout masks) and ``torch.compile``
of every layer and of the loss (``train.compile``).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint

from aiayn.checkpoint.rng_state import capture_rng
from aiayn.errors import AiaynError
from aiayn.nn.layers import TransformerLayer
from aiayn.nn.moe import moe_loss
from aiayn.train.dcp_checkpoint import full_model_state
from aiayn.train.distributed import Ranks, all_sum
from aiayn.train.train_config import PARALLELS, TrainConfig


class TaskLoss(nn.Module):
    """A task's loss as one module: ``forward(batch, label_smoothing)`` -> (summed loss, targets, extras, router).

    ``router`` is a mixture-of-experts model's weighted router loss (a mean over the micro-batch's tokens), None
    for other models. The model is this module's only child (``model``), so the engines wrap its parameters.
    """

    def __init__(self, task: Any, moe_weights: tuple[float, float] | None) -> None:
        super().__init__()
        self.model = task.model
        self._task = (task,)  # a tuple: not a submodule
        self._moe_weights = moe_weights

    def forward(self, batch: Any, label_smoothing: float
                ) -> tuple[torch.Tensor, int, dict[str, float], torch.Tensor | None]:
        """One micro-batch's summed loss () and its target count, extra metrics and router loss ()."""
        loss_sum, n_targets, extra = self._task[0].loss(batch, label_smoothing)
        router = moe_loss(self.model, *self._moe_weights) if self._moe_weights is not None else None
        return loss_sum, n_targets, extra, router


def layers(model: nn.Module) -> list[nn.Module]:
    """Every :class:`~aiayn.nn.layers.TransformerLayer` of ``model`` (encoder and decoder), in module order."""
    return [m for m in model.modules() if isinstance(m, TransformerLayer)]


def checkpoint_activations(model: nn.Module) -> None:
    """Recompute every layer's activations in the backward pass instead of keeping them (in place).

    Each layer's ``forward`` runs under ``torch.utils.checkpoint`` (non-reentrant, RNG state preserved, so
    dropout draws the same masks when recomputed); parameter names and the state dict are unchanged.
    """
    for layer in layers(model):
        inner = layer.forward

        @functools.wraps(inner)
        def forward(*args: Any, _inner: Callable = inner, **kwargs: Any) -> Any:
            if not torch.is_grad_enabled():  # evaluation and decoding: nothing to recompute
                return _inner(*args, **kwargs)
            return checkpoint(_inner, *args, use_reentrant=False, **kwargs)

        layer.forward = forward


def compile_for_training(model: nn.Module) -> None:
    """``torch.compile`` every layer and the output layer's loss (in place; the first steps compile).

    Layers are compiled one by one (as torchtitan does), so that activation checkpointing and FSDP's per-layer
    hooks stay outside the compiled code; the reference modules run inside it.
    """
    for layer in layers(model):
        layer.compile()
    head = getattr(model, "lm_head", None)
    if head is not None and hasattr(head, "loss"):
        head.loss = torch.compile(head.loss)


def compile_problem() -> str | None:
    """Why ``torch.compile`` cannot run on this machine's CPU (no C compiler for inductor), else None."""
    if any(shutil.which(cc) for cc in ("cc", "gcc", "clang")):
        return None
    return "torch.compile on the CPU needs a C compiler (cc, gcc or clang) on PATH"


def prepare_model(model: nn.Module, activation_checkpointing: bool, compile_model: bool) -> None:
    """Apply ``train.activation_checkpointing`` and ``train.compile`` to ``model`` (in place), in that order.

    Raises:
        AiaynError: ``train.compile`` on a CPU without a C compiler.
    """
    if activation_checkpointing:
        checkpoint_activations(model)
    if compile_model:
        device = next(model.parameters()).device
        problem = compile_problem() if device.type == "cpu" else None
        if problem is not None:
            raise AiaynError(f"train.compile=true: {problem}; install one (e.g. apt-get install gcc), or set "
                             "train.compile=false")
        compile_for_training(model)


@dataclass
class Parallel:
    """The parallel strategy of a run: how this rank runs a step's forward and backward passes, combines its
    gradients and numbers with the other ranks, and what rank 0 evaluates and saves.

    Attributes:
        loss_module: call it as ``loss_module(batch, label_smoothing)`` (see :class:`TaskLoss`).
        kind: ``"single"``, ``"ddp"`` or ``"fsdp"``.
        ranks: this process's place in the run.
        model: the task's model (under FSDP its parameters are this rank's shards).
        moe_weights: a mixture-of-experts model's (load-balancing, z-loss) weights, else None.
        weights: what rank 0 evaluates and saves: ``model``, or under FSDP a whole copy (:meth:`refresh_weights`).
        on_cpu: the model trains on the CPU (rank 0 then borrows the cores of the ranks waiting for it,
            :meth:`alone`).
    """

    loss_module: nn.Module
    kind: str
    ranks: Ranks
    model: nn.Module | None = None
    moe_weights: tuple[float, float] | None = None
    weights: nn.Module | None = None
    on_cpu: bool = False

    def __post_init__(self) -> None:
        if self.weights is None:
            self.weights = self.model

    @property
    def sharded(self) -> bool:
        """True when parameters and optimizer state are split over the ranks (FSDP)."""
        return self.kind == "fsdp"

    @property
    def loss_scale(self) -> float:
        """What each rank's loss is multiplied by, so that the engines' gradient average is the ranks' sum."""
        return float(self.ranks.world) if self.kind in PARALLELS else 1.0

    @contextlib.contextmanager
    def micro_batch(self, last: bool) -> Iterator[None]:
        """Around one micro-batch's forward and backward: gradients are synchronized after the last only."""
        if self.kind == "ddp" and not last:
            with self.loss_module.no_sync():
                yield
            return
        if self.kind == "fsdp":
            self.loss_module.set_requires_gradient_sync(last)
        yield

    def grad_norm(self, params: list[nn.Parameter], clip_norm: float | None) -> float:
        """The gradients' total 2-norm over every rank's shard, after clipping them to ``clip_norm`` when set
        (inf or nan when a gradient is not finite)."""
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return 0.0
        total = torch.nn.utils.get_total_norm(grads)
        if hasattr(total, "full_tensor"):  # a DTensor: the norm of the shards, made whole
            total = total.full_tensor()
        if clip_norm:
            torch.nn.utils.clip_grads_with_norm_(params, clip_norm, total)
        return float(total)

    def sum_over_ranks(self, values: list[float]) -> list[float]:
        """``values`` summed over every rank (one all-reduce; the values themselves for one process)."""
        return all_sum(values, self.ranks)

    def gather_rng(self) -> list[dict[str, Any]] | None:
        """Every rank's RNG state, in rank order, for ``last/``; None for one process (whose state the checkpoint
        takes itself). A collective: every rank calls it at the same steps."""
        return self.ranks.all_gather(capture_rng()) if self.ranks.world > 1 else None

    def refresh_weights(self) -> None:
        """Under FSDP, gather the shards into rank 0's whole copy (a collective: every rank calls it); else
        nothing, since ``weights`` is the model."""
        if self.sharded:
            full = full_model_state(self.model)
            if self.ranks.main:
                self.weights.load_state_dict(full)

    @contextlib.contextmanager
    def evaluating(self, task: Any) -> Iterator[None]:
        """While rank 0 evaluates or averages: ``task.model`` is :attr:`weights` (under FSDP, the whole copy)."""
        model = task.model
        task.model = self.weights
        try:
            yield
        finally:
            task.model = model

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        """While rank 0 evaluates or saves alone, let it use the threads of the ranks waiting on its machine."""
        if self.ranks.local_world == 1 or not self.on_cpu or not self.ranks.main:
            yield
            return
        before = torch.get_num_threads()
        torch.set_num_threads(before * self.ranks.local_world)
        try:
            yield
        finally:
            torch.set_num_threads(before)


def moe_weights(model: nn.Module) -> tuple[float, float] | None:
    """The (load-balancing, z-loss) weights of a mixture-of-experts model (``ffn="moe"``), else None."""
    config = getattr(model, "config", None)
    if getattr(config, "ffn", "dense") != "moe":
        return None
    return config.moe_aux_loss_weight, config.moe_z_loss_weight


def parallelize(task: Any, kind: str, ranks: Ranks, cfg: TrainConfig, *, on_cpu: bool) -> Parallel:
    """The parallel strategy of a run: rank 0 of an FSDP run copies the whole model first (its :attr:`~Parallel.
    weights`), then :func:`prepare_model` applies ``train.activation_checkpointing`` and ``train.compile`` and
    :func:`wrap` the engine. Call it once ``task.model`` holds the weights every rank starts from, and before
    building the optimizer.

    Args:
        task: the task, whose ``model`` is wrapped and whose ``loss`` the strategy calls.
        kind: ``"single"``, ``"ddp"`` or ``"fsdp"`` (:func:`resolve_parallel`).
        ranks: this process's ranks.
        cfg: the run's settings (dtype, FSDP CPU offload, activation checkpointing, compile).
        on_cpu: the model trains on the CPU.
    """
    model = task.model
    weights = copy.deepcopy(model) if kind == "fsdp" and ranks.main else model
    prepare_model(model, cfg.activation_checkpointing, cfg.compile)
    par = wrap(task, kind, ranks, dtype=cfg.dtype, cpu_offload=cfg.fsdp_cpu_offload, moe_weights=moe_weights(model))
    par.weights, par.on_cpu = weights, on_cpu
    return par


def resolve_parallel(setting: str | None, world: int) -> str:
    """The engine of a run: ``"single"`` for one process, else ``train.parallel`` (default ``"ddp"``)."""
    if world == 1:
        return "single"
    return setting or "ddp"


def wrap(task: Any, kind: str, ranks: Ranks, *, dtype: str = "float32", cpu_offload: bool = False,
         moe_weights: tuple[float, float] | None = None) -> Parallel:
    """Wrap ``task.model`` for ``kind`` (see :func:`resolve_parallel`); call it before building the optimizer,
    since FSDP replaces the parameters by their shards.

    Args:
        task: the task, whose ``loss`` uses ``task.model``.
        kind: ``"single"``, ``"ddp"`` or ``"fsdp"``.
        ranks: this process's ranks (the process group is initialized when ``world > 1``).
        dtype: ``train.dtype``; ``"bfloat16"`` gives FSDP a bf16 mixed-precision policy.
        cpu_offload: FSDP keeps parameter and optimizer shards in CPU memory (CUDA models only).
        moe_weights: a mixture-of-experts model's (load-balancing, z-loss) weights, else None.

    Raises:
        AiaynError: ``cpu_offload`` on a model that is already on the CPU.
    """
    module = TaskLoss(task, moe_weights)
    model = task.model
    if kind == "single":
        return Parallel(module, kind, ranks, model, moe_weights)
    device = next(model.parameters()).device
    if kind == "ddp":
        # an encoder's unused head (mlm_head in classification) and idle experts get no gradient in some steps
        unused = getattr(model.config, "arch", "") == "encoder" or getattr(model.config, "ffn", "") == "moe"
        # buffers (position tables, masks) are built alike on every rank: synced once at the start, not every step
        ddp = DistributedDataParallel(module, device_ids=[device.index] if device.type == "cuda" else None,
                                      forward_sync_buffers=False, find_unused_parameters=unused)
        return Parallel(ddp, kind, ranks, model, moe_weights)
    if cpu_offload and device.type == "cpu":
        raise AiaynError("train.fsdp_cpu_offload=true: the model is already in CPU memory (offloading moves "
                         "shards off a GPU); set it to false, or train on CUDA")
    options: dict[str, Any] = {}
    if dtype == "bfloat16":
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if cpu_offload:
        options["offload_policy"] = CPUOffloadPolicy()
    for layer in layers(model):
        fully_shard(layer, **options)
    fully_shard(module, **options)  # the root: embeddings, final norms, output layer
    return Parallel(module, kind, ranks, model, moe_weights)
