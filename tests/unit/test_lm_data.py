"""Tests for aiayn.data.lm: corpus reading, splitting, random and sequential blocks."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import torch

from aiayn.data.lm import (
    RandomBlockSampler,
    load_text_corpus,
    read_text,
    sequential_blocks,
    split_text,
)
from aiayn.errors import AiaynError

SHAKESPEARE = Path(__file__).resolve().parents[3] / "shared" / "data" / "tinyshakespeare" / "input.txt"


def test_read_text_plain_gz_and_crlf(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes("h\u00e9llo\r\nworld\n".encode())
    with gzip.open(tmp_path / "b.txt.gz", "wb") as f:
        f.write(b"ab\ncd\n")
    assert read_text(tmp_path / "a.txt") == "h\u00e9llo\nworld\n"
    assert read_text(tmp_path / "b.txt.gz") == "ab\ncd\n"


def test_read_text_invalid_utf8_names_line(tmp_path: Path) -> None:
    p = tmp_path / "bad.txt"
    p.write_bytes(b"fine\nalso fine\nbad \xff here\n")
    with pytest.raises(AiaynError, match=r"bad\.txt:3: invalid UTF-8.*re-encode"):
        read_text(p)


def test_load_text_corpus_file_and_folder(tmp_path: Path) -> None:
    (tmp_path / "one.txt").write_text("single corpus", encoding="utf-8")
    assert load_text_corpus(tmp_path / "one.txt") == "single corpus"
    d = tmp_path / "docs"
    d.mkdir()
    (d / "b.txt").write_text("second", encoding="utf-8")
    (d / "a.txt").write_text("first", encoding="utf-8")
    (d / "ignored.md").write_text("not a document", encoding="utf-8")
    assert load_text_corpus(d) == ["first", "second"]


def test_load_text_corpus_errors(tmp_path: Path) -> None:
    with pytest.raises(AiaynError, match="no such file or folder"):
        load_text_corpus(tmp_path / "missing.txt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(AiaynError, match=r"no \*\.txt file"):
        load_text_corpus(tmp_path / "empty")
    (tmp_path / "zero.txt").write_text("", encoding="utf-8")
    with pytest.raises(AiaynError, match="empty"):
        load_text_corpus(tmp_path / "zero.txt")


def test_split_text_is_nanogpt_split() -> None:
    text = "".join(chr(ord("a") + i % 26) for i in range(1000))
    train, val = split_text(text)
    assert train == text[:900] and val == text[900:]
    docs = [f"d{i}" for i in range(10)]
    assert split_text(docs, 0.2) == (docs[:8], docs[8:])
    with pytest.raises(AiaynError):
        split_text(text, 1.0)


def test_random_blocks_shift_and_range() -> None:
    ids = torch.arange(50)
    s = RandomBlockSampler(ids, block_size=8, batch_size=16, seed=0)
    for _ in range(20):
        x, y = s.next()
        assert x.shape == y.shape == (16, 8)
        torch.testing.assert_close(y, x + 1)  # contiguous windows of arange, shifted by one
        assert int(y.max()) <= 49
    assert s.step == 20


def test_random_blocks_cover_every_start() -> None:
    s = RandomBlockSampler(torch.arange(12), block_size=4, batch_size=64, seed=1)
    starts = {int(v) for _ in range(10) for v in s.next()[0][:, 0]}
    assert starts == set(range(8))  # N - T possible starts, like nanoGPT


def test_random_blocks_same_seed_same_batches() -> None:
    ids = torch.randint(0, 100, (500,), generator=torch.Generator().manual_seed(0))
    a = RandomBlockSampler(ids, 16, 4, seed=7)
    b = RandomBlockSampler(ids, 16, 4, seed=7)
    c = RandomBlockSampler(ids, 16, 4, seed=8)
    xa, xb, xc = a.next()[0], b.next()[0], c.next()[0]
    assert torch.equal(xa, xb)
    assert not torch.equal(xa, xc)


def test_random_blocks_resume_equals_uninterrupted() -> None:
    ids = torch.randint(0, 100, (500,), generator=torch.Generator().manual_seed(0))
    full = RandomBlockSampler(ids, 16, 4, seed=3)
    reference = [full.next() for _ in range(10)]

    first = RandomBlockSampler(ids, 16, 4, seed=3)
    for _ in range(4):
        first.next()
    state = first.state_dict()
    assert isinstance(state["generator_state"], torch.Tensor) and state["step"] == 4
    first.next()  # advancing after saving must not change the saved state

    resumed = RandomBlockSampler(ids, 16, 4, seed=999)
    resumed.load_state_dict(state)
    assert resumed.step == 4
    for k in range(4, 10):
        x, y = resumed.next()
        assert torch.equal(x, reference[k][0]) and torch.equal(y, reference[k][1])


def test_random_blocks_too_short_corpus() -> None:
    with pytest.raises(AiaynError, match="needs at least 9"):
        RandomBlockSampler(torch.arange(8), block_size=8, batch_size=1, seed=0)


@pytest.mark.parametrize("n", [2, 9, 10, 11, 33])
def test_sequential_blocks_cover_every_target_once(n: int) -> None:
    ids = torch.arange(n)
    xs, ys = [], []
    for x, y in sequential_blocks(ids, block_size=4, batch_size=3):
        assert x.shape == y.shape and x.dim() == 2 and x.shape[0] <= 3 and x.shape[1] <= 4
        torch.testing.assert_close(y, x + 1)
        xs.append(x.flatten())
        ys.append(y.flatten())
    assert torch.equal(torch.cat(ys), torch.arange(1, n))
    assert torch.equal(torch.cat(xs), torch.arange(0, n - 1))


@pytest.mark.skipif(not SHAKESPEARE.is_file(), reason=f"real corpus absent: {SHAKESPEARE}")
def test_tinyshakespeare_char_blocks() -> None:
    text = load_text_corpus(SHAKESPEARE)
    assert isinstance(text, str) and text.startswith("First Citizen:")
    train, val = split_text(text)
    assert len(train) + len(val) == len(text) and abs(len(val) / len(text) - 0.1) < 1e-4
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([stoi[c] for c in train[:10_000]])
    x, y = RandomBlockSampler(ids, 64, 8, seed=0).next()
    assert x.shape == (8, 64) and torch.equal(x[:, 1:], y[:, :-1])
