"""The explorer page: one self-contained HTML file (styles, scripts and the record inlined; nothing fetched).

``static/explorer.js`` draws the record's views; ``static/steps.js`` the step-through and neuron views."""

from __future__ import annotations

import html
import json
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote

#: the explorer's icon (a small heatmap), inlined into every page as a data URL and served at /favicon.ico
FAVICON_SVG = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 4 4"><rect width="4" height="4" fill="#22313f"/>'
               '<rect x="0" y="0" width="2" height="2" fill="#fde725"/><rect x="2" y="2" width="2" height="2" '
               'fill="#21918c"/><rect x="2" y="0" width="2" height="2" fill="#3b528b"/></svg>')


def _static(name: str) -> str:
    return resources.files("aiayn.inspect").joinpath("static", name).read_text(encoding="utf-8")


def render_html(record: dict[str, Any], *, served: bool = False) -> str:
    """The explorer page for an inspection record (:func:`aiayn.inspect.record.inspect_text`).

    Args:
        record: the record to show first.
        served: the page talks to an ``aiayn inspect`` server (its input box sends new texts to ``api/inspect``);
            False for an offline file, which shows the record only.
    Returns:
        the HTML text.
    """
    # every "<" escaped, so no text of the record ("</script>", "<!--") can end or bend the script element
    data = json.dumps(record, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")
    page = _static("explorer.html")
    script = _static("steps.js") + "\n" + _static("explorer.js")  # explorer.js last: it starts the page
    for marker, value in (("/*ICON*/", "data:image/svg+xml," + quote(FAVICON_SVG)),
                          ("/*STYLE*/", _static("explorer.css")), ("/*SCRIPT*/", script),
                          ("/*SERVED*/", "1" if served else "0"), ("/*RECORD*/", data)):
        page = page.replace(marker, value, 1)
    return page


def write_html(record: dict[str, Any], path: str | Path) -> Path:
    """Write the offline explorer page of ``record`` to ``path`` (parents made); returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(record), encoding="utf-8")
    return out


class ExplorerView:
    """The explorer of one record for a Jupyter notebook: displays itself (an isolated frame), or ``.save(path)``."""

    def __init__(self, record: dict[str, Any], height: int = 900) -> None:
        self.record, self.height = record, height

    def _repr_html_(self) -> str:
        page = html.escape(render_html(self.record), quote=True)
        return (f'<iframe srcdoc="{page}" style="width: 100%; height: {self.height}px; border: 1px solid #ccd;" '
                'sandbox="allow-scripts"></iframe>')

    def save(self, path: str | Path) -> Path:
        """Write the page as an offline HTML file."""
        return write_html(self.record, path)
