"""The server's one model thread: every request's model work runs here, batched with the others waiting.

Web handlers run on an event loop; the model runs on this thread, so a decoding step never blocks the loop and
requests never race on the model. Language models decode through :class:`aiayn.generate.continuous.ContinuousBatch`
(requests join and leave a running batch at step boundaries); translations waiting together are beam-searched as
one batch (:func:`aiayn.tasks.translation.translate_texts`), and embeddings likewise (:func:`aiayn.tasks.embedding
.embed`). A handler gets each new token through a callback it registers; :meth:`Engine.call` runs any other model
work (a translation batch, embeddings) and hands back its result.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from aiayn.generate.continuous import Continuation, ContinuousBatch

log = logging.getLogger("aiayn.serve")


class Engine:
    """A thread that owns the model (see the module docstring).

    Args:
        batch: the continuous batch of a language model, or None for a checkpoint of another task.
        max_queue: the most sequences waiting to join the batch; :meth:`submit` refuses more (the server's 429).
        on_step: called on the model thread after each decoding step with the rows it decoded and its seconds.
    """

    def __init__(self, batch: ContinuousBatch | None, max_queue: int = 256,
                 on_step: Callable[[int, float], None] = lambda rows, seconds: None) -> None:
        self.batch, self.max_queue, self.on_step = batch, max_queue, on_step
        self._inbox: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="aiayn-serve-model", daemon=True)
        self._posted = 0  # sequences submitted and not yet handed to the batch
        self._lock = threading.Lock()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """End the thread after its current step."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)

    @property
    def queued(self) -> int:
        """Sequences submitted but not yet decoding (read from any thread: a count of the moment)."""
        return self._posted + (self.batch.queued if self.batch is not None else 0)

    @property
    def running(self) -> int:
        """Sequences decoding now."""
        return self.batch.running if self.batch is not None else 0

    def submit(self, seqs: list[Continuation]) -> bool:
        """Queue sequences for the batch (all or none); False when the queue has no room for them."""
        with self._lock:
            if self.queued + len(seqs) > self.max_queue:
                return False
            self._posted += len(seqs)

        def add() -> None:
            for s in seqs:
                self.batch.add(s)
            with self._lock:
                self._posted -= len(seqs)
        self._post(add)
        return True

    def cancel(self, seqs: list[Continuation]) -> None:
        """Stop these sequences at the next step (a client that left)."""
        self._post(lambda: [self.batch.cancel(s) for s in seqs])

    def call(self, work: Callable[[], Any]) -> concurrent.futures.Future:
        """Run ``work()`` on the model thread between steps; its result or exception in the future."""
        future: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(work())
            except BaseException as e:  # noqa: BLE001 - handed to the waiting handler
                future.set_exception(e)
        self._post(run)
        return future

    def _post(self, job: Callable[[], None]) -> None:
        self._inbox.put(job)
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            while True:
                try:
                    job = self._inbox.get_nowait()
                except queue.Empty:
                    break
                job()
            batch = self.batch
            if batch is not None and batch.busy:
                rows, started = batch.running, time.perf_counter()
                try:
                    batch.step()
                except Exception:  # noqa: BLE001 - every request in the batch is answered, and the server goes on
                    log.exception("a decoding step failed; its requests end with an error")
                    batch.abandon("error")
                    continue
                self.on_step(rows, time.perf_counter() - started)
                continue
            self._wake.wait(0.5)
            self._wake.clear()


def wait_until(predicate: Callable[[], bool], timeout: float) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` seconds pass; whether it held."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True
