"""A small stand-in of the WMT 2014 folder (:mod:`aiayn.data.wmt14`'s layout), written without a network: the
synthetic En->De grammar's sentence pairs (:mod:`aiayn.data.synthetic`) under the file names of either pair, so
that a WMT recipe can be checked end to end (``aiayn train RECIPE --dry-run --data-dir DIR``) on any machine.

For En->Fr the target side is the grammar's German: the stand-in has the layout of the real data, not its
language.
"""

from __future__ import annotations

from pathlib import Path

from aiayn.data.synthetic import generate_corpus
from aiayn.data.text_io import write_lines
from aiayn.data.wmt14 import TEST_SETS, languages


def write_standin(pair: str, dest: Path, n_train: int = 2000, n_test: int = 100, seed: int = 1) -> list[Path]:
    """Write ``train``, ``newstest2013`` and ``newstest2014`` (``n_train`` / ``n_test`` / ``n_test`` pairs) of
    ``pair`` (``"en-de"`` or ``"en-fr"``) into ``dest``; returns the files written.

    Raises:
        AiaynError: an unknown pair.
    """
    src, tgt = languages(pair)
    corpus = generate_corpus(n_train, n_test, n_test, seed)
    splits = dict(zip(("train", *TEST_SETS), (corpus["train"], corpus["valid"], corpus["test"])))
    written = []
    for stem, pairs in splits.items():
        for lang, side in ((src, 0), (tgt, 1)):
            path = Path(dest) / f"{stem}.{lang}"
            write_lines(path, [p[side] for p in pairs])
            written.append(path)
    return written
