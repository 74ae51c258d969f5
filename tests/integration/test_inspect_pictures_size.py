"""The attention pictures stay readable and bounded: their size does not grow with the input, every axes holds a
panel (or is the colour bar), the title clears every panel, and a char-level language model's 57-token prompt is
drawn quickly and small.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path

import pytest
import torch

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from aiayn.viz.attention import (  # noqa: E402
    DPI,
    LABEL_PITCH,
    MAX_FIGURE_INCHES,
    MAX_PANEL_INCHES,
    attention_figure,
    matrix_figure,
    save_figure,
)

PROMPT = "ROMEO: But soft, what light through yonder window breaks?"  # 57 characters
MAX_PIXELS = (int(MAX_FIGURE_INCHES[0] * DPI), int(MAX_FIGURE_INCHES[1] * DPI))


def _weights(h: int, t: int, s: int, seed: int = 0) -> torch.Tensor:
    """(H, T, S) rows that sum to 1."""
    return torch.softmax(torch.randn(h, t, s, generator=torch.Generator().manual_seed(seed)), -1)


def _tokens(n: int, prefix: str = "t") -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def _drawn(fig):
    """Lay out and draw ``fig`` without writing it; returns its renderer (for extents in pixels at DPI)."""
    fig.set_dpi(DPI)
    fig.draw_without_rendering()
    return fig.canvas.get_renderer()


def _panels(fig) -> list:
    return [ax for ax in fig.axes if ax.images]


SHAPES = {  # name: (heads, query tokens, key tokens)
    "one head, a short input": (_weights(1, 5, 5), _tokens(5), _tokens(5)),
    "a 57-character prompt, 8 heads": (_weights(8, 57, 57), list(PROMPT), list(PROMPT)),
    "cross-attention, 10 over 300": (_weights(4, 10, 300), _tokens(10, "target"), _tokens(300, "source")),
    "12 heads of long subwords": (_weights(12, 40, 40), ["▁supercalifragilistic"[:2 + i % 20] for i in range(40)],
                                  ["▁$x$_" + str(i) + "\n" for i in range(40)]),
    "a long input, 16 heads": (_weights(16, 600, 600), _tokens(600), _tokens(600)),
}


@pytest.mark.parametrize("name", list(SHAPES))
def test_the_title_clears_every_panel_and_every_axes_holds_a_panel(name: str) -> None:
    w, queries, keys = SHAPES[name]
    fig = attention_figure(w, queries, keys, title=f"decoder self-attention, layer 0 ({name})")
    renderer = _drawn(fig)
    panels = _panels(fig)
    assert len(panels) == w.shape[0] + 1  # the mean, then each head
    assert [ax for ax in fig.axes if not ax.images] == [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert len(fig.axes) == len(panels) + 1  # one colour bar, no empty axes
    title = fig._suptitle.get_window_extent(renderer)
    boxes = [ax.get_tightbbox(renderer) for ax in fig.axes]  # each panel with its title, ticks and labels
    for box in boxes:
        assert not title.overlaps(box), name
        assert 0 <= box.x0 and box.x1 <= fig.bbox.width + 1 and 0 <= box.y0 and box.y1 <= fig.bbox.height + 1
    frames = [ax.get_window_extent(renderer) for ax in panels]
    for i, a in enumerate(frames):
        assert not any(a.overlaps(b) for b in frames[i + 1:]), name
    plt.close(fig)


def test_the_grid_leaves_no_empty_row_and_makes_no_empty_axes() -> None:
    for heads in range(1, 17):
        fig = attention_figure(_weights(heads, 6, 6), _tokens(6), _tokens(6))
        panels = _panels(fig)
        assert len(panels) == heads + 1 and len(fig.axes) == heads + 2
        spec = panels[0].get_subplotspec().get_gridspec()
        rows, cols = spec.get_geometry()
        assert rows * cols - len(panels) < cols, heads  # blank slots only in the last row
        assert {ax.get_subplotspec().num1 for ax in panels} == set(range(len(panels)))  # in order, no gaps
        plt.close(fig)
    fig = attention_figure(_weights(8, 6, 6), _tokens(6), _tokens(6), cols=4)  # 9 panels in 4 columns
    assert _panels(fig)[0].get_subplotspec().get_gridspec().get_geometry() == (3, 4) and len(fig.axes) == 10
    plt.close(fig)


def test_a_long_input_draws_a_bounded_picture_with_readable_labels(tmp_path: Path) -> None:
    w = _weights(16, 600, 600)
    fig = attention_figure(w, _tokens(600), _tokens(600), title="long")
    renderer = _drawn(fig)
    for ax in _panels(fig):
        box = ax.get_window_extent(renderer)
        assert box.width <= MAX_PANEL_INCHES * DPI + 1 and box.height <= MAX_PANEL_INCHES * DPI + 1
        for axis, inches in ((ax.xaxis, box.width / DPI), (ax.yaxis, box.height / DPI)):
            shown = [t for t in axis.get_ticklabels() if t.get_text()]
            assert len(shown) <= inches / LABEL_PITCH + 1  # never more labels than fit
    size = _png_size(save_figure(fig, tmp_path / "long.png"))
    assert size[0] <= MAX_PIXELS[0] and size[1] <= MAX_PIXELS[1]

    for r, c in ((1024, 512), (57, 57), (2, 3)):  # a position table, a mask, a tiny bias
        fig = matrix_figure(torch.randn(r, c), _tokens(r) if r == 57 else None, _tokens(c) if r == 57 else None,
                            title=f"{r} x {c}", symmetric=True)
        renderer = _drawn(fig)
        assert not fig.axes[0].title.get_window_extent(renderer).overlaps(fig.axes[1].get_tightbbox(renderer))
        size = _png_size(save_figure(fig, tmp_path / f"m{r}.png"))
        assert size[0] <= MAX_PIXELS[0] and size[1] <= MAX_PIXELS[1]


def test_a_short_input_labels_every_token() -> None:
    fig = attention_figure(_weights(4, 57, 57), list(PROMPT), list(PROMPT))
    left, bottom = _panels(fig)[0], _panels(fig)[-1]
    assert [t.get_text() for t in left.yaxis.get_ticklabels()] == list(PROMPT)  # every one, in order
    assert [t.get_text() for t in bottom.xaxis.get_ticklabels()] == list(PROMPT)
    plt.close(fig)


@pytest.fixture(scope="module")
def char_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random char-level language model with 8 heads that reads :data:`PROMPT`."""
    from aiayn import ModelConfig, build_model
    from aiayn.checkpoint import save_checkpoint
    from aiayn.tokenize import CharTokenizer

    tok = CharTokenizer.train([PROMPT])
    config = ModelConfig(arch="decoder", vocab_size=tok.vocab_size, d_model=32, n_heads=8, n_layers=2, d_ff=64,
                         max_len=128, dropout=0.0)
    torch.manual_seed(0)
    return save_checkpoint(tmp_path_factory.mktemp("charlm") / "lm", build_model(config).eval(), {
        "task": "lm", "model": config.to_dict(), "tokenizers": {"text": "tokenizer.json"}, "block_size": 128,
        "newline_symbol": None, "packing": False}, tokenizer_writer=lambda d: tok.save(d / "tokenizer.json"))


def test_a_57_token_prompt_is_drawn_small_and_quickly(char_lm: Path, tmp_path: Path) -> None:
    from aiayn.inspect import inspect_text
    from aiayn.inspect.pictures import write_pictures
    from aiayn.pretrained import load_pretrained

    record = inspect_text(load_pretrained(char_lm), PROMPT, digits=None)
    assert len(record["tokens"]["decoder"]) == 57
    start = time.perf_counter()
    files = write_pictures(record, tmp_path / "png")
    seconds = time.perf_counter() - start
    assert {p.name for p in files} >= {"decoder_layer0.png", "decoder_layer1.png"}
    for path in files:
        width, height = _png_size(path)
        assert width <= MAX_PIXELS[0] and height <= MAX_PIXELS[1], path.name
        assert path.stat().st_size < 1_000_000, path.name
    width, height = _png_size(tmp_path / "png" / "decoder_layer0.png")
    assert width * height < 6_000_000  # it was 8685 x 6514 (57 M pixels); now about 2060 x 2080
    assert seconds < 60, f"{len(files)} pictures took {seconds:.1f} s"  # about 3 s; only a gross slowdown fails
