"""The processes of a data-parallel run: their ranks, the process group, and the launcher.

Every process (a *rank*) reads the same deterministic batch stream. An optimizer step draws ``accum x world``
micro-batches from it, exactly as a single process with ``accum x world`` accumulation steps would, and rank ``r``
computes micro-batches ``r, r + world, ...``. The engines that combine the ranks' gradients (DDP, FSDP2) live in
:mod:`aiayn.train.parallel`; rank 0 alone evaluates, logs and writes the checkpoint's ordinary files, while the
others wait at a barrier.

Runs are launched by torch's own launcher: ``torchrun --nproc-per-node N -m aiayn train ...`` (one machine, or
several with a rendezvous endpoint), whose ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` variables
:func:`init_from_env` reads; ``aiayn train --nproc N`` runs ``torch.distributed.run`` for this machine
(:func:`launch`). The backend is NCCL for CUDA and gloo otherwise.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import signal
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.run as torchrun
from torch import nn
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from aiayn.errors import AiaynError
from aiayn.train.stop_signals import STOP_SIGNALS, Stopped

TIMEOUT = datetime.timedelta(hours=3)  # a rank waits this long for rank 0's evaluations and checkpoints
SHUTDOWN_SECONDS = 120  # after a stop signal the launcher waits this long for the ranks' last step and save


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


def all_sum(values: list[float], ranks: Ranks) -> list[float]:
    """The sums of ``values`` over all ranks (one all-reduce in float64, so token counts stay exact)."""
    if ranks.world == 1:
        return list(values)
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


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


def launch(nproc: int, argv: list[str], env: dict[str, str] | None = None) -> None:
    """Run ``python -m aiayn *argv`` on ``nproc`` processes of this machine with ``torch.distributed.run``
    (torchrun's ``--standalone`` rendezvous), and wait for them.

    Each process gets ``OMP_NUM_THREADS`` (this process's thread count, unless set; the trainer shares it out
    among the ranks of a machine) and the variables ``env``. A failure in any rank stops the others and raises
    :class:`AiaynError`. SIGINT, SIGTERM, SIGHUP (unless ignored, as under ``nohup``) and SIGUSR1 are passed on to
    the ranks, which save their last step together (:mod:`aiayn.train.stop_signals`); the launcher waits
    :data:`SHUTDOWN_SECONDS` for them, then raises :class:`~aiayn.train.stop_signals.Stopped`. A rank that stops
    for a signal sent to it alone stops the others after the same step, and the same is raised.
    """
    if nproc < 1:
        raise AiaynError(f"--nproc {nproc}: need at least 1 process")
    nohup = signal.getsignal(signal.SIGHUP) is signal.SIG_IGN  # hang-ups are then meant to be ignored
    handled = [s.name for s in (*STOP_SIGNALS, signal.SIGQUIT) if not (nohup and s == signal.SIGHUP)]
    variables = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS") or str(torch.get_num_threads()), **(env or {})}
    before = {k: os.environ.get(k) for k in variables}
    os.environ.update(variables)
    args = torchrun.get_args_parser().parse_args(["--standalone", "--nnodes", "1", "--nproc-per-node", str(nproc),
                                         "--signals-to-handle", ",".join(handled),
                                         "--shutdown-timeout", str(SHUTDOWN_SECONDS), "--module", "aiayn", *argv])
    try:
        torchrun.run(args)
    except SignalException as e:  # the ranks were sent the signal and have saved their last step
        raise Stopped(e.sigval) from None
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        if failure.exitcode - 128 in STOP_SIGNALS:  # a rank was sent a stop signal; all of them saved and stopped
            raise Stopped(failure.exitcode - 128) from None
        raise AiaynError(f"rank {rank} of {nproc} stopped with exit code {failure.exitcode} (its message is above); "
                         "the other ranks were stopped") from None
    finally:  # this process's own settings are unchanged
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def finish(finished: bool) -> None:
    """Leave the process group at the end of a run: every rank done before any tears it down (rank 0 hosts the
    store the others talk to). A failed rank skips the barrier; the launcher stops the others."""
    if dist.is_available() and dist.is_initialized():
        if finished:
            dist.barrier()
        dist.destroy_process_group()
