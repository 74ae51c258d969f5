"""Look inside a model: attention weights from the fast paths, an explorer in the browser, and pictures.

- :func:`capture_attention`: record the attention weights of any forward pass, SDPA and the CPU accelerator's
  decoding step included (:mod:`aiayn.inspect.capture`).
- :func:`inspect_text`: everything the explorer shows for one input, as a JSON-ready dict
  (:mod:`aiayn.inspect.record`).
- :func:`step_through`: every stage of one attention computation (a layer, head and query token) with the model's own
  numbers, and the neuron view of its scores (:mod:`aiayn.inspect.stepthrough`).
- :func:`show`: the explorer in a Jupyter notebook; :func:`~aiayn.inspect.page.write_html`: as an offline file;
  ``aiayn inspect`` serves it (:mod:`aiayn.inspect.server`) or draws it as PNG files (:mod:`aiayn.inspect.pictures`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiayn.inspect.capture import AttentionCapture, capture_attention
from aiayn.inspect.page import ExplorerView, render_html, write_html
from aiayn.inspect.record import inspect_text
from aiayn.inspect.stepthrough import step_through
from aiayn.pretrained import Pretrained, load_pretrained

__all__ = ["AttentionCapture", "ExplorerView", "capture_attention", "inspect_text", "render_html", "show",
           "step_through", "write_html"]


def show(checkpoint: str | Path | Any, text: str, **options: Any) -> ExplorerView:
    """The explorer of ``text`` run through a checkpoint, for display in Jupyter (the cell's value).

    Args:
        checkpoint: a checkpoint directory, or a loaded :class:`~aiayn.pretrained.Pretrained`.
        text: the input (a source sentence, a prompt, a text to classify).
        **options: passed to :func:`inspect_text` (``beam``, ``layers``, ``digits``, ``steps``: the step-through
            and neuron views show the explorer's first choice unless ``steps={"kind", "layer", "head", "query"}``
            names another).
    """
    pre = checkpoint if isinstance(checkpoint, Pretrained) else load_pretrained(checkpoint)
    return ExplorerView(inspect_text(pre, text, **{"steps": True, **options}))
