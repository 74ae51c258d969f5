"""A tokenizer folder is never a way to run code: transformers is told ``trust_remote_code=False`` outright, so no
version of it asks on standard input (where ``yes | aiayn convert`` would answer) and no module of the folder runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

from aiayn.tokenize.pretrained import PretrainedTokenizer  # noqa: E402


def _gpt2_files_with_remote_code(folder: Path) -> Path:
    """vocab.json + merges.txt (no tokenizer.json) and a tokenizer_config.json whose auto_map names a module of the
    folder that leaves a mark when it is imported."""
    vocab = {"<|endoftext|>": 0, **{c: i + 1 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz")}, "ab": 27}
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\na b\n", encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GPT2Tokenizer", "eos_token": "<|endoftext|>",
        "auto_map": {"AutoTokenizer": ["tokenization_x.XTokenizer", None]}}), encoding="utf-8")
    mark = folder / "ran"
    (folder / "tokenization_x.py").write_text(f"open({str(mark)!r}, 'w').close()\n", encoding="utf-8")
    return mark


def test_transformers_is_told_not_to_trust_remote_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mark = _gpt2_files_with_remote_code(tmp_path)
    real, seen = transformers.AutoTokenizer.from_pretrained, []

    def from_pretrained(*args, **kwargs):
        seen.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", from_pretrained)
    monkeypatch.setattr("sys.stdin", None)  # nothing to answer a prompt with
    try:
        tok = PretrainedTokenizer.from_folder(tmp_path)
        assert tok.encode("ab") == [27]
    except Exception as e:  # refusing the folder is as good, provided the refusal is aiayn's one message
        from aiayn.errors import AiaynError

        assert isinstance(e, AiaynError), e
    assert seen and all(k.get("trust_remote_code") is False for k in seen)
    assert not mark.exists()
