"""Text reading/writing and parallel-corpus loading: strict UTF-8, alignment, bad-pair policies."""

from __future__ import annotations

import gzip
import re
import warnings
from pathlib import Path

import pytest

from aiayn.data.parallel import DataWarning, filter_by_token_length, load_parallel
from aiayn.data.text_io import read_lines, write_lines
from aiayn.errors import AiaynError

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def _write(path: Path, data: bytes) -> Path:
    if path.suffix == ".gz":
        data = gzip.compress(data)
    path.write_bytes(data)
    return path


# ---- text_io -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["a.txt", "a.txt.gz"])
def test_read_lines_strips_only_terminators(tmp_path: Path, name: str) -> None:
    p = _write(tmp_path / name, "\ufeffone \r\n\ttwo\n\nthree\u2028four\x1c five  ".encode())
    assert read_lines(p) == ["one ", "\ttwo", "", "three\u2028four\x1c five  "]
    assert read_lines(_write(tmp_path / ("b" + name), b"x\n")) == ["x"]
    assert read_lines(_write(tmp_path / ("c" + name), b"")) == []
    assert read_lines(_write(tmp_path / ("d" + name), b"\n")) == [""]


@pytest.mark.parametrize("name", ["latin1.txt", "latin1.txt.gz"])
def test_invalid_utf8_names_file_line_and_fix(tmp_path: Path, name: str) -> None:
    p = _write(tmp_path / name, "ok\nstill ok\nM\u00e4dchen\n".encode("latin-1"))
    with pytest.raises(AiaynError) as e:
        read_lines(p)
    msg = str(e.value)
    assert f"{p}:3:" in msg and "column 2" in msg
    assert "re-encode the file as UTF-8" in msg and "iconv -f latin1 -t utf-8" in msg


def test_missing_and_broken_files(tmp_path: Path) -> None:
    missing = tmp_path / "missing.en"
    with pytest.raises(AiaynError, match=re.escape(str(missing))):
        read_lines(missing)
    fake_gz = tmp_path / "plain.gz"
    fake_gz.write_bytes(b"not gzip at all")
    with pytest.raises(AiaynError, match="not a valid gzip"):
        read_lines(fake_gz)
    with pytest.raises(AiaynError, match="directory"):
        read_lines(tmp_path)


@pytest.mark.parametrize("name", ["out/hyp.txt", "out/hyp.txt.gz"])
def test_write_lines_round_trip_and_atomic(tmp_path: Path, name: str) -> None:
    lines = ["Ein Mann.", "", "  spaced\t", "中文"]
    p = tmp_path / name
    write_lines(p, lines)
    assert read_lines(p) == lines
    write_lines(p, ["replaced"])
    assert read_lines(p) == ["replaced"]
    assert [q.name for q in p.parent.iterdir()] == [p.name]  # no temp file left behind
    with pytest.raises(AiaynError, match="line break"):
        write_lines(p, ["a\nb"])
    assert read_lines(p) == ["replaced"]  # a failed write keeps the old file


# ---- load_parallel -------------------------------------------------------------------------------
@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    src = _write(tmp_path / "train.en.gz", b"A dog.\n\nA very long sentence indeed.\nTwo cats.\nHi\n")
    tgt = _write(tmp_path / "train.de", b"Ein Hund.\nLeer.\nEin sehr langer Satz.\nZwei Katzen.\n  \n")
    return src, tgt


def test_two_files_skip_policy(pair: tuple[Path, Path]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        corpus = load_parallel(*pair, max_len_chars=20, policy="skip")
    assert corpus.src == ["A dog.", "Two cats."]
    assert corpus.tgt == ["Ein Hund.", "Zwei Katzen."]
    assert corpus.line_numbers == [1, 4]
    assert corpus.stats == {"read": 5, "kept": 2, "skipped_empty": 2, "skipped_long": 1}
    assert len(corpus) == 2


def test_two_files_warn_policy_names_file_and_line(pair: tuple[Path, Path]) -> None:
    src, tgt = pair
    with pytest.warns(DataWarning) as record:
        corpus = load_parallel(src, tgt, max_len_chars=20)
    assert corpus.stats["kept"] == 2
    msgs = [str(w.message) for w in record]
    assert any(f"{src}:2" in m and f"{tgt}:2" in m and "empty source" in m for m in msgs)
    assert any(f"{src}:3" in m and "longer than max_len_chars=20" in m for m in msgs)
    assert any(f"{src}:5" in m and "empty target" in m for m in msgs)
    assert "skipped 2 empty, 1 over-length of 5 pairs read" in msgs[-1]
    assert all(w.filename == __file__ for w in record)  # warnings point at the caller


def test_warn_policy_caps_the_number_of_warnings(tmp_path: Path) -> None:
    src = _write(tmp_path / "s", b"\n" * 20 + b"x\n")
    tgt = _write(tmp_path / "t", b"y\n" * 21)
    with pytest.warns(DataWarning) as record:
        corpus = load_parallel(src, tgt, policy="warn")
    assert corpus.stats == {"read": 21, "kept": 1, "skipped_empty": 20, "skipped_long": 0}
    assert len(record) == 5 + 1  # the first five, then one summary


def test_error_policy_stops_at_first_bad_pair(pair: tuple[Path, Path]) -> None:
    src, tgt = pair
    with pytest.raises(AiaynError, match=re.escape(f"{src}:2 / {tgt}:2: empty source")):
        load_parallel(src, tgt, policy="error")
    only_long = (
        _write(src.parent / "l.en", b"short\nway too long here\n"),
        _write(src.parent / "l.de", b"k\nok\n"),
    )
    with pytest.raises(AiaynError, match=re.escape(f"{only_long[0]}:2") + ".*raise max_len_chars"):
        load_parallel(*only_long, max_len_chars=10, policy="error")


def test_mismatched_line_counts_name_both_files_and_counts(tmp_path: Path) -> None:
    src = _write(tmp_path / "val.en", b"a\nb\nc\n")
    tgt = _write(tmp_path / "val.de.gz", b"a\nb\n")
    with pytest.raises(AiaynError) as e:
        load_parallel(src, tgt)
    msg = str(e.value)
    assert str(src) in msg and str(tgt) in msg and "3 lines" in msg and "has 2" in msg


def test_tsv(tmp_path: Path) -> None:
    tsv = _write(tmp_path / "pairs.tsv", b"A dog.\tEin Hund.\n\nTwo cats.\tZwei Katzen.\n")
    corpus = load_parallel(tsv_path=tsv, policy="skip")
    assert corpus.src == ["A dog.", "Two cats."] and corpus.tgt == ["Ein Hund.", "Zwei Katzen."]
    assert corpus.line_numbers == [1, 3] and corpus.stats["skipped_empty"] == 1
    for bad in (b"ok\tgut\nno tab here\n", b"ok\tgut\ntwo\ttabs\there\n"):
        p = _write(tmp_path / "bad.tsv", bad)
        with pytest.raises(AiaynError, match=re.escape(f"{p}:2: expected exactly one tab")):
            load_parallel(tsv_path=p, policy="skip")


def test_argument_errors(pair: tuple[Path, Path], tmp_path: Path) -> None:
    src, tgt = pair
    with pytest.raises(AiaynError, match="not both"):
        load_parallel(src, tgt, tsv_path=tmp_path / "x.tsv")
    with pytest.raises(AiaynError, match="give both"):
        load_parallel(src)
    with pytest.raises(AiaynError, match="skip, warn, error"):
        load_parallel(src, tgt, policy="ignore")
    with pytest.raises(AiaynError, match=re.escape(str(tmp_path / "nope.de"))):
        load_parallel(src, tmp_path / "nope.de")


@pytest.mark.skipif(not (DATA / "multi30k" / "val.en.gz").exists(), reason="shared Multi30k data not present")
def test_multi30k_val_loads_cleanly() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        corpus = load_parallel(DATA / "multi30k" / "val.en.gz", DATA / "multi30k" / "val.de.gz")
    assert corpus.stats["read"] == 1014 and len(corpus) == corpus.stats["kept"] > 1000
    assert corpus.line_numbers[0] == 1


# ---- filter_by_token_length ----------------------------------------------------------------------
def test_filter_by_token_length_policies() -> None:
    src = [[5, 6], [5] * 9, [7], [8, 8, 8]]
    tgt = [[9], [9], [9] * 4, [9, 9, 9]]
    out = filter_by_token_length(src, tgt, 3, "skip")
    assert out.src == [[5, 6], [8, 8, 8]] and out.tgt == [[9], [9, 9, 9]] and out.kept == [0, 3]
    assert out.stats == {"read": 4, "kept": 2, "skipped_long": 2}
    with pytest.warns(DataWarning) as record:
        filter_by_token_length(src, tgt, 3, "warn", line_numbers=[10, 12, 13, 14], origin="train.de")
    assert [str(w.message) for w in record] == [
        "train.de:12: pair longer than 3 tokens (9 source, 1 target); skipping the pair",
        "train.de:13: pair longer than 3 tokens (1 source, 4 target); skipping the pair",
        "train.de: skipped 2 over-length of 4 pairs read",
    ]
    with pytest.raises(AiaynError, match=r"corpus, pair 2: pair longer than 3 tokens"):
        filter_by_token_length(src, tgt, 3, "error")
    with pytest.raises(AiaynError, match="align"):
        filter_by_token_length(src, tgt[:2], 3, "skip")


def test_filter_reports_the_file_lines_of_a_loaded_corpus(tmp_path: Path) -> None:
    src = _write(tmp_path / "s.txt", b"a b\n\nc d e f\ng\n")
    tgt = _write(tmp_path / "t.txt", b"x\n\ny\nz\n")
    with pytest.warns(DataWarning):
        corpus = load_parallel(src, tgt)  # line 2 is empty: the kept pairs are lines 1, 3, 4
    assert corpus.location(1) == f"{src}:3 / {tgt}:3"
    ids = [s.split() for s in corpus.src], [t.split() for t in corpus.tgt]
    with pytest.raises(AiaynError, match=re.escape(f"{src}:3 / {tgt}:3: pair longer than 3 tokens")):
        filter_by_token_length(*ids, 3, "error", origin=corpus.origin, locate=corpus.location)
    with pytest.warns(DataWarning) as record:
        filter_by_token_length(*ids, 3, "warn", origin=corpus.origin, locate=corpus.location)
    assert [str(w.message) for w in record] == [
        f"{src}:3 / {tgt}:3: pair longer than 3 tokens (4 source, 1 target); skipping the pair",
        f"{src} + {tgt}: skipped 1 over-length of 3 pairs read",
    ]
    tsv = load_parallel(tsv_path=_write(tmp_path / "p.tsv", b"a\tx\n\nb c d e\ty\n"), policy="skip")
    assert tsv.location(1) == f"{tmp_path / 'p.tsv'}:3"
