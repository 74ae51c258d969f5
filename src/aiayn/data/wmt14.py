"""WMT 2014 En->De and En->Fr as the paper trained on them: the training corpora from statmt.org (sha256-checked
archives), newstest2013 (development) and newstest2014 (test) through sacrebleu's own downloader.

The folder written (``--dest DIR``), the layout the WMT recipes read::

    DIR/train.en  DIR/train.de            the corpora concatenated in the order of :data:`CORPORA`
    DIR/newstest2013.en  DIR/newstest2013.de
    DIR/newstest2014.en  DIR/newstest2014.de
    DIR/sources.json                      archives with their sha256, lines per corpus, sacrebleu's test sets
    DIR/downloads/                        the archives, kept so that a second run downloads nothing

The sha256 of each archive is the one tensorflow/datasets records (``url_checksums/wmt14_translate.txt`` and
``wmt15_translate.txt``). newstest2014 is sacrebleu's ``wmt14/full`` (3,003 sentences for En-De, as the paper's
tensor2tensor scored), newstest2013 its ``wmt13``; sacrebleu checks their MD5 and keeps them under ``$SACREBLEU``
(default ``~/.sacrebleu``), so a prepared folder there answers without a network.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from aiayn.data.download import fetch
from aiayn.errors import AiaynError

STATMT = "https://www.statmt.org/"
PAIRS = ("en-de", "en-fr")


@dataclass(frozen=True)
class Archive:
    """One archive on statmt.org: its path under :data:`STATMT`, sha256 and size in bytes."""

    path: str
    sha256: str
    size: int


ARCHIVES = {
    "europarl": Archive("wmt13/training-parallel-europarl-v7.tgz",
                        "0224c7c710c8a063dfd893b0cc0830202d61f4c75c17eb8e31836103d27d96e7", 657_632_379),
    "commoncrawl": Archive("wmt13/training-parallel-commoncrawl.tgz",
                           "c7a74e2ea01ac6c920123108627e35278d4ccb5701e15428ffa34de86fa3a9e5", 918_311_367),
    "news-commentary": Archive("wmt14/training-parallel-nc-v9.tgz",
                               "cb8953f292298e6877ae433c98912b927cb0766b303f4540512ddd286c748485", 80_418_416),
    "un": Archive("wmt13/training-parallel-un.tgz",
                  "29141b5c1eba149a94f7a59d3b1a834b2e47fe0f8758d68dcd77a3d3f497ee47", 2_365_634_246),
    "giga-fren": Archive("wmt10/training-giga-fren.tar",
                         "3ff8319f6919393520559bfbc7ad6a747ec81b3abc7be9993b338d4b017b4d9a", 2_595_102_720),
}

#: per pair, (corpus, member of its archive with ``{lang}`` for the side); a member ending .gz is gunzipped
CORPORA: dict[str, list[tuple[str, str]]] = {
    "en-de": [("europarl", "training/europarl-v7.de-en.{lang}"), ("commoncrawl", "commoncrawl.de-en.{lang}"),
              ("news-commentary", "training/news-commentary-v9.de-en.{lang}")],
    "en-fr": [("europarl", "training/europarl-v7.fr-en.{lang}"), ("commoncrawl", "commoncrawl.fr-en.{lang}"),
              ("un", "un/undoc.2000.fr-en.{lang}"), ("news-commentary", "training/news-commentary-v9.fr-en.{lang}"),
              ("giga-fren", "giga-fren.release2.fixed.{lang}.gz")],
}

#: the file stem in DIR -> sacrebleu's test set
TEST_SETS = {"newstest2013": "wmt13", "newstest2014": "wmt14/full"}


def languages(pair: str) -> tuple[str, str]:
    """``"en-de"`` -> ``("en", "de")``.

    Raises:
        AiaynError: a pair other than :data:`PAIRS`.
    """
    if pair not in PAIRS:
        raise AiaynError(f"--pair {pair!r}: WMT 2014 here is one of {', '.join(PAIRS)}")
    src, tgt = pair.split("-")
    return src, tgt


def read_checksums(path: Path) -> dict[str, str]:
    """A ``sha256sum`` listing (``HASH  NAME`` per line) as {archive file name: sha256}: the files of a mirror that
    serves other archives than statmt.org's (a test's stand-in).

    Raises:
        AiaynError: a line that is not ``HASH  NAME``, naming the file and line.
    """
    out: dict[str, str] = {}
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2 or len(parts[0]) != 64:
            raise AiaynError(f"{path}:{number}: expected 'SHA256  FILE' as sha256sum writes it, got {line!r}")
        out[Path(parts[1].lstrip("*")).name] = parts[0].lower()
    return out


def download_wmt14(pair: str, dest: Path, base_url: str | None = None,
                   checksums: dict[str, str] | None = None) -> list[Path]:
    """Fetch the WMT 2014 training corpora of ``pair`` and newstest2013/2014 into ``dest`` (the layout of the module
    docstring); returns the text files written.

    Args:
        pair: ``"en-de"`` or ``"en-fr"``.
        dest: the folder to write.
        base_url: a mirror of statmt.org holding the archives at the same paths (``file://`` in tests).
        checksums: {archive file name: sha256} replacing the statmt.org hashes (a mirror of other files).

    Raises:
        AiaynError: a failed download, a checksum mismatch, an archive without a member it should hold, or a corpus
            whose two sides differ in length.
    """
    src, tgt = languages(pair)
    dest = Path(dest)
    base = (base_url or STATMT).rstrip("/") + "/"
    lines: dict[str, int] = {}
    archives: dict[str, dict[str, str]] = {}
    parts = {lang: dest / f"train.{lang}.part" for lang in (src, tgt)}
    dest.mkdir(parents=True, exist_ok=True)
    with open(parts[src], "w", encoding="utf-8") as out_src, open(parts[tgt], "w", encoding="utf-8") as out_tgt:
        for corpus, member in CORPORA[pair]:
            archive = ARCHIVES[corpus]
            name = Path(archive.path).name
            digest = (checksums or {}).get(name, archive.sha256)
            local = fetch(base + archive.path, dest / "downloads" / name, digest)
            archives[corpus] = {"url": base + archive.path, "sha256": digest}
            lines[corpus] = _copy_pair(local, member.format(lang=src), member.format(lang=tgt), out_src, out_tgt)
    written = []
    for lang, part in parts.items():
        os.replace(part, dest / f"train.{lang}")
        written.append(dest / f"train.{lang}")
    tests = {}
    for stem, test_set in TEST_SETS.items():
        written += _write_test_set(test_set, pair, dest / stem)
        tests[stem] = {"sacrebleu": test_set, "langpair": pair}
    (dest / "sources.json").write_text(json.dumps({"pair": pair, "archives": archives, "lines": lines,
                                                   "test_sets": tests}, indent=1) + "\n", encoding="utf-8")
    return written


def _copy_pair(archive: Path, member_src: str, member_tgt: str, out_src: io.TextIOBase,
               out_tgt: io.TextIOBase) -> int:
    """Append the two sides of one corpus to the training files; returns its number of lines.

    Raises:
        AiaynError: a member missing from the archive, or sides of different lengths.
    """
    with tarfile.open(archive) as tar:
        count_src = _append(tar, archive, member_src, out_src)
        count_tgt = _append(tar, archive, member_tgt, out_tgt)
    if count_src != count_tgt:
        raise AiaynError(f"{archive}: {member_src} has {count_src} lines but {member_tgt} {count_tgt}; the archive "
                         "is not the published one, delete it and download again")
    return count_src


def _append(tar: tarfile.TarFile, archive: Path, member: str, out: io.TextIOBase) -> int:
    """Write one member's lines (gunzipped when it ends .gz) to ``out``; returns how many."""
    count = 0
    for line in _member_lines(tar, archive, member):
        out.write(line.rstrip("\r\n").replace("\r", " ") + "\n")
        count += 1
    return count


def _member_lines(tar: tarfile.TarFile, archive: Path, member: str) -> Iterator[str]:
    """The UTF-8 lines of ``member`` (undecodable bytes replaced, as Common Crawl has a few)."""
    try:
        raw = tar.extractfile(member)
    except KeyError:
        raw = None
    if raw is None:
        raise AiaynError(f"{archive}: no file {member} in the archive; it is not the published one, delete it and "
                         "download again")
    stream = gzip.GzipFile(fileobj=raw) if member.endswith(".gz") else raw
    yield from io.TextIOWrapper(stream, encoding="utf-8", errors="replace", newline="\n")


def _write_test_set(test_set: str, pair: str, stem: Path) -> list[Path]:
    """``stem.SRC`` and ``stem.TGT`` from sacrebleu's ``test_set`` (downloaded by sacrebleu into ``$SACREBLEU``)."""
    from sacrebleu.dataset import DATASETS  # lazy: reads $SACREBLEU when first imported

    try:
        dataset = DATASETS[test_set]
        source, reference = dataset.get_source_file(pair), dataset.get_reference_files(pair)[0]  # downloads
    except Exception as e:  # sacrebleu raises bare Exceptions and OSErrors alike
        raise AiaynError(f"sacrebleu -t {test_set} -l {pair}: {e}; check the network, or set SACREBLEU to a folder "
                         "holding sacrebleu's files") from e
    out = []
    for lang, path in zip(languages(pair), (source, reference)):
        target = stem.with_name(f"{stem.name}.{lang}")
        target.write_text(Path(path).read_text(encoding="utf-8"), encoding="utf-8")
        out.append(target)
    return out
