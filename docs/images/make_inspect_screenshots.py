"""Screenshots of the attention explorer for docs/inspect.md, taken in headless Chromium through Playwright.

    .venv/bin/python docs/images/make_inspect_screenshots.py TRANSLATION_CKPT [LM_CKPT CLASSIFIER_CKPT]

Without the language-model and classifier checkpoints, only the translation's pictures are taken.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from playwright.sync_api import sync_playwright

from aiayn.inspect import inspect_text, write_html
from aiayn.pretrained import load_pretrained

HERE = Path(__file__).resolve().parent
FLAGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync", "--disable-background-networking",
         "--disable-component-update"]
SENTENCE = "the dog sleeps because the woman sees the ball"
#: the step-through and neuron view: the last layer's cross-attention of the decoder reading "schläft" (index 3)
STEPS = {"kind": "cross", "layer": 1, "query": 3}
LONG = " ".join([SENTENCE] * 15)  # 135 words: the demo takes 128
SHOTS = [  # (checkpoint index, input, view, what to do first, element to picture (None: the page), file)
    (0, SENTENCE, "head", "#head-svg text.left[data-index='3']", None, "inspect-translation-head.png"),
    (0, SENTENCE, "alignment", None, None, "inspect-translation-alignment.png"),
    (0, SENTENCE, "model", "#model-grid canvas[data-layer='1'][data-head='0']", None,
     "inspect-translation-model-view.png"),
    (0, SENTENCE, "steps", None, ".stage-group[data-section='cross-attention']",
     "inspect-translation-step-through.png"),
    (0, SENTENCE, "neurons", None, "#view-neurons", "inspect-translation-neurons.png"),
    (0, LONG, "head", None, "#input-panel", "inspect-translation-long-input.png"),
    (1, "ROMEO:\nBut soft, what light through yonder window breaks", "model", None, None, "inspect-lm-model-view.png"),
    (2, "a gripping , beautifully acted film", "stats", None, None, "inspect-classifier.png"),
]


def peaked_head(pre: Any, layer: int, query: int) -> int:
    """The head of ``layer`` whose cross-attention from ``query`` is the most peaked (the largest weight)."""
    row = [head[query] for head in inspect_text(pre, SENTENCE)["attention"]["cross"][layer]]
    return max(range(len(row)), key=lambda h: max(row[h]))


def main(checkpoints: list[str]) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    translation = load_pretrained(checkpoints[0])
    steps = {**STEPS, "head": peaked_head(translation, STEPS["layer"], STEPS["query"])}
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=FLAGS)
        for index, text, view, action, element, name in SHOTS:
            if index >= len(checkpoints):
                continue
            pre = translation if index == 0 else load_pretrained(checkpoints[index])
            record = inspect_text(pre, text, steps=steps if index == 0 else True)
            page_file = write_html(record, Path(tmp) / f"{name}.html")
            page = browser.new_page(viewport={"width": 1100, "height": 760})
            page.goto(page_file.as_uri())
            page.wait_for_selector("body[data-ready='1']")
            page.click(f"#tabs button[data-view='{view}']")
            if action:
                page.hover(action) if view == "head" else page.click(action)
            if element:
                page.locator(element).screenshot(path=str(HERE / name))
            else:
                page.screenshot(path=str(HERE / name), full_page=True)
            page.close()
            print(f"wrote {HERE / name}")
        browser.close()


if __name__ == "__main__":
    main(sys.argv[1:])
