"""Tests for aiayn.data.classification: labeled TSV/CSV reading and batch collation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from aiayn.data.classification import collate_classification, load_labeled_text
from aiayn.errors import AiaynError

SST2 = Path(__file__).resolve().parents[3] / "shared" / "data" / "sst2"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_bytes(text.encode("utf-8"))
    return p


def test_tsv_with_header_crlf_and_quotes(tmp_path: Path) -> None:
    p = _write(tmp_path, "t.tsv", 'label\tsentence\r\n1\ta "great" film \r\n0\tdull\r\n\r\n1\tfun\r\n')
    d = load_labeled_text(p)
    assert d.texts == ['a "great" film', "dull", "fun"]
    assert d.labels == [1, 0, 1] and d.label_names == ["0", "1"]
    assert d.lines == [2, 3, 5] and len(d) == 3


def test_header_text_first_and_string_labels(tmp_path: Path) -> None:
    p = _write(tmp_path, "t.tsv", "content\tlabel\nnice\tpos\nbad\tneg\nokay\tneutral\n")
    d = load_labeled_text(p)
    assert d.texts == ["nice", "bad", "okay"]
    assert d.label_names == ["neg", "neutral", "pos"] and d.labels == [2, 0, 1]


def test_numeric_labels_sort_numerically(tmp_path: Path) -> None:
    p = _write(tmp_path, "t.tsv", "".join(f"{k}\ttext {k}\n" for k in (10, 2, 1)))
    d = load_labeled_text(p)  # no header: column 0 = label, column 1 = text
    assert d.label_names == ["1", "2", "10"] and d.labels == [2, 1, 0]
    assert d.texts == ["text 10", "text 2", "text 1"] and d.lines == [1, 2, 3]


def test_csv_with_quoting_and_named_columns(tmp_path: Path) -> None:
    p = _write(tmp_path, "t.csv", 'id,review,stars\n1,"good, really",5\n2,meh,3\n')
    d = load_labeled_text(p, text_column="review", label_column="stars")
    assert d.texts == ["good, really", "meh"] and d.label_names == ["3", "5"] and d.labels == [1, 0]
    d2 = load_labeled_text(p, text_column=1, label_column=2)
    assert d2.texts == d.texts and d2.labels == d.labels


def test_sniffs_format_without_known_suffix(tmp_path: Path) -> None:
    p = _write(tmp_path, "data.txt", "0\thello\n1\tworld\n")
    assert load_labeled_text(p).texts == ["hello", "world"]
    q = _write(tmp_path, "data2.txt", "0,hello\n1,world\n")
    assert load_labeled_text(q).labels == [0, 1]


def test_dev_uses_train_label_names(tmp_path: Path) -> None:
    train = load_labeled_text(_write(tmp_path, "train.tsv", "label\ttext\nb\tx\na\ty\n"))
    dev = load_labeled_text(_write(tmp_path, "dev.tsv", "label\ttext\nb\tz\n"), label_names=train.label_names)
    assert dev.label_names == ["a", "b"] and dev.labels == [1]
    with pytest.raises(AiaynError, match=r"dev2\.tsv:3: label 'c' is not one of"):
        load_labeled_text(
            _write(tmp_path, "dev2.tsv", "label\ttext\na\tz\nc\tw\n"), label_names=train.label_names
        )


@pytest.mark.parametrize(
    "content,pattern",
    [
        ("label\tsentence\n1\tok\n0\ttoo\tmany\n", r"t\.tsv:3: 3 columns where the header has 2"),
        ("label\tsentence\n1\tok\n0\t  \n", r"t\.tsv:3: empty text"),
        ("label\tsentence\n1\tok\n\tnolabel\n", r"t\.tsv:3: empty label"),
        ("label\tsentence\n", r"no examples"),
        ("\n\n", r"empty"),
    ],
)
def test_errors_name_file_and_line(tmp_path: Path, content: str, pattern: str) -> None:
    p = _write(tmp_path, "t.tsv", content)
    with pytest.raises(AiaynError, match=pattern):
        load_labeled_text(p)


def test_ambiguous_header_asks_for_columns(tmp_path: Path) -> None:
    p = _write(tmp_path, "h.tsv", "text\tsentence\tstars\nx\ty\t1\n")
    with pytest.raises(AiaynError, match=r"h\.tsv:1: cannot tell the label and text columns"):
        load_labeled_text(p)
    assert load_labeled_text(p, label_column="stars").texts == ["y"]  # 'sentence' is preferred


def test_missing_file_and_unknown_column(tmp_path: Path) -> None:
    with pytest.raises(AiaynError, match="no such file"):
        load_labeled_text(tmp_path / "nope.tsv")
    p = _write(tmp_path, "t.tsv", "label\tsentence\n1\tok\n")
    with pytest.raises(AiaynError, match="no text column named 'body'"):
        load_labeled_text(p, text_column="body")


def test_invalid_utf8_names_line(tmp_path: Path) -> None:
    p = tmp_path / "bad.tsv"
    p.write_bytes(b"label\tsentence\n1\tok\n0\tcaf\xe9\n")
    with pytest.raises(AiaynError, match=r"bad\.tsv:3: invalid UTF-8"):
        load_labeled_text(p)


@pytest.mark.skipif(not (SST2 / "dev.tsv").is_file(), reason=f"SST-2 absent: {SST2}")
def test_real_sst2_dev() -> None:
    d = load_labeled_text(SST2 / "dev.tsv")  # header `label\tcontent`
    assert len(d) == 872 and d.label_names == ["0", "1"] and set(d.labels) == {0, 1}
    assert d.texts[0] == "one long string of cliches ." and d.labels[0] == 0 and d.lines[0] == 2


def test_collate_pads_truncates_and_prepends_cls() -> None:
    b = collate_classification([[5, 6, 7], [8]], [1, 0], pad_id=0, max_len=10)
    assert b.input_ids.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert b.attention_mask.tolist() == [[True, True, True], [True, False, False]]
    assert b.attention_mask.dtype == torch.bool and b.labels.tolist() == [1, 0]

    c = collate_classification([[5, 6, 7, 8, 9], [8]], [1, 0], pad_id=0, max_len=3, cls_id=1)
    assert c.input_ids.tolist() == [[1, 5, 6], [1, 8, 0]]
    assert c.attention_mask.sum(1).tolist() == [3, 2]
    assert c.to("cpu").input_ids.shape == (2, 3)

    with pytest.raises(AiaynError, match="no tokens"):
        collate_classification([[], [5]], [0, 1], pad_id=0, max_len=4)
