"""The explorer's server, driven over real HTTP on loopback: the page, new inputs, and every limit.

Every bad body (not UTF-8, not JSON, nested 5,000 deep, a number of 5,000 digits, a lone surrogate, wrong types,
missing and unknown fields, too large, too slow, a client gone mid-body) gets one JSON 4xx with the reason, on a
connection that stays open; nothing reaches the server's log as a traceback. Overload gets JSON 429 with
Retry-After, whatever idle connections are open, and a port in use is one message and exit 2.

What another site's page could send is refused before the model runs (:mod:`aiayn.local_server`): a foreign Host
(DNS rebinding) gets JSON 400, a foreign Origin or a cross-site fetch of the API JSON 403, a POST that is not JSON
JSON 415; and a connection that sends half a request, or nothing, is closed within a bounded time.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from aiayn.cli.main import main  # noqa: E402
from aiayn.errors import AiaynError  # noqa: E402
from aiayn.inspect import inspect_text  # noqa: E402
from aiayn.inspect.server import Limits, bind, build_app, parse_json, serve  # noqa: E402
from aiayn.local_server import is_loopback  # noqa: E402
from aiayn.pretrained import load_pretrained  # noqa: E402

JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def lm(inspect_checkpoints: dict[str, Path]):
    pre = load_pretrained(inspect_checkpoints["lm"])
    return pre, inspect_text(pre, "the small dog")


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def server_log() -> Iterator[list[logging.LogRecord]]:
    """What the server logs during the test (uvicorn's loggers and aiayn's), as records."""
    handler = _Records()
    names = ["", "uvicorn", "uvicorn.error", "uvicorn.access", "aiayn.inspect"]
    for name in names:
        logging.getLogger(name).addHandler(handler)
    yield handler.records
    for name in names:
        logging.getLogger(name).removeHandler(handler)


def _no_traceback(records: list[logging.LogRecord], capfd: pytest.CaptureFixture) -> None:
    assert [r.getMessage() for r in records if r.exc_info or r.levelno >= logging.ERROR] == []
    assert "Traceback" not in capfd.readouterr().err


def _post(conn: http.client.HTTPConnection, body: bytes, path: str = "/api/inspect") -> tuple[int, dict, dict]:
    conn.request("POST", path, body=body, headers=JSON)
    response = conn.getresponse()
    raw = response.read()
    assert response.getheader("content-type", "").startswith("application/json"), raw[:200]
    return response.status, json.loads(raw), dict(response.getheaders())


def test_the_page_and_a_new_input(lm, serve) -> None:
    pre, first = lm
    with serve(build_app(pre, first)) as url, httpx.Client(base_url=url, timeout=30) as client:
        page = client.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert 'data-served="1"' in page.text and '"input":"the small dog"' in page.text
        assert client.get("/api/record").json()["tokens"] == first["tokens"]
        answer = client.post("/api/inspect", json={"text": "a red bird sings"})
        assert answer.status_code == 200
        assert answer.json()["tokens"]["decoder"] == ["a", "red", "bird", "sings"]
        assert answer.json() == inspect_text(pre, "a red bird sings")
        long_text = " ".join(["a red bird sings over the house ."] * 5)  # 40 tokens; the model reads the last 32
        cut = client.post("/api/inspect", json={"text": long_text}).json()["cut"]
        assert (cut["tokens"], cut["limit"], cut["kept"]) == (40, 32, "last")
        assert "40 tokens, more than the 32 the model takes" in cut["message"]
        icon = client.get("/favicon.ico")  # browsers ask for it; no 404 on every load
        assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg+xml")


def test_bad_requests_get_one_clear_answer(lm, serve) -> None:
    pre, first = lm
    limits = Limits(max_body=200, max_chars=40)
    with serve(build_app(pre, first, limits)) as url, httpx.Client(base_url=url, timeout=30) as client:
        big = client.post("/api/inspect", content=b'{"text": "' + b"a" * 300 + b'"}', headers=JSON)
        assert big.status_code == 413 and "over 200 bytes" in big.json()["error"]

        def chunks() -> Iterator[bytes]:  # no Content-Length: the body is counted as it streams
            yield b'{"text": "'
            for _ in range(10):
                yield b"a" * 50
            yield b'"}'

        streamed = client.post("/api/inspect", content=chunks(), headers=JSON)
        assert streamed.status_code == 413
        for body, message in ((b"not json", "not JSON"), (b'["a"]', "JSON object"), (b'{"text": ""}', "non-empty"),
                              (b'{"text": 3}', "non-empty"), (b'{"text": "' + b"b" * 41 + b'"}', "the most is 40"),
                              (b'{"text": "a", "beam": 0}', "beam"), (b'{"text": "a", "x": 1}', "unknown field")):
            answer = client.post("/api/inspect", content=body, headers=JSON)
            assert answer.status_code == 422 and message in answer.json()["error"], body
        for path, method, status in (("/api/inspect", "GET", 405), ("/nothing", "GET", 404),
                                     ("/api/record", "POST", 405)):
            answer = client.request(method, path, headers=JSON)
            assert answer.status_code == status and answer.json()["error"], path


#: bodies a client may send by mistake or on purpose, and a word of the answer each gets
BAD_BODIES = [
    (b"[" * 5000, 422, "nests"),
    (b'{"text": "a", "beam": ' + b"9" * 5000 + b"}", 422, "number"),
    (b'{"text": "a", "beam": 1' + b"0" * 30 + b"}", 422, "number"),
    (b'{"text": "the \\ud800 dog"}', 422, "lone surrogate"),
    (b'{"text": "\\udfff"}', 422, "lone surrogate"),
    (b'{"text": "the dog", "beam": 2}', 422, "translation"),
    (b'{"text": "the dog", "beam": 2.0}', 422, "translation"),
    (b'{"text": "a", "beam": NaN}', 422, "not JSON"),
    (b'{"text": ["a"]}', 422, "non-empty string"),
    (b'{"text": null}', 422, "non-empty string"),
    (b'{"text": true}', 422, "non-empty string"),
    (b'{"beam": 1}', 422, "missing field"),
    (b"{}", 422, "missing field"),
    (b'{"text": "a", "\\ud800": 1}', 422, "unknown field"),
    (b'"the dog"', 422, "JSON object"),
    (b"42", 422, "JSON object"),
    (b"", 422, "empty"),
    (b"\xff\xfe{}", 422, "not UTF-8"),
    (b'{"text": "a"', 422, "not JSON"),
    (b'{"text": "a"} trailing', 422, "not JSON"),
    (b'{"text": "' + "\u00e9".encode() * 3000 + b'"}', 422, "the most is 2000"),
    (b'{"text": "' + b"x" * 20_000 + b'"}', 413, "over 16384 bytes"),
]


def test_every_bad_body_gets_json_4xx_on_a_connection_that_stays_open(lm, serve, server_log, capfd) -> None:
    pre, first = lm
    with serve(build_app(pre, first)) as url:
        conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=30)
        conn.connect()
        own_port = conn.sock.getsockname()[1]
        for body, status, word in BAD_BODIES:
            got, answer, _ = _post(conn, body)
            assert (got, word in answer["error"]) == (status, True), (body[:60], answer)
            assert "Traceback" not in answer["error"] and "File \"" not in answer["error"]
            if got != 413:  # the server read the whole body, so this connection goes on
                assert conn.sock is not None and conn.sock.getsockname()[1] == own_port, body[:60]
                ok, record, _ = _post(conn, b'{"text": "the dog"}')
                assert ok == 200 and record["tokens"]["decoder"] == ["the", "dog"]
            else:
                conn.close()
                conn.connect()
                own_port = conn.sock.getsockname()[1]
        conn.close()
    _no_traceback(server_log, capfd)


@pytest.mark.parametrize("task", ["translation", "lm", "classification"])
def test_odd_texts_never_crash_a_model(inspect_checkpoints, serve, server_log, capfd, task: str) -> None:
    pre = load_pretrained(inspect_checkpoints[task])
    first = inspect_text(pre, "the dog")
    odd = ["\u0000", "the\u0000dog", "\U0001f436 \U0001f436", "e\u0301\u0301\u0301", "\u202edog", "\t\n\r ",
           "\ufeffthe dog", "zzzz qqqq", "\U0010ffff", "a" * 1999, ". . . . .", "<s> </s> <pad>"]
    with serve(build_app(pre, first)) as url, httpx.Client(base_url=url, timeout=60) as client:
        for text in odd:
            answer = client.post("/api/inspect", json={"text": text})
            assert answer.status_code in (200, 422), (text[:20], answer.text[:300])
            if answer.status_code == 200:
                assert answer.json()["input"] == text
        surrogate = client.post("/api/inspect", content=b'{"text": "the \\ud800 dog"}', headers=JSON)
        assert surrogate.status_code == 422 and "lone surrogate" in surrogate.json()["error"]
    _no_traceback(server_log, capfd)
    with pytest.raises(AiaynError, match="lone surrogate"):
        inspect_text(pre, "the \ud800 dog")


def test_a_client_that_leaves_mid_body_or_sends_slowly(lm, serve, server_log, capfd) -> None:
    pre, first = lm
    with serve(build_app(pre, first, Limits(body_timeout=0.5))) as url:
        host, port = url.removeprefix("http://").split(":")
        for _ in range(3):  # gone mid-body: nothing to answer, nothing in the log
            with socket.create_connection((host, int(port))) as s:
                s.sendall(b"POST /api/inspect HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 1000\r\n\r\n{\"text\": \"the")
            time.sleep(0.1)
        with socket.create_connection((host, int(port))) as s:  # too slow: 408
            s.settimeout(10)
            s.sendall(b"POST /api/inspect HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100\r\n\r\n{\"text\"")
            reply = b""
            while b"}" not in reply:
                part = s.recv(4096)
                if not part:
                    break
                reply += part
            assert reply.startswith(b"HTTP/1.1 408") and b"did not arrive within 0.5 s" in reply
        with httpx.Client(base_url=url, timeout=30) as client:
            assert client.post("/api/inspect", json={"text": "the dog"}).status_code == 200
    _no_traceback(server_log, capfd)


def test_work_is_bounded_in_number_and_time(lm, serve, monkeypatch: pytest.MonkeyPatch) -> None:
    pre, first = lm
    release = threading.Event()
    import aiayn.inspect.record as record

    real = record.inspect_text

    def slow(*args, **kwargs):
        release.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(record, "inspect_text", slow)
    limits = Limits(concurrency=1, timeout=0.5)
    with serve(build_app(pre, first, limits)) as url, httpx.Client(base_url=url, timeout=30) as client:
        results: list[int] = []
        first_call = threading.Thread(target=lambda: results.append(
            client.post("/api/inspect", json={"text": "the dog"}).status_code))
        first_call.start()
        time.sleep(0.2)
        busy = client.post("/api/inspect", json={"text": "the cat"})
        assert busy.status_code == 429 and busy.headers["retry-after"] == "2" and "busy" in busy.json()["error"]
        first_call.join(10)
        assert results == [504]  # past the time limit; it still holds its slot until it finishes
        assert client.post("/api/inspect", json={"text": "the cat"}).status_code == 429
        release.set()
        deadline = time.monotonic() + 10
        while client.post("/api/inspect", json={"text": "the cat"}).status_code == 429:
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_idle_connections_hold_no_slot(lm, serve) -> None:
    """uvicorn's limit_concurrency counted idle keep-alive connections and answered plain-text 503; the server
    limits model work only."""
    pre, first = lm
    with serve(build_app(pre, first)) as url:
        address = url.removeprefix("http://")
        idle = [http.client.HTTPConnection(address, timeout=30) for _ in range(12)]
        for conn in idle:  # each makes one request and then stays open, idle
            conn.request("GET", "/api/health")
            assert conn.getresponse().read() == b'{"ok":true,"task":"lm"}'
        with httpx.Client(base_url=url, timeout=30) as client:
            for _ in range(3):
                answer = client.post("/api/inspect", json={"text": "the dog"})
                assert answer.status_code == 200, answer.text
        for conn in idle:
            conn.close()


#: the load test: this many requests over this many keep-alive connections at once
LOAD_REQUESTS, LOAD_CONNECTIONS = 200, 20


def test_a_bounded_load_gets_200_or_429_and_the_server_answers_after(lm, serve, server_log, capfd) -> None:
    pre, first = lm
    want = inspect_text(pre, "a red bird sings")
    texts = ["the dog", "a red bird sings", "the cat sleeps near the river"]
    with serve(build_app(pre, first)) as url:
        address = url.removeprefix("http://")

        def client(n: int) -> list[tuple[int, str | None, int]]:
            conn = http.client.HTTPConnection(address, timeout=60)
            out = []
            for i in range(LOAD_REQUESTS // LOAD_CONNECTIONS):
                status, body, headers = _post(conn, json.dumps({"text": texts[(n + i) % 3]}).encode())
                out.append((status, headers.get("retry-after"), conn.sock.getsockname()[1]))
                if status == 200:
                    assert body["input"] == texts[(n + i) % 3]
                else:
                    assert "busy" in body["error"]
            conn.close()
            return out

        started = time.monotonic()
        with ThreadPoolExecutor(LOAD_CONNECTIONS) as pool:
            results = [r for rs in pool.map(client, range(LOAD_CONNECTIONS)) for r in rs]
        seconds = time.monotonic() - started
        counts = Counter(status for status, _, _ in results)
        assert len(results) == LOAD_REQUESTS and set(counts) <= {200, 429} and counts[200] > 0
        assert all(retry == "2" for status, retry, _ in results if status == 429)
        assert len({port for _, _, port in results}) == LOAD_CONNECTIONS  # keep-alive: one socket per client
        with httpx.Client(base_url=url, timeout=30) as after:
            answer = after.post("/api/inspect", json={"text": "a red bird sings"})
            assert answer.status_code == 200 and answer.json() == want
    _no_traceback(server_log, capfd)
    print(f"load: {LOAD_REQUESTS} requests over {LOAD_CONNECTIONS} keep-alive connections in {seconds:.1f} s: "
          f"{dict(sorted(counts.items()))}")


def test_json_that_this_server_reads() -> None:
    assert parse_json(b'{"text": "a", "beam": 2}') == {"text": "a", "beam": 2}
    assert parse_json(b'{"text": "[[[[[[[[[[[[[["}') == {"text": "[" * 14}  # brackets in strings are text
    for body in (b"[" * 9 + b"]" * 9, b'{"a": ' + b"1" * 40 + b"}", b'{"a": 1e999999999999999999999}'):
        with pytest.raises(Exception, match="nests|number"):
            parse_json(body)


def test_a_port_in_use_is_one_message_and_exit_2(inspect_checkpoints, capsys: pytest.CaptureFixture) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(AiaynError, match=f"port {port} on 127.0.0.1 is already in use"):
            bind("127.0.0.1", port)
        code = main(["inspect", "--checkpoint", str(inspect_checkpoints["lm"]), "--text", "the dog",
                     "--port", str(port)])
    out = capsys.readouterr()
    assert code == 2 and out.out == ""  # not the URL of the other server
    assert out.err.strip().splitlines() == [
        f"aiayn inspect: error: port {port} on 127.0.0.1 is already in use (by another server, perhaps another aiayn "
        "command); give another with --port, or --port 0 for any free one"]
    with pytest.raises(AiaynError, match="not an address of this machine"):
        bind("no-such-host.invalid", 0)
    with bind("127.0.0.1", 0) as free:
        assert free.getsockname()[1] > 0


def test_loopback_is_the_default_and_other_hosts_are_named() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5") and not is_loopback("example.org")
    from aiayn.cli.main import build_parser

    args = build_parser().parse_args(["inspect", "--checkpoint", "x"])
    assert args.host == "127.0.0.1" and args.port == 8000


def _connection(url: str) -> tuple[http.client.HTTPConnection, int]:
    """A connection to the server at ``url`` (not yet opened), and its port."""
    address = url.removeprefix("http://")
    return http.client.HTTPConnection(address, timeout=30), int(address.rpartition(":")[2])


def _ask(conn: http.client.HTTPConnection, method: str, path: str, headers: dict[str, str],
         body: bytes | None = None) -> tuple[int, dict]:
    """One request on ``conn`` with exactly these headers (``Host`` among them replaces http.client's): status and
    JSON answer."""
    conn.request(method, path, body=body, headers=headers)
    response = conn.getresponse()
    raw = response.read()
    assert response.getheader("content-type", "").startswith("application/json"), raw[:200]
    return response.status, json.loads(raw)


@pytest.fixture
def model_runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The texts the model is run on during the test."""
    import aiayn.inspect.record as record

    runs: list[str] = []
    real = record.inspect_text

    def counted(pre, text, *args, **kwargs):
        runs.append(text)
        return real(pre, text, *args, **kwargs)

    monkeypatch.setattr(record, "inspect_text", counted)
    return runs


#: Host headers a page of another site can make a browser send (its own name, rebound to 127.0.0.1)
FOREIGN_HOSTS = ["evil.example.com", "evil.example.com:{port}", "127.0.0.1.evil.example.com:{port}",
                 "localhost.evil.example.com", "0.0.0.0:{port}", "192.168.1.5:{port}", "[::2]:{port}", "local_host"]
#: the names of a server on loopback, with and without its port
LOOPBACK_HOSTS = ["localhost", "localhost:{port}", "LocalHost:{port}", "127.0.0.1", "127.0.0.1:{port}",
                  "127.1.2.3:{port}", "[::1]:{port}", "[::1]"]


def test_a_foreign_host_is_refused_and_loopback_names_pass(lm, serve, model_runs, server_log, capfd) -> None:
    """DNS rebinding: another site's name pointed at 127.0.0.1 reads nothing and runs nothing."""
    pre, first = lm
    with serve(build_app(pre, first)) as url:
        conn, port = _connection(url)
        for host in FOREIGN_HOSTS:
            for method, path, body in (("GET", "/api/record", None), ("GET", "/", None),
                                       ("POST", "/api/inspect", b'{"text": "the dog"}')):
                status, answer = _ask(conn, method, path, {"Host": host.format(port=port), **JSON}, body)
                assert status == 400 and set(answer) == {"error"}, (host, path, answer)
                assert "this server answers only to localhost, 127.0.0.1, [::1]" in answer["error"]
        assert model_runs == []
        for host in LOOPBACK_HOSTS:
            status, answer = _ask(conn, "GET", "/api/record", {"Host": host.format(port=port)})
            assert status == 200 and answer["tokens"] == first["tokens"], host
        status, answer = _ask(conn, "POST", "/api/inspect", {"Host": f"localhost:{port}", **JSON},
                              b'{"text": "the dog"}')
        assert status == 200 and model_runs == ["the dog"]
        conn.close()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:  # HTTP/1.0 without a Host
            s.sendall(b"GET /api/record HTTP/1.0\r\n\r\n")
            reply = b"".join(iter(lambda: s.recv(65536), b""))
        assert reply.startswith(b"HTTP/1.1 400") and b'{"error":"no Host header: this server' in reply
    _no_traceback(server_log, capfd)


def test_a_server_on_every_address_answers_addresses_and_its_machine_name(lm, serve) -> None:
    """``--host 0.0.0.0``: any IP address (it cannot be rebound) and this machine's name pass; other names do not.
    (The app is told its bind address; the test serves it on loopback.)"""
    pre, first = lm
    me = socket.gethostname()
    with serve(build_app(pre, first, host="0.0.0.0")) as url:
        conn, port = _connection(url)
        for host in (f"192.168.1.5:{port}", f"[fe80::1]:{port}", f"{me}:{port}", f"{me}.local:{port}",
                     f"localhost:{port}"):
            assert _ask(conn, "GET", "/api/record", {"Host": host})[0] == 200, host
        status, answer = _ask(conn, "GET", "/api/record", {"Host": f"evil.example.com:{port}"})
        assert status == 400 and "or any IP address" in answer["error"]
        conn.close()


#: Content-Types a page of another site may post without asking first, and others that are not JSON
NOT_JSON = ["text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x", "application/jsonp", "text/json", None]


def test_a_post_that_is_not_json_gets_415(lm, serve, model_runs, server_log, capfd) -> None:
    pre, first = lm
    with serve(build_app(pre, first)) as url:
        conn, _ = _connection(url)
        conn.connect()
        own_port = conn.sock.getsockname()[1]
        for kind in NOT_JSON:
            for path in ("/api/inspect", "/api/steps"):
                headers = {"Content-Type": kind} if kind is not None else {}
                status, answer = _ask(conn, "POST", path, headers, b'{"text": "the dog"}')
                assert status == 415 and "Content-Type: application/json" in answer["error"], (kind, answer)
                assert (kind or "no Content-Type") in answer["error"]
        assert model_runs == []
        assert conn.sock is not None and conn.sock.getsockname()[1] == own_port  # the connection goes on
        for kind in ("application/json", "application/json; charset=utf-8", "Application/JSON;charset=UTF-8"):
            status, answer = _ask(conn, "POST", "/api/inspect", {"Content-Type": kind}, b'{"text": "the dog"}')
            assert status == 200 and answer["tokens"]["decoder"] == ["the", "dog"], kind
        assert model_runs == ["the dog"] * 3
        conn.close()
    _no_traceback(server_log, capfd)


def test_a_foreign_origin_is_refused_for_every_method(lm, serve, model_runs, server_log, capfd) -> None:
    """A fetch() from another page (its Origin) reads nothing and runs nothing; the server's own page's does."""
    pre, first = lm
    with serve(build_app(pre, first)) as url:
        conn, port = _connection(url)
        foreign = ["http://evil.example.com", f"http://evil.example.com:{port}", "null", f"http://localhost:{port}",
                   f"http://127.0.0.1:{port + 1}", f"https://127.0.0.1:{port}", "http://127.0.0.1", "file://"]
        requests = [("GET", "/api/record", None), ("GET", "/", None), ("GET", "/api/health", None),
                    ("POST", "/api/inspect", b'{"text": "the dog"}'), ("POST", "/api/steps", b"{}")]
        for origin in foreign:
            for method, path, body in requests:
                status, answer = _ask(conn, method, path, {"Origin": origin, **JSON}, body)
                assert status == 403 and "only this server's own pages may call it" in answer["error"], (origin, path)
        assert model_runs == []
        own = f"http://127.0.0.1:{port}"  # the page's own fetch() calls send it on POST
        assert _ask(conn, "GET", "/api/record", {"Origin": own})[1]["tokens"] == first["tokens"]
        status, answer = _ask(conn, "POST", "/api/inspect", {"Origin": own, **JSON}, b'{"text": "the dog"}')
        assert status == 200 and answer["tokens"]["decoder"] == ["the", "dog"]
        status, _ = _ask(conn, "POST", "/api/inspect", {"Host": f"localhost:{port}", "Origin": f"http://localhost:{port}",
                                                        **JSON}, b'{"text": "the cat"}')
        assert status == 200 and model_runs == ["the dog", "the cat"]
        for site, path, want in (("cross-site", "/api/record", 403), ("same-site", "/api/record", 403),
                                 ("same-origin", "/api/record", 200), ("none", "/api/record", 200),
                                 ("cross-site", "/", 200), ("cross-site", "/favicon.ico", 200)):
            conn.request("GET", path, headers={"Sec-Fetch-Site": site})
            response = conn.getresponse()
            response.read()
            assert response.status == want, (site, path)
        conn.close()
    _no_traceback(server_log, capfd)


@contextlib.contextmanager
def _serving(pre, first, limits: Limits, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """:func:`serve` itself (as ``aiayn inspect`` runs it) in a thread on a free loopback port; yields its URL."""
    import uvicorn

    servers: list[uvicorn.Server] = []

    class Kept(uvicorn.Server):
        def __init__(self, config: uvicorn.Config) -> None:
            super().__init__(config)
            servers.append(self)

    monkeypatch.setattr(uvicorn, "Server", Kept)
    urls: list[str] = []
    thread = threading.Thread(target=serve, args=(pre, first), daemon=True,
                              kwargs={"port": 0, "limits": limits, "on_ready": urls.append})
    thread.start()
    deadline = time.monotonic() + 20
    while not (servers and servers[0].started):
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.02)
    try:
        yield urls[0].rstrip("/")
    finally:
        servers[0].should_exit = True
        thread.join(10)


def _closed_after(s: socket.socket, sent: bytes = b"", limit: float = 10.0) -> float:
    """Seconds until the server closes ``s`` after ``sent`` is sent on it (the test fails past ``limit``)."""
    started = time.monotonic()
    s.settimeout(limit)
    if sent:
        s.sendall(sent)
    try:
        while s.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return time.monotonic() - started


def test_a_connection_that_sends_half_a_request_is_closed(lm, model_runs, monkeypatch, server_log, capfd) -> None:
    """uvicorn has no timeout on a request's head: the server closes a connection whose head is late (Limits
    .header_timeout), from the connection's start or the previous answer, and never one whose request it serves."""
    pre, first = lm
    import aiayn.inspect.record as record

    counted = record.inspect_text

    def slow(*args, **kwargs):  # longer than the head's deadline
        time.sleep(1.5)
        return counted(*args, **kwargs)

    monkeypatch.setattr(record, "inspect_text", slow)
    with _serving(pre, first, Limits(header_timeout=0.5), monkeypatch) as url:
        address = ("127.0.0.1", int(url.rpartition(":")[2]))
        for sent in (b"GET /api/rec", b"", b"GET /api/record HTTP/1.1\r\nHost: 127.0.0.1\r\n", b"P"):
            with socket.create_connection(address) as s:
                seconds = _closed_after(s, sent)
            assert 0.3 < seconds < 3, (sent, seconds)
        with socket.create_connection(address) as s:  # one byte every 0.1 s: closed before the head is whole
            s.settimeout(10)
            started, trickled = time.monotonic(), b"GET /api/record HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
            sent = 0
            with pytest.raises((BrokenPipeError, ConnectionResetError)):
                for byte in trickled:
                    s.sendall(bytes([byte]))
                    sent += 1
                    time.sleep(0.1)
                    try:
                        if not s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT):
                            raise ConnectionResetError("closed by the server")
                    except BlockingIOError:  # open, nothing to read: go on trickling
                        pass
            assert 0.3 < time.monotonic() - started < 3 and sent < len(trickled), sent
        conn = http.client.HTTPConnection(*address, timeout=30)  # after an answer, half of the next request
        assert _ask(conn, "GET", "/api/health", {})[0] == 200
        seconds = _closed_after(conn.sock, b"GET /api/he")
        assert 0.3 < seconds < 3, seconds  # the deadline, not the 5 s keep-alive timeout (which it stops)
        conn.close()
        with httpx.Client(base_url=url, timeout=30) as client:  # 1.5 s of model work: not cut
            answer = client.post("/api/inspect", json={"text": "the dog"})
            assert answer.status_code == 200 and answer.json()["tokens"]["decoder"] == ["the", "dog"]
            refused = client.get("/api/record", headers={"Host": "evil.example.com"})  # serve() passes the rules on
            assert refused.status_code == 400 and "answers only to" in refused.json()["error"]
        assert model_runs == ["the dog"]
    _no_traceback(server_log, capfd)
