"""Signals that stop a training run the way Ctrl-C does: the last whole step is saved, then the run ends.

The signals are the ones schedulers and terminals send before they kill a process: SIGINT (Ctrl-C), SIGTERM
(Kubernetes, Slurm, systemd, ``docker stop``), SIGHUP (a closed terminal or ssh connection) and SIGUSR1 (Slurm's
``--signal``). While :func:`stop_signals` is active they are handled in one of two ways:

- **at once** (one process): the handler raises :class:`Stopped`, a ``KeyboardInterrupt``, wherever the run is, so
  the trainer's interrupt path drops the batch in flight and saves the last whole step. Inside
  :meth:`StopSignals.held` (a step's update and its count) the raise waits for the block's end, so a step is applied
  whole or not at all. A second SIGINT during that save skips it (the save is rolled back, the earlier ``last/``
  kept); the other signals are then ignored, since the save under way is what their sender waits for.
- **deferred** (the ranks of a data-parallel run): the handler only records the signal. Each step's one collective
  carries every rank's record (:meth:`StopSignals.pending`), so all ranks learn of it after the same step and save
  that step together.

A SIGINT ignored by inheritance (a job started with ``&`` from a script) is handled all the same; a SIGHUP ignored
by inheritance (``nohup``) stays ignored, as its starter asked. The exit status of a stopped command is
``128 + signal number``, as a shell reports a process killed by that signal.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

#: the signals that stop a run, in the order :meth:`StopSignals.pending` reports them
STOP_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1") if hasattr(signal, name))


class Stopped(KeyboardInterrupt):
    """The run was asked to stop by ``signum``; the command exits with :attr:`exit_code`."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal_name(signum))
        self.signum = int(signum)

    @property
    def exit_code(self) -> int:
        """``128 + signum``, the status a shell gives a process that this signal ended."""
        return 128 + self.signum


def signal_name(signum: int) -> str:
    """``SIGTERM`` for 15, and so on."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def exit_code(error: BaseException) -> int:
    """The exit status for an interrupt: ``128 + signum`` for :class:`Stopped`, 130 (SIGINT's) otherwise."""
    return error.exit_code if isinstance(error, Stopped) else 128 + int(signal.SIGINT)


class StopSignals:
    """The handlers of one run (see the module's docstring). ``deferred``: record signals instead of raising."""

    def __init__(self, deferred: bool) -> None:
        self.deferred = deferred
        self.received: list[int] = []  # every stop signal, in arrival order
        self._previous: dict[int, object] = {}
        self._holding = False
        self._held_stop: int | None = None  # the signal a held block raises for as it ends

    def install(self) -> None:
        for sig in STOP_SIGNALS:
            before = signal.getsignal(sig)
            if sig == getattr(signal, "SIGHUP", None) and before is signal.SIG_IGN:
                continue  # nohup: hang-ups are meant to be ignored
            self._previous[sig] = before
            signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, before in self._previous.items():
            signal.signal(sig, before)  # type: ignore[arg-type]
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        first = not self.received
        self.received.append(signum)
        if self.deferred:
            return
        if first or signum == signal.SIGINT:  # a second Ctrl-C cuts the save short
            if not self._holding:
                raise Stopped(signum)
            if self._held_stop is None:
                self._held_stop = signum

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """The block runs to its end whatever arrives: a signal that would raise :class:`Stopped` (at once mode)
        raises it as the block ends instead."""
        before, self._holding = self._holding, True
        try:
            yield
        finally:
            self._holding = before
        if not before and self._held_stop is not None:
            signum, self._held_stop = self._held_stop, None
            raise Stopped(signum)

    @property
    def signum(self) -> int | None:
        """The first stop signal received, or None."""
        return self.received[0] if self.received else None

    def pending(self) -> list[float]:
        """One number per signal of :data:`STOP_SIGNALS`: 1.0 where this process received it. Summed over the
        ranks, any non-zero entry stops them all (:func:`agreed`)."""
        return [float(sig in self.received) for sig in STOP_SIGNALS]


def agreed(summed: list[float]) -> int | None:
    """The signal the ranks stop for, from :meth:`StopSignals.pending` summed over them (the first of
    :data:`STOP_SIGNALS` that any rank received), or None."""
    return next((int(sig) for sig, n in zip(STOP_SIGNALS, summed, strict=True) if n > 0), None)


_active: StopSignals | None = None


@contextlib.contextmanager
def stop_signals(deferred: bool) -> Iterator[StopSignals | None]:
    """Handle the stop signals while the block runs, and put the earlier handlers back after it.

    Nested uses share the outer one. Yields None outside the main thread, where Python cannot install handlers
    (the caller's own handling then stays).
    """
    global _active
    if _active is not None:
        yield _active
        return
    if threading.current_thread() is not threading.main_thread():
        yield None
        return
    handlers = StopSignals(deferred)
    handlers.install()
    _active = handlers
    try:
        yield handlers
    finally:
        _active = None
        handlers.restore()
