"""aiayn's own tokenizers written as transformers tokenizers (``tokenizer.json`` + ``tokenizer_config.json``, as
``aiayn convert --to-hf`` writes them): ``AutoTokenizer.from_pretrained`` of the folder gives the same ids and the
same decoded text as aiayn's word and char tokenizers, unknown words, punctuation, NFKC forms and special ids
included."""

from __future__ import annotations

from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

from aiayn.hf.folder import write_tokenizer  # noqa: E402
from aiayn.tokenize.char import CharTokenizer  # noqa: E402
from aiayn.tokenize.word import WordTokenizer  # noqa: E402

CORPUS = ["Ein Hund läuft über die Wiese.", "Zwei Männer, ein Ball: sie spielen!", "the dog's ball (red) is here",
          "don't stop -- 3.5 km/h"]
TEXTS = CORPUS + ["Ein unbekanntes Wort, und Tiere.", "  spaces\tand\nlines  ", "ﬁne ligatures and full-width ＡＢＣ",
                  "", "!!!", "Hund Hund hund"]


def _transformers_form(tok, folder: Path):
    assert write_tokenizer(folder, tok, max_len=128)
    return transformers.AutoTokenizer.from_pretrained(str(folder))


@pytest.mark.parametrize("kind", ["word", "char"])
def test_transformers_encodes_and_decodes_as_aiayn(kind: str, tmp_path: Path) -> None:
    tok = WordTokenizer.train(CORPUS, min_frequency=1) if kind == "word" else CharTokenizer.train(CORPUS)
    hf = _transformers_form(tok, tmp_path)
    assert len(hf) == tok.vocab_size
    assert (hf.pad_token_id, hf.unk_token_id, hf.bos_token_id, hf.eos_token_id) == (
        tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id)
    for text in TEXTS:
        ids = tok.encode(text)
        assert hf.encode(text, add_special_tokens=False) == ids, text
        framed = [tok.bos_id, *ids, tok.eos_id]
        assert hf.decode(framed, skip_special_tokens=True) == tok.decode(framed, skip_special=True), text
