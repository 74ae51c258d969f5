"""Other sites' pages against the explorer's server, in a real browser (headless Chromium driven by Playwright).

DNS rebinding (another site's name resolved to 127.0.0.1, so that the browser takes the server for that site's own)
reads nothing: every answer is the JSON 400 of a foreign Host. A page of another origin that posts text/plain (no
preflight), posts JSON (a preflight), or fetches the record runs nothing and reads nothing: 403 each (its Origin is
refused first). Skipped where Playwright or a Chromium executable is missing, as test_inspect_browser.py is.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator

import pytest

from aiayn.inspect import inspect_text
from aiayn.pretrained import load_pretrained

sync_api = pytest.importorskip("playwright.sync_api", reason="the browser tests need the playwright package")
pytest.importorskip("starlette")
CHROMIUM = os.environ.get("AIAYN_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium executable (apt-get install chromium, or set "
                                                         "AIAYN_CHROMIUM)")
#: as in test_inspect_browser.py, and one more: evil.example.com resolves to 127.0.0.1 (a rebound name)
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--disable-sync",
         "--disable-background-networking", "--disable-component-update", "--disable-quic",
         "--host-resolver-rules=MAP evil.example.com 127.0.0.1"]


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context()
    yield context.new_page()
    context.close()


@pytest.fixture
def explorer(inspect_checkpoints, monkeypatch: pytest.MonkeyPatch):
    """The explorer's app wrapped so that the test sees what it answered: (app, texts the model ran on, [(method,
    path, Host, status)])."""
    import aiayn.inspect.record as record
    from aiayn.inspect.server import build_app

    pre = load_pretrained(inspect_checkpoints["lm"])
    app = build_app(pre, inspect_text(pre, "the small dog"))
    runs: list[str] = []
    answered: list[tuple[str, str, str, int]] = []
    real = record.inspect_text

    def counted(pre, text, *args, **kwargs):
        runs.append(text)
        return real(pre, text, *args, **kwargs)

    monkeypatch.setattr(record, "inspect_text", counted)

    async def seen(scope, receive, send) -> None:
        async def spy(message) -> None:
            if message["type"] == "http.response.start":
                host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
                answered.append((scope["method"], scope["path"], host, message["status"]))
            await send(message)
        await app(scope, receive, send if scope["type"] != "http" else spy)

    return seen, runs, answered


def test_a_rebound_name_reads_nothing(explorer, serve, page) -> None:
    app, runs, answered = explorer
    with serve(app) as url:
        port = int(url.rpartition(":")[2])
        evil = f"http://evil.example.com:{port}"
        for path in ("/", "/api/record"):
            response = page.goto(evil + path)
            assert response.status == 400 and "this server answers only to localhost" in response.json()["error"]
        # the page at the rebound name is same-origin with it to the browser: its fetch() is readable, and refused
        got = page.evaluate("""async () => {
            const record = await fetch("/api/record");
            const posted = await fetch("/api/inspect", {method: "POST", headers: {"Content-Type": "application/json"},
                                                         body: JSON.stringify({text: "the dog"})});
            return [record.status, await record.text(), posted.status, await posted.text()];
        }""")
        assert got[0] == 400 and got[2] == 400 and "tokens" not in got[1] + got[3]
        assert "answers only to" in json.loads(got[1])["error"]
        response = page.goto(url + "/")  # by its own name the page loads
        assert response.status == 200 and 'data-served="1"' in response.text()
    assert runs == [] and {(status, host.startswith("evil.")) for _, _, host, status in answered} == {(400, True),
                                                                                                (200, False)}


ATTACK = """<!doctype html><title>another site</title><script>
async function attack(target) {
  const out = {};
  const body = JSON.stringify({text: "the dog"});
  try { await fetch(target + "/api/inspect", {method: "POST", mode: "no-cors", body: body}); out.plain = "sent"; }
  catch (e) { out.plain = "failed"; }
  try { const r = await fetch(target + "/api/inspect", {method: "POST", body: body,
                                                          headers: {"Content-Type": "application/json"}});
        out.json = await r.text(); }
  catch (e) { out.json = "failed"; }
  try { const r = await fetch(target + "/api/record"); out.record = await r.text(); }
  catch (e) { out.record = "failed"; }
  return out;
}
</script>"""


def test_another_origins_page_runs_nothing_and_reads_nothing(explorer, serve, page) -> None:
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse
    from starlette.routing import Route

    app, runs, answered = explorer

    async def attacker(request):
        return HTMLResponse(ATTACK)

    with serve(app) as url, serve(Starlette(routes=[Route("/", attacker)])) as other:
        page.goto(other.replace("127.0.0.1", "localhost") + "/")  # another origin, on this machine
        out = page.evaluate("target => attack(target)", url)
    assert out == {"plain": "sent", "json": "failed", "record": "failed"}, out  # CORS keeps the answers from the page
    assert runs == []  # ... and the server ran nothing
    statuses = {(method, path): status for method, path, _, status in answered}
    assert statuses[("POST", "/api/inspect")] == 403  # the text/plain post, which needs no preflight (its Origin)
    assert statuses[("OPTIONS", "/api/inspect")] == 403  # the JSON post's preflight: the post is never sent
    assert statuses[("GET", "/api/record")] == 403
    assert len(answered) == 3, answered
