"""The explorer served on this machine: ``aiayn inspect --checkpoint DIR`` (Starlette on uvicorn).

``GET /`` is the explorer page; its input box posts ``{"text": "..."}`` to ``POST /api/inspect``, which answers
the new inspection record. The server binds the loopback address unless told otherwise, and guards the model:

- a body over :attr:`Limits.max_body` bytes is refused with 413, before it is read whole;
- a body that is not a JSON object with a non-empty ``text`` of at most :attr:`Limits.max_chars` characters
  (and an optional whole ``beam`` from 1 to 16) gets 422 with a message;
- at most :attr:`Limits.concurrency` inputs are accepted at once (they run one after another on the one model);
  one more gets 429 with ``Retry-After``;
- an input that runs past :attr:`Limits.timeout` seconds gets 504 (it finishes in the background, keeping its
  slot until then).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

from aiayn.errors import AiaynError


@dataclass(frozen=True)
class Limits:
    """What one server accepts: request body bytes, input characters, inputs at once, seconds per input."""

    max_body: int = 16_384
    max_chars: int = 2_000
    concurrency: int = 1
    timeout: float = 60.0


def _problem(body: Any, limits: Limits) -> str | None:
    """Why a request body is not an input, or None."""
    if not isinstance(body, dict):
        return 'the body must be a JSON object such as {"text": "a sentence"}'
    text = body.get("text")
    if not isinstance(text, str) or not text.strip():
        return '"text" must be a non-empty string'
    if len(text) > limits.max_chars:
        return f'"text" has {len(text)} characters; the most is {limits.max_chars}'
    beam = body.get("beam")
    if beam is not None and (not isinstance(beam, int) or isinstance(beam, bool) or not 1 <= beam <= 16):
        return '"beam" must be a whole number from 1 to 16'
    unknown = sorted(set(body) - {"text", "beam"})
    if unknown:
        return f"unknown field(s) {unknown}; give text and, for translation, beam"
    return None


def build_app(pre: Any, first: dict[str, Any], limits: Limits = Limits()) -> Any:
    """The Starlette application serving ``pre`` (a loaded checkpoint), showing the record ``first`` on its page."""
    import anyio
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, Response
    from starlette.routing import Route

    from aiayn.inspect.page import render_html
    from aiayn.inspect.record import inspect_text

    slots = threading.BoundedSemaphore(limits.concurrency)
    model_lock = threading.Lock()  # a recording pass sets recorders on the one model: passes take turns
    page = render_html(first, served=True)

    def error(status: int, message: str, **headers: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status, headers=headers)

    async def index(request: Request) -> Response:
        return HTMLResponse(page)

    async def first_record(request: Request) -> Response:
        return JSONResponse(first)

    async def health(request: Request) -> Response:
        return JSONResponse({"ok": True, "task": pre.task})

    async def read_body(request: Request) -> bytes | None:
        """The body, or None as soon as it passes the limit (declared or streamed)."""
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limits.max_body):
            return None
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limits.max_body:
                return None
            chunks.append(chunk)
        return b"".join(chunks)

    async def inspect(request: Request) -> Response:
        raw = await read_body(request)
        if raw is None:
            return error(413, f"the request body is over {limits.max_body} bytes; send a shorter text")
        try:
            body = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            return error(422, f'the body is not JSON ({e}); send {{"text": "a sentence"}}')
        problem = _problem(body, limits)
        if problem is not None:
            return error(422, problem)
        if not slots.acquire(blocking=False):
            return error(429, f"busy: {limits.concurrency} input(s) already running; try again shortly",
                         **{"Retry-After": "2"})
        done = threading.Event()
        result: dict[str, Any] = {}

        def work() -> None:
            try:
                with model_lock:
                    result["record"] = inspect_text(pre, body["text"], beam=body.get("beam"))
            except AiaynError as e:
                result["error"] = str(e)
            except Exception as e:  # noqa: BLE001 - the server answers 500 with the reason and goes on
                result["crash"] = f"{type(e).__name__}: {e}"
            finally:
                slots.release()
                done.set()

        threading.Thread(target=work, name="aiayn-inspect", daemon=True).start()
        if not await anyio.to_thread.run_sync(done.wait, limits.timeout):
            return error(504, f"the input took over {limits.timeout:g} s; try a shorter one")
        if "error" in result:
            return error(422, result["error"])
        if "crash" in result:
            return error(500, result["crash"])
        return JSONResponse(result["record"])

    return Starlette(routes=[Route("/", index), Route("/api/record", first_record), Route("/api/health", health),
                             Route("/api/inspect", inspect, methods=["POST"])])


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(pre: Any, first: dict[str, Any], host: str = "127.0.0.1", port: int = 8000,
          limits: Limits = Limits()) -> None:
    """Serve the explorer until interrupted (Ctrl-C)."""
    try:
        import uvicorn
    except ImportError:
        raise AiaynError("serving the explorer needs uvicorn and starlette: pip install 'aiayn[inspect]', or write "
                         "an offline file with --html OUT") from None
    uvicorn.run(build_app(pre, first, limits), host=host, port=port, log_level="warning",
                limit_concurrency=max(8, 4 * limits.concurrency), timeout_keep_alive=5)
