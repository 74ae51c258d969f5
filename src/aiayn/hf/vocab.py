"""A converted model's tokenizer: read from the transformers folder and held to the model it comes with.

A folder without tokenizer files would otherwise give an empty tokenizer (transformers builds one from the class
name alone): every text encodes to nothing, and the first symptom shows far from the cause. So :func:`read_tokenizer`
refuses such a folder, and checks what it builds against ``config.json``: the vocabulary is not far smaller than
the embedding, and the special ids that the config names (EOS, BOS, pad) are the tokenizer's own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiayn.config import ModelConfig
from aiayn.errors import AiaynError
from aiayn.tokenize import PretrainedTokenizer

#: files (glob patterns) from which a tokenizer can be built: a fast tokenizer, a byte-level BPE vocabulary,
#: a WordPiece vocabulary, SentencePiece models (T5, LLaMA, Marian)
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "vocab.txt", "*.model", "*.spm")
#: a tokenizer with fewer tokens than this share of the embedding's rows is of another model
MIN_SHARE = 0.5


def has_tokenizer_files(folder: Path) -> bool:
    """Whether ``folder`` holds any file a tokenizer can be built from (:data:`TOKENIZER_FILES`)."""
    return any(any(folder.glob(pattern)) for pattern in TOKENIZER_FILES)


def _config_ids(value: Any) -> set[int] | None:
    """config.json's id entry as a set (an int or a list of them, as Llama 3 lists its EOS ids); None if unset."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return {value}
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return set(value)
    return None


def mismatched_ids(tok: PretrainedTokenizer, hf: dict[str, Any]) -> list[str]:
    """``"eos_token_id 2: the tokenizer's EOS is 0"`` for each special id of config.json that the tokenizer has
    otherwise (EOS; BOS and pad where the tokenizer has such a token of its own)."""
    bos = tok.special_tokens["bos"]
    own = {"eos_token_id": ("EOS", tok.eos_id),
           "bos_token_id": ("BOS", None if bos is None else tok.hf.token_to_id(bos)),
           "pad_token_id": ("pad", None if tok.pads_with_eos else tok.pad_id)}
    out = []
    for key, (name, have) in own.items():
        want = _config_ids(hf.get(key))
        if want is not None and have is not None and have not in want:
            shown = next(iter(want)) if len(want) == 1 else sorted(want)
            out.append(f"{key} {shown}: the tokenizer's {name} is {have}")
    return out


def read_tokenizer(folder: Path, hf: dict[str, Any], config: ModelConfig) -> PretrainedTokenizer:
    """The folder's tokenizer, checked against its ``config.json`` (``hf``) and the converted model (``config``).

    Raises:
        AiaynError: no tokenizer files (the message says how to convert the weights alone); a tokenizer whose size
            or special ids contradict the model (the tokenizer files are of another model).
    """
    if not has_tokenizer_files(folder):
        raise AiaynError(f"{folder}: no tokenizer files (none of {', '.join(TOKENIZER_FILES)}); copy the model's "
                         "tokenizer files into the folder, or convert the weights alone with --no-tokenizer "
                         "(from_hf(..., tokenizer=False))")
    start = hf.get("decoder_start_token_id")
    tok = PretrainedTokenizer.from_folder(folder, decoder_start_id=start if isinstance(start, int) else None)
    rows = config.target_vocab_size
    if tok.vocab_size > rows:
        raise AiaynError(f"{folder}: the tokenizer has {tok.vocab_size} tokens but the model's embedding only "
                         f"{rows} rows; the tokenizer files are of another model")
    if tok.vocab_size < MIN_SHARE * rows:
        raise AiaynError(f"{folder}: the tokenizer has {tok.vocab_size} tokens for a model of {rows} embedding rows; "
                         "the tokenizer files are of another model or incomplete: copy the model's own tokenizer "
                         "files, or convert the weights alone with --no-tokenizer")
    wrong = mismatched_ids(tok, hf)
    if wrong:
        raise AiaynError(f"{folder}: the tokenizer contradicts config.json ({'; '.join(wrong)}); the tokenizer files "
                         "are of another model: copy the model's own tokenizer files, or convert the weights alone "
                         "with --no-tokenizer")
    return tok
