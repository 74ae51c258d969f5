"""The explorer served on this machine: ``aiayn inspect --checkpoint DIR`` (Starlette on uvicorn).

``GET /`` is the explorer page; its input box posts ``{"text": "..."}`` to ``POST /api/inspect``, which answers
the new inspection record, and its step-through and neuron views post a selection to ``POST /api/steps``
(:mod:`aiayn.inspect.stepthrough`). The server binds the loopback address unless told otherwise, and every answer
is JSON, an error as ``{"error": "what is wrong and what to do"}``:

- a request that another site's page could have sent is refused before anything is read (the rules of every server
  aiayn starts, :mod:`aiayn.local_server`): a Host that is not a loopback name or the ``--host`` it was started with
  gets 400 (DNS rebinding); an ``Origin`` that is not the server's own, or ``Sec-Fetch-Site: cross-site`` (or
  ``same-site``) on any address but the page's, 403; a POST that is not ``Content-Type: application/json``, 415.
  A request head that has not arrived whole :attr:`Limits.header_timeout` seconds after the connection opened (or
  after the previous answer) closes the connection;
- a body over :attr:`Limits.max_body` bytes is refused with 413 before it is read whole; one that does not arrive
  whole within :attr:`Limits.body_timeout` seconds gets 408; a client that leaves mid-body gets nothing and leaves
  nothing in the log;
- a body that is not a JSON object of the expected fields (not UTF-8, not JSON, nested deeper than
  :data:`aiayn.local_server.MAX_DEPTH`, a number of more than :data:`~aiayn.local_server.MAX_DIGITS` digits, a text
  with a lone surrogate, a wrong type, a missing or unknown field, a text over :attr:`Limits.max_chars` characters)
  gets 422 and the reason;
- at most :attr:`Limits.concurrency` inputs are accepted at once (they run one after another on the one model); one
  more gets 429 with ``Retry-After``. Only model work counts: idle keep-alive connections hold no slot;
- an input that runs past :attr:`Limits.timeout` seconds gets 504 (it finishes in the background, keeping its slot
  until then).

Client mistakes are answered without a traceback, in the answer or in the server's log, and the connection stays
open for the next request.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiayn.errors import AiaynError
from aiayn.inspect import record as records
from aiayn.inspect import stepthrough
from aiayn.inspect.page import FAVICON_SVG, render_html
from aiayn.local_server import (
    AllowedHosts,
    BadRequest,
    LocalOnly,
    bind,
    lone_surrogate,
    parse_json,
    read_body,
    url_of,
    uvicorn_config,
)

#: a request of the page: what it sends
EXAMPLE = '{"text": "a sentence"}'
log = logging.getLogger("aiayn.inspect")


@dataclass(frozen=True)
class Limits:
    """What one server accepts: request body bytes, input characters, inputs at once (running or waiting for the
    model), seconds per input, seconds for a body to arrive, seconds for a request's head to arrive."""

    max_body: int = 16_384
    max_chars: int = 2_000
    concurrency: int = 2
    timeout: float = 60.0
    body_timeout: float = 10.0
    header_timeout: float = 10.0


def _whole(body: dict[str, Any], name: str, low: int, high: int, what: str = "") -> int:
    value = body.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise BadRequest(422, f'"{name}" must be a whole number from {low} to {high}{what}; got '
                              f"{json.dumps(value)[:40]}")
    return value


def _fields(body: Any, required: set[str], optional: set[str]) -> dict[str, Any]:
    """``body`` as a dict of these fields, or 422 naming the missing and unknown ones."""
    if not isinstance(body, dict):
        raise BadRequest(422, f"the body must be a JSON object such as {EXAMPLE}; got a JSON "
                              f"{type(body).__name__.replace('dict', 'object').replace('list', 'array')}")
    missing, unknown = sorted(required - set(body)), sorted(set(body) - required - optional)
    if missing:
        raise BadRequest(422, f"missing field(s) {', '.join(missing)}")
    if unknown:
        names = ", ".join(json.dumps(k)[:40] for k in unknown)
        raise BadRequest(422, f"unknown field(s) {names}; give {', '.join(sorted(required | optional))}")
    return body


def input_request(body: Any, limits: Limits, pre: Any) -> tuple[str, int | None]:
    """The text and beam of an ``/api/inspect`` body, or :class:`BadRequest` (422) saying what is wrong."""
    body = _fields(body, {"text"}, {"beam"})
    text = body["text"]
    if not isinstance(text, str) or not text.strip():
        raise BadRequest(422, '"text" must be a non-empty string')
    if len(text) > limits.max_chars:
        raise BadRequest(422, f'"text" has {len(text)} characters; the most is {limits.max_chars}')
    bad = lone_surrogate(text)
    if bad:
        raise BadRequest(422, f'"text" holds {bad}, which is not Unicode text; send the text as UTF-8')
    beam = None
    if body.get("beam") is not None:
        tgt = pre.tokenizers.get("tgt") if pre.task == "translation" else None
        if tgt is None:
            raise BadRequest(422, f'"beam" applies to translation; this is a {pre.task} checkpoint')
        beam = _whole(body, "beam", 1, min(16, tgt.vocab_size))
    return text, beam


def answer(value: Any, status: int = 200, **headers: str) -> Any:
    """``value`` as a JSON response (a NaN or infinity the model computed is a 500 that says so)."""
    from starlette.responses import Response  # optional: starlette

    try:  # ASCII escapes: a message may quote a client's lone surrogate, which UTF-8 cannot carry
        body = json.dumps(value, ensure_ascii=status != 200, allow_nan=False, separators=(",", ":"))
    except ValueError:
        status, body = 500, json.dumps({"error": "the model computed NaN or infinite values for this input"})
    return Response(body.encode("utf-8"), status, headers=headers, media_type="application/json")


def error(status: int, message: str, **headers: str) -> Any:
    """``{"error": message}`` with ``status``."""
    return answer({"error": message}, status, **headers)


async def run_model(work: Callable[[], Any], slots: threading.BoundedSemaphore, model_lock: threading.Lock,
                    limits: Limits) -> Any:
    """``work()`` on the model in a slot, or 429 when every slot is taken; its value answered as JSON."""
    import anyio  # optional: anyio (starlette's)

    if not slots.acquire(blocking=False):
        return error(429, f"busy: {limits.concurrency} input(s) already running or waiting; try again in a "
                          "moment", **{"Retry-After": "2"})
    done = threading.Event()
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            with model_lock:
                result["value"] = work()
        except AiaynError as e:
            result["error"] = str(e)
        except Exception as e:  # noqa: BLE001 - the server answers 500 with the reason, logs it, and goes on
            log.error("aiayn inspect: the model failed on an input", exc_info=e)
            result["crash"] = f"the model failed on this input ({type(e).__name__}: {e})"
        finally:
            slots.release()
            done.set()

    threading.Thread(target=run, name="aiayn-inspect", daemon=True).start()
    if not await anyio.to_thread.run_sync(done.wait, limits.timeout):
        return error(504, f"the input took over {limits.timeout:g} s; try a shorter one")
    if "error" in result:
        return error(422, result["error"])
    if "crash" in result:
        return error(500, result["crash"])
    return answer(result["value"])


def build_app(pre: Any, first: dict[str, Any], limits: Limits = Limits(), host: str = "127.0.0.1",
              also: tuple[str, ...] = ()) -> Any:
    """The Starlette application serving ``pre`` (a loaded checkpoint), showing the record ``first`` on its page, to
    requests for ``host`` (its ``--host``), the names ``also`` or a loopback name (:mod:`aiayn.local_server`)."""
    from starlette.applications import Starlette  # optional: starlette
    from starlette.exceptions import HTTPException
    from starlette.middleware import Middleware
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import HTMLResponse, Response
    from starlette.routing import Route

    slots = threading.BoundedSemaphore(limits.concurrency)
    model_lock = threading.Lock()  # a recording pass sets recorders on the one model: passes take turns
    page = render_html(first, served=True)

    async def index(request: Request) -> Response:
        return HTMLResponse(page)

    async def favicon(request: Request) -> Response:
        return Response(FAVICON_SVG, media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"})

    async def first_record(request: Request) -> Response:
        return answer(first)

    async def health(request: Request) -> Response:
        return answer({"ok": True, "task": pre.task})

    def guarded(handler: Callable[[Request], Any]) -> Callable[[Request], Any]:
        """A POST handler whose client mistakes become one JSON error, and whose client may leave at any time."""
        async def endpoint(request: Request) -> Response:
            try:
                return await handler(request)
            except BadRequest as e:
                return error(e.status, e.message)
            except ClientDisconnect:  # nobody to answer; nothing to log
                return Response(status_code=400)
        return endpoint

    async def inspect(request: Request) -> Response:
        body = await read_body(request, limits.max_body, limits.body_timeout)
        text, beam = input_request(parse_json(body), limits, pre)
        return await run_model(lambda: records.inspect_text(pre, text, beam=beam), slots, model_lock, limits)

    async def steps(request: Request) -> Response:
        body = await read_body(request, limits.max_body, limits.body_timeout)
        selection = stepthrough.steps_request(parse_json(body), pre, BadRequest)
        return await run_model(lambda: stepthrough.step_record(pre, **selection), slots, model_lock, limits)

    async def http_error(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 500)
        if status == 404:
            return error(404, f"nothing at {request.url.path}; the explorer is at /")
        if status == 405:
            allowed = "POST" if request.url.path.startswith("/api/") and request.url.path not in (
                "/api/record", "/api/health") else "GET"
            return error(405, f"{request.method} {request.url.path}: use {allowed}", Allow=allowed)
        return error(status, getattr(exc, "detail", None) or "bad request")

    async def internal_error(request: Request, exc: Exception) -> Response:
        log.error("aiayn inspect: internal error on %s %s", request.method, request.url.path, exc_info=exc)
        return error(500, f"internal error ({type(exc).__name__}); the server goes on")

    app = Starlette(routes=[Route("/", index), Route("/favicon.ico", favicon), Route("/api/record", first_record),
                            Route("/api/health", health),
                            Route("/api/inspect", guarded(inspect), methods=["POST"]),
                            Route("/api/steps", guarded(steps), methods=["POST"])],
                    middleware=[Middleware(LocalOnly, allowed=AllowedHosts.bound_to(host, *also), refuse=error,
                                           pages=("/", "/favicon.ico"))],
                    exception_handlers={HTTPException: http_error, Exception: internal_error})
    return _Quiet(app)


class _Quiet:
    """An ASGI wrapper that keeps an exception Starlette re-raises after answering 500 (so that a server may log it)
    from reaching uvicorn, which would log it a second time and close the connection."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await self.app(scope, receive, send)
        except Exception:  # noqa: BLE001 - answered and logged once already, by the app's handler
            pass


def serve(pre: Any, first: dict[str, Any], host: str = "127.0.0.1", port: int = 8000, limits: Limits = Limits(),
          on_ready: Callable[[str], None] | None = None) -> None:
    """Serve the explorer until interrupted (Ctrl-C).

    Args:
        pre: the loaded checkpoint; first: the record the page shows first.
        host, port: where to listen (port 0: any free port).
        limits: what the server accepts.
        on_ready: called with the explorer's URL once the port is bound (not called when it cannot be).
    Raises:
        AiaynError: the port is in use or not allowed, the address is not this machine's, or uvicorn is missing.
    """
    try:
        import uvicorn  # optional: uvicorn
    except ImportError:
        raise AiaynError("serving the explorer needs uvicorn and starlette: pip install 'aiayn[inspect]', or write "
                         "an offline file with --html OUT") from None
    sock = bind(host, port)
    if on_ready is not None:
        on_ready(url_of(sock))
    # no limit_concurrency: uvicorn counts idle keep-alive connections in it and answers plain-text 503; the app
    # limits the model work itself (429 with Retry-After)
    app = build_app(pre, first, limits, host, also=(sock.getsockname()[0],))  # --host NAME: its address too
    server = uvicorn.Server(uvicorn_config(app, limits.header_timeout))
    with sock:
        server.run(sockets=[sock])
