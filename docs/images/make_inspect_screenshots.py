"""Screenshots of the attention explorer for docs/inspect.md, taken in headless Chromium through Playwright.

    .venv/bin/python docs/images/make_inspect_screenshots.py TRANSLATION_CKPT LM_CKPT CLASSIFIER_CKPT
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

from aiayn.inspect import inspect_text, write_html
from aiayn.pretrained import load_pretrained

HERE = Path(__file__).resolve().parent
FLAGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync", "--disable-background-networking",
         "--disable-component-update"]
SHOTS = [  # (checkpoint index, input, view, what to do first, file)
    (0, "the dog sleeps because the woman sees the ball", "head", "#head-svg text.left[data-index='3']",
     "inspect-translation-head.png"),
    (0, "the dog sleeps because the woman sees the ball", "alignment", None, "inspect-translation-alignment.png"),
    (1, "ROMEO:\nBut soft, what light through yonder window breaks", "model", None, "inspect-lm-model-view.png"),
    (2, "a gripping , beautifully acted film", "stats", None, "inspect-classifier.png"),
]


def main(checkpoints: list[str]) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=FLAGS)
        for index, text, view, action, name in SHOTS:
            page_file = write_html(inspect_text(load_pretrained(checkpoints[index]), text), Path(tmp) / f"{name}.html")
            page = browser.new_page(viewport={"width": 1100, "height": 760})
            page.goto(page_file.as_uri())
            page.wait_for_selector("body[data-ready='1']")
            page.click(f"#tabs button[data-view='{view}']")
            if action:
                page.hover(action) if view == "head" else page.click(action)
            page.screenshot(path=str(HERE / name), full_page=True)
            page.close()
            print(f"wrote {HERE / name}")
        browser.close()


if __name__ == "__main__":
    main(sys.argv[1:])
