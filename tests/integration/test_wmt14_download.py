"""``aiayn data download wmt14``, offline: a ``file://`` mirror of statmt.org holding stand-in archives of the
published layout (members at the same paths, giga-fren's gzipped inside its tar), their sha256 listing, and a
``$SACREBLEU`` folder holding sacrebleu's processed newstest2013/2014, so that nothing touches the network."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from aiayn.data.wmt14 import ARCHIVES, CORPORA, TEST_SETS, download_wmt14, read_checksums
from aiayn.errors import AiaynError
from aiayn.files import sha256_of

SRC = Path(__file__).resolve().parents[2] / "src"


def _lines(corpus: str, lang: str, n: int) -> list[str]:
    return [f"{corpus} {lang} sentence {i}" for i in range(n)]


def _mirror(root: Path, pair: str, short: str | None = None) -> tuple[Path, Path]:
    """Stand-in archives of ``pair`` at statmt.org's paths under ``root`` (3 lines per corpus and side; ``short``:
    that corpus's target side one line short), and their sha256sum listing."""
    src, tgt = pair.split("-")
    listing = []
    for corpus, member in CORPORA[pair]:
        path = root / ARCHIVES[corpus].path
        path.parent.mkdir(parents=True, exist_ok=True)
        mode = "w" if path.suffix == ".tar" else "w:gz"
        with tarfile.open(path, mode) as tar:
            for lang in (src, tgt):
                lines = _lines(corpus, lang, 3 - (corpus == short and lang == tgt))
                data = ("\n".join(lines) + "\n").encode()
                name = member.format(lang=lang)
                if name.endswith(".gz"):
                    data = gzip.compress(data)
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        listing.append(f"{sha256_of(path)}  {path.name}")
    sums = root / "SHA256SUMS"
    sums.write_text("\n".join(listing) + "\n")
    return root, sums


def _sacrebleu_cache(root: Path, pair: str) -> Path:
    """sacrebleu's processed files of newstest2013 and newstest2014 for ``pair``, as its downloader leaves them."""
    for stem, test_set in TEST_SETS.items():
        folder = root / test_set
        folder.mkdir(parents=True, exist_ok=True)
        name = test_set.replace("/", "_")
        (folder / f"{name}.{pair}.src").write_text(f"{stem} source one\n{stem} source two\n")
        (folder / f"{name}.{pair}.ref").write_text(f"{stem} reference one\n{stem} reference two\n")
        for meta in ("docid", "genre", "origlang"):
            (folder / f"{name}.{pair}.{meta}").write_text("x\nx\n")
    return root


@pytest.mark.parametrize("pair", ["en-de", "en-fr"])
def test_the_command_writes_the_recipes_layout_from_a_mirror(tmp_path: Path, pair: str) -> None:
    mirror, sums = _mirror(tmp_path / "mirror", pair)
    cache = _sacrebleu_cache(tmp_path / "sacrebleu", pair)
    dest = tmp_path / "wmt"
    env = {**os.environ, "SACREBLEU": str(cache), "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "aiayn", "data", "download", "wmt14", "--pair", pair, "--dest", str(dest),
           "--base-url", mirror.as_uri(), "--checksums", str(sums)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    src, tgt = pair.split("-")
    corpora = [c for c, _ in CORPORA[pair]]
    assert (dest / f"train.{src}").read_text().splitlines() == [x for c in corpora for x in _lines(c, src, 3)]
    assert (dest / f"train.{tgt}").read_text().splitlines() == [x for c in corpora for x in _lines(c, tgt, 3)]
    assert (dest / f"newstest2014.{tgt}").read_text() == "newstest2014 reference one\nnewstest2014 reference two\n"
    assert (dest / f"newstest2013.{src}").read_text() == "newstest2013 source one\nnewstest2013 source two\n"
    sources = json.loads((dest / "sources.json").read_text())
    assert sources["lines"] == dict.fromkeys(corpora, 3)
    assert sources["test_sets"]["newstest2014"]["sacrebleu"] == "wmt14/full"
    assert not list(dest.glob("*.part"))
    if pair == "en-fr":
        return
    # a second run finds its archives in downloads/ (checked again) and needs no mirror
    again = subprocess.run([*cmd[:-4], "--base-url", (tmp_path / "gone").as_uri(), "--checksums", str(sums)],
                           env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr


def test_the_published_checksums_refuse_other_files(tmp_path: Path) -> None:
    mirror, _ = _mirror(tmp_path / "mirror", "en-de")
    with pytest.raises(AiaynError, match="does not match the expected " + ARCHIVES["europarl"].sha256):
        download_wmt14("en-de", tmp_path / "wmt", base_url=mirror.as_uri())
    assert not list((tmp_path / "wmt").rglob("*.tgz*"))  # nothing half-written is left behind


def test_a_corpus_whose_sides_differ_is_named(tmp_path: Path) -> None:
    mirror, sums = _mirror(tmp_path / "mirror", "en-de", short="commoncrawl")
    with pytest.raises(AiaynError, match=r"commoncrawl.de-en.en has 3 lines but commoncrawl.de-en.de 2"):
        download_wmt14("en-de", tmp_path / "wmt", base_url=mirror.as_uri(), checksums=read_checksums(sums))


def test_a_bad_checksum_listing_names_its_line(tmp_path: Path) -> None:
    listing = tmp_path / "SHA256SUMS"
    listing.write_text(f"{'0' * 64}  a.tgz\nnot a line\n")
    with pytest.raises(AiaynError, match=r"SHA256SUMS:2: expected 'SHA256  FILE'"):
        read_checksums(listing)


def test_an_unknown_pair_is_refused(tmp_path: Path) -> None:
    with pytest.raises(AiaynError, match="--pair 'de-en'"):
        download_wmt14("de-en", tmp_path)
