"""Pretrained vocabularies: a Hugging Face ``tokenizer.json`` with the model's own special tokens and ids.

The built-in tokenizers put ``<pad> <s> </s> <unk> <mask>`` at ids 0-4. A pretrained model's vocabulary
has its own special tokens at its own ids (GPT-2's ``<|endoftext|>`` is 50256, BERT's ``[PAD]`` is 0 and
``[CLS]`` 101, T5's ``<pad>`` 0 and ``</s>`` 1), so :class:`PretrainedTokenizer` reads them from the
folder that transformers' ``save_pretrained`` writes (or that the Hub holds) and the rest of aiayn asks the
tokenizer for its ids instead of assuming 0-4::

    tok = PretrainedTokenizer.from_folder("gpt2/")   # tokenizer.json, tokenizer_config.json, ...
    tok.eos_id, tok.pad_id                           # 50256, 50256 (no pad token: pad = eos)
    tok.encode("Hello world")                        # == AutoTokenizer's encode(text, add_special_tokens=False)
    tok.encode_with_special("Hello world")           # == AutoTokenizer's encode(text)
    tok.save("tokenizer.json")                       # one JSON file; load_tokenizer() reads it without transformers

What the folder gives, and the rules for what it lacks:

* ``tokenizer.json`` is used as it is (normalizer, pre-tokenizer, model, decoder, post-processor, added
  tokens); the special tokens named in ``tokenizer_config.json`` (``bos_token``, ``eos_token``, ...; or, in
  folders without an ``added_tokens_decoder`` entry, ``special_tokens_map.json``) are added as special
  tokens where the file lacks them, as transformers does. A folder without ``tokenizer.json`` (only
  SentencePiece or ``vocab.json``/``merges.txt`` files) is converted with transformers' ``AutoTokenizer``
  when transformers (and, for SentencePiece, ``sentencepiece``) is installed.
* ``pad_id``: the pad token; a vocabulary without one (GPT-2, LLaMA) pads with EOS, as transformers users
  set ``tokenizer.pad_token = tokenizer.eos_token`` (:attr:`PretrainedTokenizer.pads_with_eos` says so).
  Padding is recognised by position in batches, so EOS tokens are still learned.
* ``bos_id``: the BOS token, else the CLS token (BERT's ``[CLS]``), else None (T5, Marian).
  ``eos_id``: the EOS token, else the SEP token (BERT's ``[SEP]``). ``unk_id`` and ``mask_id``: None when
  the vocabulary has no such token.
* ``decoder_start_id``, the first token of a seq2seq decoder's input: the ``decoder_start_id`` argument,
  else ``decoder_start_token_id`` of the folder's model ``config.json``, else BOS, else pad. T5 and Marian
  start from pad (their config says so, and neither has a BOS); BART starts from EOS, which needs its
  ``config.json`` in the folder or ``decoder_start_id=2``.

Encoding and decoding equal transformers' ``AutoTokenizer``: :meth:`~PretrainedTokenizer.encode` is
``encode(text, add_special_tokens=False)``, :meth:`~PretrainedTokenizer.encode_with_special` adds the
model's own special tokens (BERT ``[CLS] ... [SEP]``; T5, Marian ``... </s>``; BART ``<s> ... </s>``;
LLaMA ``<s> ...``; GPT-2 nothing), and :meth:`~PretrainedTokenizer.decode` is ``decode(ids,
skip_special_tokens=skip_special)``. As in transformers, a special token's text inside the input (``"a
<|endoftext|> b"``) encodes to that special id. The tasks use the plain ``encode`` and add the framing ids
themselves from the tokenizer (translation: ``decoder_start_id`` before the target, ``eos_id`` after it;
language modeling: ``eos_id`` between documents; masked LM and classification: ``bos_id`` and ``eos_id``
around the text), exactly as they do with the built-in tokenizers; translating a text frames its source with
:meth:`~PretrainedTokenizer.encode_with_special`, as the model was trained
(:func:`aiayn.generate.translate.source_ids`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer

from aiayn.errors import AiaynError, where
from aiayn.files import BadJSON, parse_json
from aiayn.tokenize.base import Tokenizer, require_keys

#: The special-token roles a transformers tokenizer names, in its order (``bos_token``, ``eos_token``, ...).
ROLES: tuple[str, ...] = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
TOKENIZER_FILE, CONFIG_FILE, SPECIAL_MAP_FILE, MODEL_CONFIG_FILE = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json")


def clean_up_spaces(text: str) -> str:
    """transformers' ``clean_up_tokenization``: drop the space WordPiece decoding leaves before punctuation and
    English contractions (``"it ' s ok ."`` -> ``"it's ok."``)."""
    for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                 (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(a, b)
    return text


class PretrainedTokenizer(Tokenizer):
    """A pretrained model's vocabulary (a Hugging Face tokenizer) with its own special tokens and ids.

    Build one with :meth:`from_folder`; :meth:`~aiayn.tokenize.Tokenizer.save` writes it to one JSON file
    (the Hugging Face tokenizer embedded) that :func:`~aiayn.tokenize.load_tokenizer` reads back.

    Args:
        hf: the Hugging Face tokenizer, its special tokens already among its added tokens.
        special_tokens: role -> token text (or None) for the roles in :data:`ROLES`; missing roles are None.
        decoder_start_id: the first id of a seq2seq decoder's input; None: BOS, else pad.
        clean_up: apply :func:`clean_up_spaces` after decoding (transformers'
            ``clean_up_tokenization_spaces``, which it ignores for BPE models).
        split_special_tokens: encode special-token text in the input as ordinary text (transformers'
            ``split_special_tokens``; default False: it becomes the special id).
        name: where the vocabulary came from (the folder's name), for messages.

    Raises:
        AiaynError: a named special token is not in the vocabulary; no EOS (or SEP) token; a
            ``decoder_start_id`` outside the vocabulary.
    """

    kind = "pretrained"
    trained = False

    def __init__(self, hf: HFTokenizer, special_tokens: Mapping[str, str | None], *,
                 decoder_start_id: int | None = None, clean_up: bool = False, split_special_tokens: bool = False,
                 name: str = "") -> None:
        unknown = sorted(set(special_tokens) - set(ROLES))
        if unknown:
            raise AiaynError(f"unknown special-token role(s) {unknown}; the roles are {list(ROLES)}")
        self._hf = hf
        self._hf.no_truncation()  # transformers encodes without the file's truncation/padding unless asked
        self._hf.no_padding()
        self._hf.encode_special_tokens = bool(split_special_tokens)
        self.name = name
        self._tokens: dict[str, str | None] = {r: special_tokens.get(r) for r in ROLES}
        self._size = hf.get_vocab_size(with_added_tokens=True)
        self._ids: dict[str, int | None] = {}
        for role, token in self._tokens.items():
            idx = None if token is None else hf.token_to_id(token)
            if token is not None and idx is None:
                raise AiaynError(f"{name or 'pretrained tokenizer'}: the {role} token {token!r} is not in the "
                                 "vocabulary; the tokenizer files disagree: download or save the tokenizer again")
            self._ids[role] = idx
        if self._ids["eos"] is None and self._ids["sep"] is None:
            raise AiaynError(f"{name or 'pretrained tokenizer'}: the vocabulary names neither an eos_token nor a "
                             "sep_token, and aiayn needs an end-of-sequence id; set eos_token in "
                             "tokenizer_config.json")
        self._clean_up = bool(clean_up)
        self._split = bool(split_special_tokens)
        self._start = decoder_start_id
        if decoder_start_id is not None:
            self._check_id(int(decoder_start_id))
        self._special = frozenset(i for i, t in hf.get_added_tokens_decoder().items() if t.special)

    # ---- special ids ---------------------------------------------------------------------------------------
    @property
    def special_tokens(self) -> dict[str, str | None]:
        """The special tokens the vocabulary names, by role (``bos eos unk sep pad cls mask``; None: absent)."""
        return dict(self._tokens)

    @property
    def pads_with_eos(self) -> bool:
        """True when the vocabulary has no pad token, so ``pad_id`` is the EOS id (GPT-2, LLaMA)."""
        return self._ids["pad"] is None

    @property
    def pad_id(self) -> int:
        """The pad token's id; the EOS id for vocabularies without a pad token."""
        return self._ids["pad"] if self._ids["pad"] is not None else self.eos_id

    @property
    def bos_id(self) -> int | None:
        """The BOS token's id, else the CLS token's (BERT), else None (T5, Marian)."""
        return self._ids["bos"] if self._ids["bos"] is not None else self._ids["cls"]

    @property
    def eos_id(self) -> int:
        """The EOS token's id, else the SEP token's (BERT)."""
        eos = self._ids["eos"]
        return eos if eos is not None else self._ids["sep"]  # type: ignore[return-value]  # one exists (__init__)

    @property
    def unk_id(self) -> int | None:
        """The unknown token's id; None when the vocabulary has none."""
        return self._ids["unk"]

    @property
    def mask_id(self) -> int | None:
        """The mask token's id (BERT, BART); None when the vocabulary has none (GPT-2, LLaMA, T5)."""
        return self._ids["mask"]

    @property
    def decoder_start_id(self) -> int:
        """The first id of a seq2seq decoder's input: as given (argument or the model's config.json), else
        BOS, else pad (T5, Marian)."""
        if self._start is not None:
            return int(self._start)
        return self.bos_id if self.bos_id is not None else self.pad_id

    @property
    def clean_up(self) -> bool:
        """Whether decoding applies transformers' ``clean_up_tokenization_spaces``."""
        return self._clean_up

    @property
    def special_ids(self) -> frozenset[int]:
        """The ids of the vocabulary's special tokens: what ``decode(skip_special=True)`` drops."""
        return self._special

    # ---- the protocol --------------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self._size

    def encode(self, text: str) -> list[int]:
        """Text -> ids without the model's special tokens (transformers' ``add_special_tokens=False``)."""
        return self._hf.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._hf.encode_batch(list(texts), add_special_tokens=False)]

    def encode_with_special(self, text: str) -> list[int]:
        """Text -> ids with the model's own special tokens, as ``AutoTokenizer(...).encode(text)`` gives them
        (BERT ``[CLS] ... [SEP]``, T5 ``... </s>``, LLaMA ``<s> ...``, GPT-2 none)."""
        return self._hf.encode(text, add_special_tokens=True).ids

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        """Ids -> text, as transformers' ``decode(ids, skip_special_tokens=skip_special)``.

        ``skip_special`` drops the vocabulary's own special tokens (:attr:`special_ids`).
        """
        ids = [int(i) for i in ids]
        for i in ids:
            self._check_id(i)
        text = self._hf.decode(ids, skip_special_tokens=skip_special)
        return clean_up_spaces(text) if self._clean_up else text

    def token_to_id(self, token: str) -> int | None:
        return self._hf.token_to_id(token)

    def id_to_token(self, idx: int) -> str:
        self._check_id(idx)
        token = self._hf.id_to_token(idx)
        if token is None:
            raise AiaynError(f"token id {idx} is unused in this pretrained vocabulary (it has no token)")
        return token

    def normalize(self, text: str) -> str:
        """``decode(encode(text))``: the text as this vocabulary gives it back (lowercased for uncased BERT,
        special-token text removed, ...)."""
        return self.decode(self.encode(text))

    @property
    def hf(self) -> HFTokenizer:
        """The wrapped Hugging Face tokenizer (for interop; encode through this class)."""
        return self._hf

    def to_dict(self) -> dict[str, Any]:
        return {"hf_tokenizer": json.loads(self._hf.to_str()), "special_tokens": dict(self._tokens),
                "decoder_start_id": self._start, "clean_up": self._clean_up,
                "split_special_tokens": self._split, "name": self.name}

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<dict>") -> PretrainedTokenizer:
        require_keys(data, ["hf_tokenizer", "special_tokens"], source)
        try:
            hf = HFTokenizer.from_str(json.dumps(data["hf_tokenizer"]))
        except Exception as e:  # tokenizers raises a plain Exception on malformed data
            raise AiaynError(f"{source}: the embedded Hugging Face tokenizer is corrupt ({e}); import the "
                             "pretrained tokenizer again (PretrainedTokenizer.from_folder) and save it") from None
        specials = data["special_tokens"]
        if not isinstance(specials, dict) or any(v is not None and not isinstance(v, str) for v in specials.values()):
            raise AiaynError(f"{source}: special_tokens must map roles to token strings or null; the file is "
                             "corrupt: import the pretrained tokenizer again and save it")
        start = data.get("decoder_start_id")
        if start is not None and (not isinstance(start, int) or isinstance(start, bool)):
            raise AiaynError(f"{source}: decoder_start_id = {start!r} is not a token id; the file is corrupt: import "
                             "the pretrained tokenizer again and save it")
        try:
            return cls(hf, specials, decoder_start_id=start, clean_up=bool(data.get("clean_up", False)),
                       split_special_tokens=bool(data.get("split_special_tokens", False)),
                       name=str(data.get("name", "")))
        except AiaynError as e:
            raise AiaynError(f"{source}: {e}") from None

    def __repr__(self) -> str:
        return f"PretrainedTokenizer({self.name!r}, vocab_size={self.vocab_size})"

    # ---- reading a transformers tokenizer folder -----------------------------------------------------------
    @classmethod
    def from_folder(cls, path: str | Path, decoder_start_id: int | None = None) -> PretrainedTokenizer:
        """Read a transformers tokenizer folder (what ``save_pretrained`` writes, or a Hub model's files).

        Args:
            path: the folder (or its ``tokenizer.json``). It holds ``tokenizer.json`` and usually
                ``tokenizer_config.json`` / ``special_tokens_map.json``; a model's ``config.json`` beside
                them gives ``decoder_start_token_id``. Without ``tokenizer.json``, transformers' ``AutoTokenizer``
                converts the other vocabulary files (SentencePiece, ``vocab.json`` + ``merges.txt``) when it
                can do so offline.
            decoder_start_id: the seq2seq decoder's first id (BART: 2, its EOS); None: the folder's
                ``config.json``, else BOS, else pad.

        Raises:
            AiaynError: the folder or its tokenizer files are missing or corrupt (the message names the file
                and the fix).
        """
        folder = Path(path)
        if folder.is_file() and folder.name == TOKENIZER_FILE:
            folder = folder.parent
        if not folder.is_dir():
            raise AiaynError(f"{folder}: no such tokenizer folder; give the folder that holds {TOKENIZER_FILE} "
                             "(what transformers' tokenizer.save_pretrained(folder) writes)")
        config = read_json_object(folder / CONFIG_FILE) or {}
        model_config = read_json_object(folder / MODEL_CONFIG_FILE) or {}
        if decoder_start_id is None:
            start = model_config.get("decoder_start_token_id")
            decoder_start_id = start if isinstance(start, int) and not isinstance(start, bool) else None
        file = folder / TOKENIZER_FILE
        if not file.is_file():
            hf, specials, clean_up = _convert_with_transformers(folder)
            split = False
        else:
            try:
                hf = HFTokenizer.from_file(str(file))
            except Exception as e:  # tokenizers raises a plain Exception on malformed files
                raise AiaynError(f"{file}: not a valid Hugging Face tokenizer file ({_short(e)}); it is corrupt or "
                                 "incomplete: download it again, or save the tokenizer again with "
                                 "tokenizer.save_pretrained(folder)") from None
            specials, extra, added = _special_tokens(config, read_json_object(folder / SPECIAL_MAP_FILE), folder)
            _add_missing_specials(hf, extra, added)
            clean_up = _clean_up(hf, config.get("clean_up_tokenization_spaces", False),
                                 config.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"))
            split = bool(config.get("split_special_tokens", False))
        try:
            return cls(hf, specials, decoder_start_id=decoder_start_id, clean_up=clean_up,
                       split_special_tokens=split, name=folder.name)
        except AiaynError as e:
            raise AiaynError(f"{folder}: {e}") from None


# ---------------------------------------------------------------------------------------------- folder helpers
def _short(e: Exception, limit: int = 200) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def _clean_up(hf: HFTokenizer, asked: Any, even_for_bpe: Any) -> bool:
    """Whether decoding cleans up spaces: transformers does when the config asks, except for BPE models
    (where it would remove real spaces) unless the config insists."""
    return bool(asked) and (type(hf.model).__name__ != "BPE" or bool(even_for_bpe))


def read_json_object(path: Path, fix: str = "download it again, or save the tokenizer again with "
                                            "tokenizer.save_pretrained(folder)") -> dict[str, Any] | None:
    """A JSON object file of a transformers folder, or None when the file is absent; a corrupt one is an error
    naming the file and line, ending with ``fix``."""
    if not path.is_file():
        return None
    try:
        data = parse_json(path.read_text(encoding="utf-8"))
    except BadJSON as e:
        raise AiaynError(f"{where(path, e.line)}: not valid JSON ({e.detail}); the file is corrupt: {fix}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise AiaynError(f"{path}: cannot read the file ({e}); check its permissions and encoding") from None
    if not isinstance(data, dict):
        raise AiaynError(f"{path}: expected a JSON object, got {type(data).__name__}; the file is corrupt: "
                         "download it again")
    return data


def _content(value: Any, path: Path, key: str) -> str | None:
    """A special token as a config gives it: a string, an AddedToken dict (``{"content": ...}``) or null."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise AiaynError(f"{path}: {key} = {value!r} is not a token; give a string (or remove the key)")


def _added_token(value: Any) -> AddedToken:
    """An AddedToken marked special, keeping the flags of a config's AddedToken dict."""
    if isinstance(value, dict):
        flags = {k: bool(value[k]) for k in ("single_word", "lstrip", "rstrip", "normalized") if k in value}
        return AddedToken(value["content"], special=True, **flags)
    return AddedToken(str(value), special=True, normalized=False)


def _special_tokens(config: dict[str, Any], special_map: dict[str, Any] | None,
                    folder: Path) -> tuple[dict[str, str | None], list[Any], list[Any]]:
    """(role -> token, extra special tokens, the config's added tokens in id order), as transformers reads them:
    the named tokens of ``tokenizer_config.json``, overridden by ``special_tokens_map.json`` in folders whose
    config has no ``added_tokens_decoder`` (the older layout)."""
    raw: dict[str, Any] = {r: config.get(f"{r}_token") for r in ROLES}
    extra_src: Any = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
    source = folder / CONFIG_FILE
    if special_map is not None and "added_tokens_decoder" not in config:
        for r in ROLES:
            if special_map.get(f"{r}_token") is not None:
                raw[r] = special_map[f"{r}_token"]
        extra_src = (special_map.get("extra_special_tokens") or special_map.get("additional_special_tokens")
                     or extra_src)
        source = folder / SPECIAL_MAP_FILE
    specials = {r: _content(v, source, f"{r}_token") for r, v in raw.items()}
    extra = list(extra_src.values()) if isinstance(extra_src, dict) else list(extra_src)
    for v in extra:
        _content(v, source, "extra_special_tokens")
    decoder = config.get("added_tokens_decoder") or {}
    if not isinstance(decoder, dict):
        raise AiaynError(f"{folder / CONFIG_FILE}: added_tokens_decoder must map ids to tokens; the file is corrupt")
    added = []
    for key in sorted(decoder, key=lambda k: int(k) if str(k).lstrip("-").isdigit() else 0):
        if _content(decoder[key], folder / CONFIG_FILE, "added_tokens_decoder") is not None:
            added.append(decoder[key])
    roles = {r: raw[r] for r in ROLES if raw[r] is not None}
    return specials, [*roles.values(), *extra], added


def _add_missing_specials(hf: HFTokenizer, named_and_extra: list[Any], added: list[Any]) -> None:
    """Add the tokens the config names but ``tokenizer.json`` lacks among its added tokens (as transformers
    does on loading: the config's added tokens, then the named special tokens, then the extra ones)."""
    have = {str(t.content) for t in hf.get_added_tokens_decoder().values()}
    new: list[AddedToken] = []
    for value in added:
        token = AddedToken(value["content"], **{k: bool(value[k]) for k in (
            "single_word", "lstrip", "rstrip", "normalized", "special") if k in value}) \
            if isinstance(value, dict) else AddedToken(str(value), special=True, normalized=False)
        if token.content not in have:
            new.append(token)
            have.add(token.content)
    for value in named_and_extra:
        content = value["content"] if isinstance(value, dict) else str(value)
        if content not in have:
            new.append(_added_token(value))
            have.add(content)
    if new:
        hf.add_tokens(new)


def _convert_with_transformers(folder: Path) -> tuple[HFTokenizer, dict[str, str | None], bool]:
    """A folder without ``tokenizer.json``: let transformers build its fast tokenizer from the other files."""
    missing = folder / TOKENIZER_FILE
    fix = ("save the tokenizer with transformers' tokenizer.save_pretrained(folder) where it can be built (it "
           f"writes {TOKENIZER_FILE}), or copy the model's {TOKENIZER_FILE} into the folder")
    try:
        from transformers import AutoTokenizer  # optional: transformers
    except ImportError:
        raise AiaynError(f"{missing}: no such file, and converting the folder's other vocabulary files needs the "
                         f"transformers package (not installed); {fix}") from None
    try:
        # never code from the folder, and no prompt on stdin asking whether to run it (some versions ask)
        tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
        hf = HFTokenizer.from_str(tok.backend_tokenizer.to_str())
    except Exception as e:  # transformers raises many kinds (OSError, ValueError, ImportError, ...)
        raise AiaynError(f"{missing}: no such file, and transformers could not build a fast tokenizer from the "
                         f"folder's other files ({_short(e)}); {fix}") from None
    specials = {r: (None if getattr(tok, f"{r}_token", None) is None else str(getattr(tok, f"{r}_token")))
                for r in ROLES}
    clean_up = _clean_up(hf, getattr(tok, "clean_up_tokenization_spaces", False),
                         getattr(tok, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False))
    return hf, specials, clean_up
