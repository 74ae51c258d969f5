"""The explorer's server, driven over real HTTP: the page, new inputs, and every limit (413, 422, 429, 504)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from aiayn.inspect import inspect_text  # noqa: E402
from aiayn.inspect.server import Limits, build_app, is_loopback  # noqa: E402
from aiayn.pretrained import load_pretrained  # noqa: E402


@pytest.fixture(scope="module")
def lm(inspect_checkpoints: dict[str, Path]):
    pre = load_pretrained(inspect_checkpoints["lm"])
    return pre, inspect_text(pre, "the small dog")


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


def test_bad_requests_get_one_clear_answer(lm, serve) -> None:
    pre, first = lm
    limits = Limits(max_body=200, max_chars=40)
    with serve(build_app(pre, first, limits)) as url, httpx.Client(base_url=url, timeout=30) as client:
        big = client.post("/api/inspect", content=b'{"text": "' + b"a" * 300 + b'"}',
                          headers={"content-type": "application/json"})
        assert big.status_code == 413 and "over 200 bytes" in big.json()["error"]

        def chunks() -> Iterator[bytes]:  # no Content-Length: the body is counted as it streams
            yield b'{"text": "'
            for _ in range(10):
                yield b"a" * 50
            yield b'"}'

        streamed = client.post("/api/inspect", content=chunks(), headers={"content-type": "application/json"})
        assert streamed.status_code == 413
        for body, message in ((b"not json", "not JSON"), (b'["a"]', "JSON object"), (b'{"text": ""}', "non-empty"),
                              (b'{"text": 3}', "non-empty"), (b'{"text": "' + b"b" * 41 + b'"}', "the most is 40"),
                              (b'{"text": "a", "beam": 0}', "beam"), (b'{"text": "a", "x": 1}', "unknown field")):
            answer = client.post("/api/inspect", content=body, headers={"content-type": "application/json"})
            assert answer.status_code == 422 and message in answer.json()["error"], body
        assert client.get("/api/inspect").status_code == 405
        assert client.get("/nothing").status_code == 404


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
        assert busy.status_code == 429 and busy.headers["retry-after"] == "2"
        first_call.join(10)
        assert results == [504]  # past the time limit; it still holds its slot until it finishes
        assert client.post("/api/inspect", json={"text": "the cat"}).status_code == 429
        release.set()
        deadline = time.monotonic() + 10
        while client.post("/api/inspect", json={"text": "the cat"}).status_code == 429:
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_loopback_is_the_default_and_other_hosts_are_named() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5") and not is_loopback("example.org")
    from aiayn.cli.main import build_parser

    args = build_parser().parse_args(["inspect", "--checkpoint", "x"])
    assert args.host == "127.0.0.1" and args.port == 8000
