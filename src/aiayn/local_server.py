"""What every HTTP server aiayn starts refuses, whatever it serves (today the explorer of ``aiayn inspect``).

Such a server runs on the user's machine, on loopback unless told otherwise, and any web page open in the user's
browser can send requests to loopback too. These rules keep other sites' pages out, while curl, scripts and the
server's own pages pass:

- **Host** (against DNS rebinding, where another site's name is made to point at 127.0.0.1): a request must name the
  server by a loopback name (``localhost``, an address of 127.0.0.0/8, ``[::1]``; any port or none) or by the address
  it was started on (``--host``). A server bound to every address (``0.0.0.0`` or ``::``) also answers to any IP
  address (an address cannot be rebound; only a name can) and to this machine's name (``socket.gethostname()``, and
  that name with ``.local``). Anything else, or no Host at all: 400.
- **Origin**: a request that carries one (a browser's ``fetch()`` or form post from some page) must come from the
  server's own origin, ``scheme://host:port`` of the Host it was sent to; any other, ``null`` included: 403, whatever
  the method. A request without one (curl, a typed address, a link) passes.
- **Sec-Fetch-Site** ``cross-site`` or ``same-site`` (another site's page, or a page on another port): 403 on every
  path but the server's pages, which a link from anywhere may open; so another site's ``<script src>`` or
  ``<img src>`` of an API address gets nothing either.
- **Content-Type**: a POST, PUT or PATCH must be ``application/json`` (parameters such as ``charset`` allowed), which
  no page can send to another origin without first asking by a CORS preflight (that gets 403): else 415.
- **request heads in bounded time**: uvicorn (0.54) has no timeout on reading a request's head, so a client that
  opens a connection and sends half a request line, or nothing, holds it open for ever. :func:`uvicorn_config`
  serves over a uvicorn protocol that closes such a connection (:func:`h11_protocol`).

:class:`LocalOnly` applies the first four to an ASGI application and answers a refusal in the server's own error
format; :func:`refusal` is the same decision as a plain function.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import re
import socket
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from aiayn.errors import AiaynError

#: the methods whose body a server reads: each must say it is JSON
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
#: the Sec-Fetch-Site values of another site's page (or another port's), refused but on a server's pages
FOREIGN_SITES = frozenset({"cross-site", "same-site"})
_DEFAULT_PORT = {"http": 80, "https": 443}
_WEB_SCHEME = {"http": "http", "https": "https", "ws": "http", "wss": "https"}
_HOST = re.compile(r"(?:\[(?P<ip6>[0-9a-f:.]+)\]|(?P<name>[a-z0-9_.-]+))(?::(?P<port>[0-9]{1,5}))?", re.ASCII)


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``host`` as an IP address, or None where it is a name."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _canonical(host: str) -> str:
    """``host`` lowercase, without IPv6 brackets, an address in its short form (``0:0::1`` -> ``::1``)."""
    host = host.lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    address = _address(host)
    return str(address) if address is not None else host


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 with or without brackets) names this machine only: ``localhost``,
    an address of 127.0.0.0/8, or ::1."""
    host = _canonical(host)
    address = _address(host)
    return host == "localhost" or (address is not None and address.is_loopback)


def split_host(value: str) -> tuple[str, int | None] | None:
    """A Host header's host (as :func:`_canonical` writes it) and port (None where not given), or None where it is
    not ``host[:port]``: ``"[::1]:8000"`` -> ``("::1", 8000)``, ``"LocalHost"`` -> ``("localhost", None)``."""
    match = _HOST.fullmatch(value.strip().lower())
    if match is None or (match["ip6"] is not None and _address(match["ip6"]) is None):
        return None
    port = int(match["port"]) if match["port"] is not None else None
    if port is not None and not 0 < port < 65536:
        return None
    return _canonical(match["ip6"] or match["name"]), port


@dataclass(frozen=True)
class AllowedHosts:
    """The hosts a server answers to besides the loopback ones: ``names`` (as :func:`_canonical` writes them), and
    with ``any_address`` every IP address (a server bound to every address)."""

    names: frozenset[str] = frozenset()
    any_address: bool = False

    @classmethod
    def bound_to(cls, host: str, *also: str) -> AllowedHosts:
        """The hosts of a server bound to ``host`` (its ``--host``: a name or an address), and the names ``also``. A
        wildcard bind (``0.0.0.0``, ``::``) answers to any IP address and to this machine's name, bare and ``.local``
        (``socket.gethostname()``, which asks no DNS server)."""
        names = {_canonical(h) for h in (host, *also) if h}
        address = _address(_canonical(host))
        wildcard = not host or (address is not None and address.is_unspecified)
        if wildcard:
            me = socket.gethostname().lower()
            names |= {me, f"{me}.local"} if me else set()
        return cls(frozenset(names), wildcard)

    def __contains__(self, host: object) -> bool:
        """Whether a request naming ``host`` (a name or an address) is for this server."""
        if not isinstance(host, str):
            return False
        host = _canonical(host)
        return is_loopback(host) or host in self.names or (self.any_address and _address(host) is not None)

    def describe(self) -> str:
        """The hosts, in words, for an error message."""
        named = sorted(f"[{n}]" if ":" in n else n for n in self.names if not is_loopback(n))
        return ", ".join(["localhost", "127.0.0.1", "[::1]", *named]) + (" or any IP address" if self.any_address
                                                                       else "")


def _quote(value: str) -> str:
    """A client's header value, cut to 60 characters, quoted for a message."""
    return json.dumps(value[:60] + ("..." if len(value) > 60 else ""))


def _origin(value: str) -> tuple[str, str, int | None] | None:
    """An Origin header's scheme, host (canonical) and port (the scheme's default where not given), or None."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in _DEFAULT_PORT or not parts.hostname or parts.path or parts.query or parts.fragment:
        return None
    return parts.scheme, _canonical(parts.hostname), port if port is not None else _DEFAULT_PORT[parts.scheme]


def refusal(method: str, path: str, scheme: str, headers: Mapping[str, str], allowed: AllowedHosts,
            pages: Collection[str] = ("/",)) -> tuple[int, str] | None:
    """Why a request breaks the rules above, as ``(HTTP status, message for the client)``, or None where it may go on.

    Args:
        method, path, scheme: the request's (``scheme`` as the socket has it: ``http`` or ``https``, ``ws``, ``wss``).
        headers: its headers, names lowercase (the first of each name).
        allowed: the hosts the server answers to.
        pages: the paths a link from another site may open (the server's pages; everything else is its API).
    """
    raw = headers.get("host")
    host = split_host(raw) if raw is not None else None
    if host is None or host[0] not in allowed:
        named = "no Host header" if raw is None else f"Host {_quote(raw)}"
        return 400, (f"{named}: this server answers only to {allowed.describe()} (a page of another site may be "
                     "trying to reach it); open it by one of those")
    origin = headers.get("origin")
    web = _WEB_SCHEME.get(scheme, scheme)
    own = (web, host[0], host[1] if host[1] is not None else _DEFAULT_PORT.get(web))
    if origin is not None and _origin(origin) != own:
        return 403, (f"a request from the page at {_quote(origin)} is refused: only this server's own pages "
                     "may call it")
    if headers.get("sec-fetch-site", "").strip().lower() in FOREIGN_SITES and path not in pages:
        return 403, (f"a request for {path} from another site's page is refused: only this server's own pages may "
                     "call it")
    if method.upper() in BODY_METHODS:
        kind = headers.get("content-type", "")
        if kind.partition(";")[0].strip().lower() != "application/json":
            got = _quote(kind) if kind else "no Content-Type"
            return 415, f'{method} takes a JSON body with "Content-Type: application/json"; got {got}'
    return None


class LocalOnly:
    """ASGI middleware: a request that :func:`refusal` refuses is answered ``refuse(status, message)`` (an ASGI
    response in the server's own error format; a WebSocket is closed, code 1008), every other goes on to ``app``.

    Args:
        app: the ASGI application.
        allowed: the hosts it answers to (:meth:`AllowedHosts.bound_to` its ``--host``).
        refuse: ``(status, message) -> response``, the server's JSON error.
        pages: the server's pages, which a link from another site may open.
    """

    def __init__(self, app: Any, allowed: AllowedHosts, refuse: Callable[[int, str], Any],
                 pages: Collection[str] = ("/",)) -> None:
        self.app, self.allowed, self.refuse, self.pages = app, allowed, refuse, frozenset(pages)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            headers: dict[str, str] = {}
            for name, value in scope["headers"]:
                headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
            why = refusal(scope.get("method", "GET"), scope["path"], scope.get("scheme", "http"), headers,
                          self.allowed, self.pages)
            if why is not None:
                if scope["type"] == "websocket":
                    await receive()  # websocket.connect
                    await send({"type": "websocket.close", "code": 1008})
                else:
                    await self.refuse(*why)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def h11_protocol(header_timeout: float) -> type:
    """uvicorn's h11 HTTP protocol with a deadline on request heads: a connection whose next request head has not
    arrived whole ``header_timeout`` seconds after the connection opened, or after the previous answer was sent, is
    closed without an answer. A request being served is never cut: its answer starts the next deadline.

    uvicorn 0.54 has no such timeout: ``timeout_keep_alive`` runs only between requests and stops at the first byte
    of the next, ``h11_max_incomplete_event_size`` bounds a head's size (16 KiB) but not its time, and nothing runs
    on a connection that never sent a byte.
    """
    from uvicorn.protocols.http.h11_impl import H11Protocol  # optional: uvicorn

    class HeadDeadline(H11Protocol):
        """uvicorn's H11Protocol that closes a connection whose request head is late."""

        _deadline: Any = None

        def _arm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline = self.loop.call_later(header_timeout, self._late)

        def _late(self) -> None:
            # no request head since the deadline was set (a new one makes a new, unanswered cycle)
            waiting = self.cycle is None or self.cycle.response_complete
            if waiting and self.transport.get_protocol() is self and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            super().connection_lost(exc)

    return HeadDeadline


def uvicorn_config(app: Any, header_timeout: float, **options: Any) -> Any:
    """A ``uvicorn.Config`` serving ``app`` with request heads due within ``header_timeout`` seconds
    (:func:`h11_protocol`), idle keep-alive connections closed after 5 s, and no proxy headers believed (nothing
    stands in front of a local server: a request's scheme and client are its socket's). ``options``: other uvicorn
    settings (log_level, ...), which override these."""
    import uvicorn  # optional: uvicorn

    settings: dict[str, Any] = {"timeout_keep_alive": 5, "proxy_headers": False, "log_level": "warning", **options}
    return uvicorn.Config(app, http=h11_protocol(header_timeout), **settings)


# ------------------------------------------------------------------------------------------- request bodies

#: the deepest nesting of arrays and objects a request body may have
MAX_DEPTH = 8
#: the most digits a number in a request body may have
MAX_DIGITS = 12


class BadRequest(Exception):
    """A request the server refuses: the HTTP status and the message for the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


def _depth(raw: bytes) -> int:
    """How deep arrays and objects nest in a JSON text (strings skipped)."""
    depth = deepest = 0
    for ch in _STRING.sub(b'""', raw):
        if ch in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in b"]}":
            depth -= 1
    return deepest


def _number(kind: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        if len(text) > MAX_DIGITS + 8:
            raise ValueError(f"a number of {len(text)} characters; numbers here have at most {MAX_DIGITS} digits")
        return kind(text)
    return parse


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(raw: bytes, example: str = '{"text": "a sentence"}', depth: int = MAX_DEPTH) -> Any:
    """A request body as JSON, or :class:`BadRequest` (422) saying why not: not UTF-8, not JSON, nested deeper than
    ``depth``, a number over :data:`MAX_DIGITS` digits, NaN or Infinity; ``example`` is the body the message shows."""
    if not raw.strip():
        raise BadRequest(422, f"the body is empty; send a JSON object such as {example}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRequest(422, f"the body is not UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start}); send UTF-8 "
                              f"JSON such as {example}") from None
    found = _depth(raw)
    if found > depth:
        raise BadRequest(422, f"the body nests arrays or objects {found} deep; the most is {depth}: send a flat "
                              f"JSON object such as {example}")
    try:
        return json.loads(text, parse_int=_number(int), parse_float=_number(float), parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise BadRequest(422, f"the body is not JSON ({e.msg} at line {e.lineno}, column {e.colno}); send "
                              f"{example}") from None
    except (ValueError, RecursionError) as e:
        raise BadRequest(422, f"the body is not JSON that this server reads ({e}); send {example}") from None


def lone_surrogate(text: str) -> str | None:
    """Where ``text`` holds a lone surrogate (not Unicode text: JSON's ``"\\ud800"``), or None."""
    try:
        text.encode("utf-8")
        return None
    except UnicodeEncodeError as e:
        return f"a lone surrogate (\\u{ord(text[e.start]):04x}) at character {e.start}"


async def read_body(request: Any, max_body: int, timeout: float) -> bytes:
    """The body, or BadRequest: 413 as soon as it passes ``max_body`` bytes (declared or streamed), 408 when it has
    not arrived whole within ``timeout`` seconds."""
    import anyio  # optional: anyio (starlette's)

    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > max_body):
        raise BadRequest(413, f"the request body is over {max_body} bytes; send a shorter text")
    chunks, size = [], 0
    with anyio.move_on_after(timeout) as waited:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body:
                raise BadRequest(413, f"the request body is over {max_body} bytes; send a shorter text")
            chunks.append(chunk)
    if waited.cancelled_caught:
        raise BadRequest(408, f"the request body did not arrive within {timeout:g} s")
    return b"".join(chunks)


# ------------------------------------------------------------------------------------------------- sockets

def bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (port 0: a free one), ready for the server; an AiaynError naming the address
    and the fix when it cannot be had (in use, not this machine's, not allowed)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise AiaynError(f"--host {host}: not an address of this machine ({e.strerror}); give an address such as "
                         "127.0.0.1") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: a port in TIME_WAIT is free
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise AiaynError(f"port {port} on {host} is already in use (by another server, perhaps another aiayn "
                             "command); give another with --port, or --port 0 for any free one") from None
        if e.errno == errno.EACCES:
            raise AiaynError(f"port {port} on {host}: not allowed to this user (ports below 1024 need privileges); "
                             "give a port from 1024 with --port") from None
        raise AiaynError(f"cannot serve on {host}:{port}: {e.strerror}; give another --host or --port") from None
    return sock


def url_of(sock: socket.socket) -> str:
    """A server's address on a bound socket: ``http://HOST:PORT/``."""
    host, port = sock.getsockname()[:2]
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}/"
