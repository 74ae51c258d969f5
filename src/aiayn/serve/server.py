"""Start ``aiayn serve``: the model thread, the app, uvicorn; on SIGTERM or Ctrl-C, drain and stop.

uvicorn stops accepting connections on SIGTERM (or SIGINT) and waits up to ``grace`` seconds for the requests in
flight, streams included, which keep decoding meanwhile; then the model thread stops and the process exits 0.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from aiayn.errors import AiaynError
from aiayn.local_server import bind, url_of, uvicorn_config
from aiayn.pretrained import Pretrained
from aiayn.serve import metrics
from aiayn.serve.api import Limits, build_app
from aiayn.serve.engine import Engine
from aiayn.serve.model import ServedModel


def start_engine(served: ServedModel, max_batch: int, max_queue: int, prefill_chunk: int) -> Engine:
    """The model thread, started: a continuous batch for a language model."""
    batch = served.new_batch(max_batch, prefill_chunk) if served.kind == "lm" else None

    def observe(rows: int, seconds: float) -> None:
        metrics.BATCH.observe(rows)
        metrics.STEP.observe(seconds)
    engine = Engine(batch, max_queue, on_step=observe)
    engine.start()
    return engine


def serve(pre: Pretrained, *, name: str | None = None, checkpoint: str | Path = "model", host: str = "127.0.0.1",
          port: int = 8000, max_batch: int = 16, max_queue: int = 256, prefill_chunk: int = 512,
          api_key: str | None = None, limits: Limits | None = None, grace: float = 30.0,
          on_ready: Callable[[str], None] | None = None, log_level: str = "warning") -> None:
    """Serve ``pre`` until SIGTERM or Ctrl-C (see the module docstring).

    Raises:
        AiaynError: the port is in use or not allowed, the host is not this machine's, uvicorn is missing, or the
            checkpoint is of a task the server does not serve.
    """
    try:
        import uvicorn  # optional: uvicorn (aiayn[serve])
    except ImportError:
        raise AiaynError("aiayn serve needs uvicorn, starlette, jinja2 and prometheus_client: pip install "
                         "'aiayn[serve]'") from None
    limits = limits or Limits()
    served = ServedModel(pre, name or Path(checkpoint).resolve().name)
    sock = bind(host, port)
    engine = start_engine(served, max_batch, max_queue, prefill_chunk)
    try:
        app: Any = build_app(served, engine, limits, host, api_key, also=(sock.getsockname()[0],))
        server = uvicorn.Server(uvicorn_config(app, limits.header_timeout, timeout_graceful_shutdown=grace,
                                               log_level=log_level))
        if on_ready is not None:
            on_ready(url_of(sock))
        with sock, _stops_handled():
            server.run(sockets=[sock])
    finally:
        engine.stop()


@contextlib.contextmanager
def _stops_handled() -> Iterator[None]:
    """SIGTERM and SIGINT answered by a handler that does nothing, for the block: uvicorn catches them while it
    serves, drains, and then raises the signal again to the handler it found, so the process exits 0 after a
    drain instead of dying of the signal."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.signal(sig, lambda number, frame: None) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
