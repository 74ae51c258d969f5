"""The explorer in a real browser (headless Chromium driven by Playwright): the served page and the offline file.

Each test asserts what the page rendered (layers, heads, token labels, outputs) against the inspection record,
hovers and clicks, and saves a screenshot under ``runs/inspect-screenshots/``. Skipped where Playwright or a
Chromium executable is missing (``.ci/run`` installs Debian's ``chromium``; ``AIAYN_CHROMIUM`` names another one).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from aiayn.inspect import inspect_text, write_html
from aiayn.pretrained import load_pretrained

sync_api = pytest.importorskip("playwright.sync_api", reason="the browser tests need the playwright package")
CHROMIUM = os.environ.get("AIAYN_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium executable (apt-get install chromium, or set "
                                                         "AIAYN_CHROMIUM)")
SHOTS = Path(__file__).resolve().parents[2] / "runs" / "inspect-screenshots"
#: what a root process in a closed network needs to start Chromium quietly
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--disable-sync",
         "--disable-background-networking", "--disable-component-update", "--disable-quic"]


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    yield page
    context.close()
    assert not errors, errors  # no script error on the page


def _open(page, url: str) -> None:
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']", timeout=20_000)


def _texts(page, selector: str) -> list[str]:
    return page.locator(selector).all_text_contents()


def _show(token: str) -> str:  # as the page shows a token
    return token.replace("\n", "\u21b5").replace(" ", "\u2423")


def test_served_translation_explorer(inspect_checkpoints, serve, page) -> None:
    from aiayn.inspect.server import build_app

    pre = load_pretrained(inspect_checkpoints["translation"])
    record = inspect_text(pre, "the small dog runs .")
    with serve(build_app(pre, record)) as url:
        _open(page, url + "/")
        assert page.locator("#translation-text").text_content() == record["output"]["text"]
        # head view opens on cross-attention: decoder tokens on the left, encoder tokens on the right
        assert page.locator("#head-kind").input_value() == "cross"
        assert page.locator("#head-layer option").count() == 2
        assert page.locator("#head-swatches .swatch").count() == 4
        assert _texts(page, "#head-svg text.left") == [_show(t) for t in record["tokens"]["decoder"]]
        assert _texts(page, "#head-svg text.right") == [_show(t) for t in record["tokens"]["encoder"]]
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "translation-head-view.png"))
        # hovering a query token leaves only its lines
        page.hover("#head-svg text.left[data-index='1']")
        shown = page.locator("#head-svg line:not(.dim)")
        assert shown.count() > 0 and set(shown.evaluate_all("ls => ls.map(l => l.dataset.i)")) == {"1"}
        assert "hl" in (page.locator("#head-svg text.left[data-index='1']").get_attribute("class") or "")
        page.screenshot(path=str(SHOTS / "translation-head-view-hover.png"))
        page.mouse.move(5, 5)
        # a head's colour hides its lines; a double-click shows it alone
        page.click("#head-swatches .swatch[data-head='0']")
        assert "off" in page.locator("#head-swatches .swatch[data-head='0']").get_attribute("class")
        assert page.locator("#head-svg line[data-head='0']").count() == 0
        page.dblclick("#head-swatches .swatch[data-head='2']")
        heads = set(page.locator("#head-svg line").evaluate_all("ls => ls.map(l => l.dataset.head)"))
        assert heads == {"2"}
        # model view: layers x heads, a click enlarges one
        page.click("#tabs button[data-view='model']")
        assert page.locator("#model-grid canvas").count() == 2 * 4
        page.click("#model-grid canvas[data-layer='1'][data-head='2']")
        enlarged = page.locator("#model-enlarged")
        assert "layer 1, head 2" in enlarged.locator("h3").text_content()
        assert _texts(page, "#model-enlarged .row") == [_show(t) for t in record["tokens"]["decoder"]]
        values = [float(v) for v in enlarged.locator(".cell").evaluate_all("cs => cs.map(c => c.dataset.value)")]
        want = [v for row in record["attention"]["cross"][1][2] for v in row]
        assert values == pytest.approx(want, abs=1e-9)
        page.screenshot(path=str(SHOTS / "translation-model-view.png"))
        page.click("#tabs button[data-view='alignment']")
        assert page.locator("#alignment .cell").count() == len(record["tokens"]["decoder"]) * len(
            record["tokens"]["encoder"])
        page.screenshot(path=str(SHOTS / "translation-alignment.png"))
        # a new input through the form, answered by the server
        page.fill("#input-text", "a red bird sings .")
        page.click("#inspect-button")
        page.wait_for_function("document.querySelector('#input-shown').textContent.includes('a red bird')")
        new = inspect_text(pre, "a red bird sings .")
        page.click("#tabs button[data-view='head']")
        assert _texts(page, "#head-svg text.right") == [_show(t) for t in new["tokens"]["encoder"]]
        assert page.locator("#translation-text").text_content() == new["output"]["text"]


def test_offline_language_model_explorer(inspect_checkpoints, page, tmp_path: Path) -> None:
    pre = load_pretrained(inspect_checkpoints["lm"])
    record = inspect_text(pre, "a red bird sings over the house")
    path = write_html(record, tmp_path / "lm.html")
    _open(page, path.as_uri())
    assert page.locator("#input-form").is_hidden()  # offline: no server to send new inputs to
    tokens = _texts(page, "#next-bars .next-token")
    assert tokens == [_show(t) for t in record["output"]["tokens"][:15]]
    probs = [float(x) for x in _texts(page, "#next-bars .next-prob")]
    import math

    exact = [math.exp(x - record["output"]["log_z"]) for x in record["output"]["logits"][:15]]
    assert probs == pytest.approx(exact, abs=1e-4)  # temperature 1: the model's own probabilities
    page.fill("#top-k", "2")
    page.dispatch_event("#top-k", "input")
    kept = [float(x) for x in _texts(page, "#next-bars .next-prob")]
    assert all(p == 0 for p in kept[2:]) and sum(kept[:2]) == pytest.approx(1, abs=2e-4)
    page.fill("#top-k", "0")
    page.locator("#temperature").evaluate("e => { e.value = '0.3'; e.dispatchEvent(new Event('input')); }")
    sharper = [float(x) for x in _texts(page, "#next-bars .next-prob")]
    assert sharper[0] > probs[0]
    page.screenshot(path=str(SHOTS / "lm-next-token.png"))
    page.click("#tabs button[data-view='masks']")
    assert page.locator("#masks .figure").count() == 1
    assert "sliding window of 4" in page.locator("#masks h3").text_content()
    page.screenshot(path=str(SHOTS / "lm-masks.png"))
    page.click("#tabs button[data-view='positions']")
    assert "RoPE" in page.locator("#positions h3").first.text_content()
    assert page.locator("#tabs button[data-view='alignment']").is_disabled()


def test_offline_classifier_explorer(inspect_checkpoints, page, tmp_path: Path) -> None:
    pre = load_pretrained(inspect_checkpoints["classification"])
    record = inspect_text(pre, "the cat sleeps near the river ,")
    path = write_html(record, tmp_path / "cls.html")
    _open(page, path.as_uri())
    out = record["output"]
    assert page.locator("#prediction").text_content().startswith(f"Prediction: {out['prediction']}")
    page.click("#tabs button[data-view='stats']")
    assert page.locator("table.stats tr").count() == 1 + 2  # the header and a row per layer
    cells = _texts(page, "table.stats td.stat")
    want = [f"{s['entropy']:.3f}" for layer in record["stats"]["encoder"] for s in layer]
    assert cells == want
    page.select_option("#stats-metric", "first")
    assert _texts(page, "table.stats td.stat")[0] == f"{record['stats']['encoder'][0][0]['first']:.3f}"
    page.screenshot(path=str(SHOTS / "classifier-head-statistics.png"))
