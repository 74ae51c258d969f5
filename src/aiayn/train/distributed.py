"""Data-parallel training over several processes with ``torch.distributed`` (gloo on CPU, NCCL on CUDA).

Every process (a *rank*) holds the whole model and reads the same deterministic batch stream. An optimizer
step draws ``accum x world`` micro-batches from that stream, exactly as a single process with
``accum x world`` accumulation steps would, and rank ``r`` computes micro-batches ``r, r + world, ...``.
Each rank divides its summed losses by the target count of *all* the step's micro-batches (every rank sees
every batch, so it knows that count without communicating); one all-reduce then sums the gradients. So a run
on ``world`` ranks makes the same updates as one process accumulating ``accum x world`` micro-batches, up to
the order of floating-point sums, and tests hold the two equal.

Rank 0 alone evaluates, writes checkpoints and logs; the others wait at a barrier. Each rank draws its own
dropout masks (seed + rank), and the checkpoint keeps every rank's RNG state, so a resumed run continues
exactly. Launch with ``aiayn train RECIPE --nproc N`` (processes on this machine) or under ``torchrun``,
whose ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``/``MASTER_PORT`` variables are honoured.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import socket
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from aiayn import accel
from aiayn.errors import AiaynError

TIMEOUT = datetime.timedelta(hours=3)  # a rank waits this long for rank 0's evaluations and checkpoints


@dataclass(frozen=True)
class Ranks:
    """This process's place in a data-parallel run (``world == 1``: an ordinary single-process run)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1

    @property
    def main(self) -> bool:
        """True on the rank that evaluates, logs and writes checkpoints."""
        return self.rank == 0

    @staticmethod
    def current() -> Ranks:
        """The ranks of the initialized default process group, or a single process when there is none."""
        if not (dist.is_available() and dist.is_initialized()):
            return Ranks()
        local = int(os.environ.get("LOCAL_RANK", dist.get_rank()))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))
        return Ranks(dist.get_rank(), dist.get_world_size(), local, local_world)

    def barrier(self) -> None:
        """Wait for every rank (no-op for one process)."""
        if self.world > 1:
            dist.barrier()

    def all_gather(self, obj: Any) -> list[Any]:
        """``[obj of rank 0, obj of rank 1, ...]`` on every rank (``[obj]`` for one process)."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out


def sum_gradients(params: Iterable[nn.Parameter], extras: list[float]) -> list[float]:
    """Sum every parameter's gradient (one all-reduce of a flat buffer) and the numbers ``extras`` over all ranks.

    A parameter without a gradient on some rank (unused by its micro-batches) counts as zeros there, so the
    flat buffer has the same layout on every rank.

    Args:
        params: the trainable parameters, in the same order on every rank; their ``.grad`` is replaced by the sum.
        extras: scalars to sum alongside (losses, token counts, flags).

    Returns:
        the summed ``extras``.
    """
    params = [p for p in params if p.requires_grad]
    if not params:
        raise AiaynError("the model has no trainable parameters to train")
    ref = params[0]
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).to(ref.dtype)
                      for p in params])
    # the extras travel in float64 on their own: a token count must survive the sum exactly
    extra = torch.tensor(extras, dtype=torch.float64, device=ref.device)
    dist.all_reduce(flat)
    dist.all_reduce(extra)
    offset = 0
    for p in params:
        p.grad = flat[offset:offset + p.numel()].view_as(p).to(p.dtype)
        offset += p.numel()
    return extra.tolist()


def broadcast_parameters(model: nn.Module, ranks: Ranks) -> None:
    """Copy rank 0's parameters and buffers to every rank (a no-op for one process)."""
    if ranks.world == 1:
        return
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t.data, src=0)


def check_same_files(writer: Callable[[Path], None], ranks: Ranks, what: str) -> None:
    """Refuse to train when ranks built different files (e.g. tokenizers trained separately on each rank).

    ``writer(directory)`` writes the files; their bytes are hashed on every rank and compared.
    """
    if ranks.world == 1:
        return
    with tempfile.TemporaryDirectory() as tmp:
        writer(Path(tmp))
        h = hashlib.sha256()
        for f in sorted(Path(tmp).rglob("*")):
            if f.is_file():
                h.update(f.name.encode() + b"\0" + f.read_bytes())
    digests = ranks.all_gather(h.hexdigest())
    if len(set(digests)) > 1:
        raise AiaynError(f"the ranks built different {what} (sha256 {', '.join(d[:12] for d in digests)}); "
                         "their training is not deterministic on this machine; train with --nproc 1 and report "
                         "this as a bug")


def init_from_env(device_type: str) -> Ranks:
    """Join the process group described by torchrun-style environment variables, when ``WORLD_SIZE > 1``.

    Backend: NCCL for CUDA, gloo otherwise. Returns this process's :class:`Ranks` (a single process when the
    variables are absent).
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Ranks.current()
    if not dist.is_available():
        raise AiaynError("WORLD_SIZE > 1 but this torch build has no torch.distributed")
    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=TIMEOUT)
    return Ranks.current()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(local_rank: int, nproc: int, port: int, keep_freed: bool, fn: Callable[..., Any], args: tuple,
            kwargs: dict) -> None:
    os.environ.update({"RANK": str(local_rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(nproc),
                       "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    if keep_freed:  # as the launching process does
        accel.setup_process()
    finished = False
    try:
        fn(*args, **kwargs)
        finished = True
    except AiaynError as e:
        print(f"aiayn train (rank {local_rank}): error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    finally:
        if dist.is_available() and dist.is_initialized():
            # every rank done before any tears the group down (rank 0 hosts the store the others talk to; once, in
            # CI, rank 1 aborted at exit with "terminate called without an active exception"). A failed rank skips
            # the barrier: the launcher stops the others.
            if finished:
                dist.barrier()
            dist.destroy_process_group()


def launch(fn: Callable[..., Any], nproc: int, *args: Any, **kwargs: Any) -> None:
    """Run ``fn(*args, **kwargs)`` in ``nproc`` new processes on this machine that form one process group.

    ``fn`` must be importable (a module-level function); it joins the group with :func:`init_from_env`.
    The processes get the accelerator's process settings (:func:`aiayn.accel.setup_process`) if this one has them.
    A failure in any rank stops the others and raises :class:`AiaynError`.
    """
    if nproc < 1:
        raise AiaynError(f"--nproc {nproc}: need at least 1 process")
    import torch.multiprocessing as mp

    try:
        mp.start_processes(_worker, args=(nproc, free_port(), accel.process_is_set_up(), fn, args, kwargs),
                           nprocs=nproc, start_method="spawn")
    except mp.ProcessExitedException as e:
        raise AiaynError(f"rank {e.error_index} of {nproc} stopped with exit code {e.exit_code} "
                         "(its message is above); the other ranks were stopped") from None
    except mp.ProcessRaisedException as e:
        raise AiaynError(f"a rank of {nproc} failed:\n{e}") from None
