"""The rules of every server aiayn starts (:mod:`aiayn.local_server`), as decisions on headers: which hosts a server
answers to, which origins and sites may call it, and which bodies it reads. The servers themselves are driven over
HTTP in tests/integration/test_inspect_server.py."""

from __future__ import annotations

import asyncio
import socket

import pytest

from aiayn.local_server import AllowedHosts, LocalOnly, is_loopback, refusal, split_host

LOOPBACK = AllowedHosts.bound_to("127.0.0.1")


def test_a_host_header_is_split_into_host_and_port() -> None:
    assert split_host("localhost") == ("localhost", None)
    assert split_host("LocalHost:8000") == ("localhost", 8000)
    assert split_host("[::1]:8000") == ("::1", 8000)
    assert split_host("[0:0:0:0:0:0:0:1]") == ("::1", None)
    assert split_host("127.0.0.1:65535") == ("127.0.0.1", 65535)
    for bad in ("", ":80", "host:", "host:0", "host:65536", "host:８０", "[::1", "[nope]:80", "::1", "a b", "a/b",
                "user@host", "h\u00e9st"):
        assert split_host(bad) is None, bad


def test_loopback_names_and_the_bound_address_are_allowed() -> None:
    assert all(is_loopback(h) for h in ("localhost", "127.0.0.1", "127.255.0.9", "::1", "[::1]", "LOCALHOST"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "192.168.1.5", "localhost.evil.example.com", "128.0.0.1"))
    assert all(h in LOOPBACK for h in ("localhost", "127.0.0.1", "127.3.2.1", "::1"))
    assert not any(h in LOOPBACK for h in ("evil.example.com", "192.168.1.5", "0.0.0.0", "::2", 3))
    lan = AllowedHosts.bound_to("192.168.1.5")
    assert "192.168.1.5" in lan and "localhost" in lan and "192.168.1.6" not in lan
    named = AllowedHosts.bound_to("myhost.lan")
    assert "MyHost.lan" in named and "otherhost.lan" not in named
    assert "0:0:0:0:0:0:0:1" in AllowedHosts.bound_to("::1")


@pytest.mark.parametrize("wildcard", ["0.0.0.0", "::", ""])
def test_a_wildcard_bind_answers_any_address_and_this_machines_name(wildcard: str) -> None:
    every = AllowedHosts.bound_to(wildcard)
    me = socket.gethostname().lower()
    assert all(h in every for h in ("10.1.2.3", "fe80::1", me, f"{me}.local", "localhost"))
    assert "evil.example.com" not in every and f"{me}.evil.example.com" not in every
    assert "or any IP address" in every.describe()


def _why(method: str = "GET", path: str = "/api/record", host: str | None = "127.0.0.1:8000", **headers: str):
    named = {k.replace("_", "-"): v for k, v in headers.items()}
    if host is not None:
        named["host"] = host
    return refusal(method, path, "http", named, LOOPBACK, pages=("/",))


def test_what_is_refused_and_with_what_status() -> None:
    assert _why() is None and _why(host="localhost") is None and _why(host="[::1]:8000") is None
    assert _why(host="evil.example.com")[0] == 400 and _why(host=None)[0] == 400
    assert "no Host header" in _why(host=None)[1]
    assert _why(host="x" * 500)[1].count("x") == 60  # the client's text is cut
    own = "http://127.0.0.1:8000"
    assert _why(origin=own) is None and _why("POST", content_type="application/json", origin=own) is None
    assert _why(host="localhost", origin="http://localhost:80") is None  # the default port, written or not
    for origin in ("http://evil.example.com", "null", "http://localhost:8000", "http://127.0.0.1:8001",
                   "https://127.0.0.1:8000", "http://127.0.0.1:8000/path", "http://127.0.0.1:99999", "file://", ""):
        assert _why(origin=origin)[0] == 403, origin
        assert _why("POST", content_type="application/json", origin=origin)[0] == 403, origin
    for site in ("cross-site", "same-site", "Cross-Site"):
        assert _why(sec_fetch_site=site)[0] == 403 and _why(path="/", sec_fetch_site=site) is None
    assert _why(sec_fetch_site="same-origin") is None and _why(sec_fetch_site="none") is None
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data", "application/jsonx", ""):
        assert _why("POST", content_type=kind)[0] == 415, kind
    assert _why("POST")[0] == 415 and "no Content-Type" in _why("POST")[1]
    assert _why("PUT", content_type="text/plain")[0] == 415
    assert _why("POST", content_type="application/json; charset=utf-8") is None
    assert _why("GET", content_type="text/plain") is None  # only bodies are read as JSON
    assert _why("POST", host="evil.example.com", content_type="text/plain")[0] == 400  # the Host first


def _call(scope: dict) -> list[dict]:
    """What ``LocalOnly`` in front of an app that answers 200 sends for ``scope``."""
    sent: list[dict] = []

    async def app(scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})

    def refuse(status: int, message: str):
        async def respond(scope, receive, send) -> None:
            await send({"type": "http.response.start", "status": status, "headers": [], "message": message})
        return respond

    async def receive() -> dict:
        return {"type": "websocket.connect"}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(LocalOnly(app, LOOPBACK, refuse)(scope, receive, send))
    return sent


def test_the_middleware_answers_refusals_in_the_servers_own_format() -> None:
    def scope(kind: str = "http", **headers: str) -> dict:
        return {"type": kind, "method": "GET", "path": "/api/record", "scheme": "http",
                "headers": [(k.encode(), v.encode()) for k, v in headers.items()]}

    assert _call(scope(host="127.0.0.1:8000"))[0]["status"] == 200
    refused = _call(scope(host="evil.example.com"))[0]
    assert refused["status"] == 400 and "answers only to localhost" in refused["message"]
    assert _call(scope(host="127.0.0.1:8000", origin="http://evil.example.com"))[0]["status"] == 403
    assert _call(scope("websocket", host="evil.example.com")) == [{"type": "websocket.close", "code": 1008}]
    assert _call({"type": "lifespan"})[0]["status"] == 200  # not a request: passed on
