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
        assert page.locator("#notes .note").count() == 0
        # an input longer than the model takes: the page says so and shows what was kept
        long_text = " ".join(["the small dog runs near the river ."] * 10)  # 80 tokens; the model takes 64
        page.fill("#input-text", long_text)
        page.click("#inspect-button")
        page.wait_for_selector("#notes .note")
        cut = inspect_text(pre, long_text)["cut"]
        assert page.locator("#notes .note").first.text_content() == cut["message"]
        assert "80 tokens, more than the 64" in cut["message"]
        assert page.locator("#kept-text span").text_content() == cut["kept_text"]
        page.screenshot(path=str(SHOTS / "translation-long-input.png"))


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


def _values(page, selector: str) -> list[float]:
    return [float(v) for v in page.locator(selector).evaluate_all("cs => cs.map(c => c.dataset.value)")]


def _stage(steps: dict, name: str) -> list:
    return next(s for s in steps["stages"] if s["id"] == name)["values"]


def test_served_step_through_neurons_and_keyboard(inspect_checkpoints, serve, page) -> None:
    from aiayn.inspect.server import build_app
    from aiayn.inspect.stepthrough import step_record

    pre = load_pretrained(inspect_checkpoints["translation"])
    record = inspect_text(pre, "the small dog runs .")
    failed: list[str] = []
    page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    running, most = set(), [0]  # step-through requests in flight: the page asks one at a time

    def asked(r) -> None:
        if r.url.endswith("/api/steps"):
            running.add(r)
            most[0] = max(most[0], len(running))
    page.on("request", asked)
    page.on("requestfinished", lambda r: running.discard(r))
    page.on("requestfailed", lambda r: running.discard(r))
    with serve(build_app(pre, record)) as url:
        _open(page, url + "/")
        info = page.locator("#model-info").text_content()
        assert "paper-base's design at this size" in info and "d_model 32" in info and "d_ff 48" in info
        # every heatmap has its colour legend
        page.click("#tabs button[data-view='model']")
        page.click("#model-grid canvas[data-layer='0'][data-head='1']")  # (hidden views are drawn too)
        assert page.locator(".heatmap").count() == page.locator(".heatmap-box > .legend").count() > 0
        assert page.locator("#model-legend .legend").count() == 1 and page.locator("#stats .legend").count() == 1
        # the model view's scale: each head to its own maximum, or shared 0 to 1
        maxima = [float(m) for m in page.locator("#model-grid canvas").evaluate_all("cs => cs.map(c => c.dataset.max)")]
        want = [max(max(row) for row in head) for layer in record["attention"]["cross"] for head in layer]
        assert maxima == pytest.approx(want, abs=1e-9)
        page.select_option("#model-scale", "shared")
        assert set(page.locator("#model-grid canvas").evaluate_all("cs => cs.map(c => c.dataset.max)")) == {"1"}
        # keyboard: a thumbnail enlarges with Enter, arrows move between them
        page.focus("#model-grid canvas[data-layer='0'][data-head='0']")
        page.keyboard.press("ArrowRight")
        page.keyboard.press("ArrowDown")
        page.keyboard.press("Enter")
        assert "layer 1, head 1" in page.locator("#model-enlarged h3").text_content()
        # head view by keyboard: a head's colour toggles with Enter, shows alone with Shift+Enter; a focused token
        # keeps only its lines
        page.click("#tabs button[data-view='head']")
        page.focus("#head-swatches .swatch[data-head='1']")
        page.keyboard.press("Enter")
        assert page.locator("#head-swatches .swatch[data-head='1']").get_attribute("aria-pressed") == "false"
        assert page.locator("#head-svg line[data-head='1']").count() == 0
        page.keyboard.press("ArrowRight")
        page.keyboard.press("Shift+Enter")
        assert set(page.locator("#head-svg line").evaluate_all("ls => ls.map(l => l.dataset.head)")) == {"2"}
        page.focus("#head-svg text.left[data-index='0']")
        page.keyboard.press("ArrowDown")
        shown = page.locator("#head-svg line:not(.dim)")
        assert set(shown.evaluate_all("ls => ls.map(l => l.dataset.i)")) == {"1"}
        # the step-through: asked of the server for the chosen layer, head and query
        page.click("#tabs button[data-view='steps']")
        page.wait_for_selector("#steps .stage")
        t = len(record["tokens"]["decoder"])
        assert page.locator("#steps-kind").input_value() == "cross"
        first = step_record(pre, record["ids"], "cross", 0, 0, t - 1)
        assert _values(page, "#steps td.weights") == pytest.approx(_stage(first, "weights"), abs=1e-12)
        assert _values(page, "#steps .stage[data-id='q_proj'] .vcell") == pytest.approx(_stage(first, "q_proj"))
        assert _values(page, "#steps .stage[data-id='concat'] .vcell") == pytest.approx(_stage(first, "concat"))
        sections = page.locator("#steps .stage-group h3").all_text_contents()
        assert sections == ["input", "decoder self-attention", "cross-attention", "feed-forward", "output"]
        page.screenshot(path=str(SHOTS / "translation-step-through.png"), full_page=True)
        page.select_option("#steps-kind", "decoder")
        page.select_option("#steps-layer", "1")
        page.select_option("#steps-head", "3")
        page.select_option("#steps-query", "2")
        page.wait_for_function("document.querySelector('#steps .steps-what').textContent.includes('head 3 of 4, "
                               "query 2 (')")
        assert most[0] == 1
        chosen = step_record(pre, record["ids"], "decoder", 1, 3, 2)
        assert _values(page, "#steps td.weights") == pytest.approx(_stage(chosen, "weights"), abs=1e-12)
        assert _values(page, "#steps .stage[data-id='ffn_out'] .vcell") == pytest.approx(_stage(chosen, "ffn_out"))
        assert page.locator("#steps td.allowed").all_text_contents().count("\u2713") == 3  # causal: keys 0-2
        # the neuron view of the same selection: q, each k, their product, the scores
        page.click("#tabs button[data-view='neurons']")
        n = chosen["neurons"]
        assert page.locator("#neurons tr.key-row").count() == t
        assert _values(page, "#neurons td.score") == pytest.approx(n["scores"], abs=1e-12)
        assert _values(page, "#neurons tr.query-row .vcell") == pytest.approx(n["q"])
        assert _values(page, "#neurons tr[data-key='1'] td:nth-child(3) .vcell") == pytest.approx(n["qk"][1])
        assert page.locator("#neurons tr.masked").count() == t - 3
        page.screenshot(path=str(SHOTS / "translation-neuron-view.png"), full_page=True)
        # the beam control: greedy on request
        assert page.locator("#beam-label").is_visible() and page.locator("#beam").input_value() == "2"
        page.fill("#beam", "1")
        page.click("#inspect-button")
        page.wait_for_function("document.querySelector('#translation-text').parentNode.textContent.includes('greedy')")
    assert failed == []  # no 404 (a favicon) nor any other failed request


def test_served_language_model_keeps_its_sampling_controls(inspect_checkpoints, serve, page) -> None:
    from aiayn.inspect.server import build_app

    pre = load_pretrained(inspect_checkpoints["lm"])
    with serve(build_app(pre, inspect_text(pre, "the small dog"))) as url:
        _open(page, url + "/")
        assert page.locator("#beam-label").is_hidden()
        page.fill("#top-k", "3")
        page.dispatch_event("#top-k", "input")
        page.locator("#temperature").evaluate("e => { e.value = '0.5'; e.dispatchEvent(new Event('input')); }")
        page.fill("#input-text", "a red bird sings")
        page.evaluate("document.querySelector('#inspect-button').click(); document.querySelector('#inspect-button')"
                      ".click()")  # a double submit sends one request
        page.wait_for_function("document.querySelector('#input-shown').textContent.includes('a red bird')")
        assert page.locator("#status").text_content() == ""
        assert page.locator("#top-k").input_value() == "3" and page.locator("#temperature").input_value() == "0.5"
        kept = [float(x) for x in _texts(page, "#next-bars .next-prob")]
        assert all(p == 0 for p in kept[3:]) and sum(kept[:3]) == pytest.approx(1, abs=2e-4)


def test_offline_step_through_shows_the_one_it_holds(inspect_checkpoints, page, tmp_path: Path) -> None:
    pre = load_pretrained(inspect_checkpoints["classification"])
    record = inspect_text(pre, "the cat sleeps near the river ,", steps=True)
    _open(page, write_html(record, tmp_path / "cls.html").as_uri())
    page.click("#tabs button[data-view='positions']")
    title = page.locator("#positions h3").first.text_content()
    assert "(positions 0\u201331 of 64, dimensions 0\u201331 of 32: a part of the table)" in title
    page.click("#tabs button[data-view='steps']")
    held = record["steps"]
    assert (held["kind"], held["layer"], held["head"], held["query"]) == ("encoder", 0, 0, 8)
    assert _values(page, "#steps td.weights") == pytest.approx(_stage(held, "weights"), abs=1e-12)
    assert _values(page, "#steps .stage[data-id='embedding'] .vcell") == pytest.approx(_stage(held, "embedding"))
    page.select_option("#steps-head", "2")
    assert "holds the step-through of encoder self-attention, layer 0, head 0" in page.locator(
        "#steps-status").text_content()
    page.click("#steps-held")
    assert page.locator("#steps-head").input_value() == "0" and page.locator("#steps .stage").count() > 5
    page.click("#tabs button[data-view='neurons']")
    assert _values(page, "#neurons td.score") == pytest.approx(held["neurons"]["scores"], abs=1e-12)


def test_a_record_without_ids_has_no_step_through(inspect_checkpoints, page, tmp_path: Path) -> None:
    """An image's record (aiayn.inspect.image) has no token ids, cut nor notes: those views are off, the rest work."""
    record = inspect_text(load_pretrained(inspect_checkpoints["classification"]), "the cat sleeps")
    for key in ("ids", "cut", "notes"):
        del record[key]
    _open(page, write_html(record, tmp_path / "image-like.html").as_uri())
    assert page.locator("#tabs button[data-view='steps']").is_disabled()
    assert page.locator("#tabs button[data-view='neurons']").is_disabled()
    page.click("#tabs button[data-view='model']")
    assert page.locator("#model-grid canvas").count() == 2 * 4
