"""The one tokenizer protocol, the fixed special tokens, and saving/loading as one JSON file.

Every built-in tokenizer (BPE, char, word) gives the same five special tokens the same ids::

    <pad>=0  <s>=1  </s>=2  <unk>=3  <mask>=4

A pretrained vocabulary (:class:`~aiayn.tokenize.pretrained.PretrainedTokenizer`) has its own special
tokens at its own ids, and may lack some (GPT-2 has no pad token, T5 no BOS). Code that needs a special
id therefore asks the tokenizer (``pad_id``, ``bos_id``, ``eos_id``, ``unk_id``, ``mask_id``,
``decoder_start_id``, ``special_ids``) and never assumes 0-4.

``encode`` adds no BOS/EOS (batching adds them). ``decode`` drops special tokens (``<unk>``
included) when ``skip_special`` is true, and ``decode(encode(x)) == normalize(x)`` for every string.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from aiayn.checkpoint.layout import CheckpointRead, recovered_file
from aiayn.errors import AiaynError, where
from aiayn.files import BadJSON, atomic_write_text, parse_json

PAD = "<pad>"
BOS = "<s>"
EOS = "</s>"
UNK = "<unk>"
MASK = "<mask>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK, MASK)
PAD_ID, BOS_ID, EOS_ID, UNK_ID, MASK_ID = range(5)
NUM_SPECIAL = len(SPECIAL_TOKENS)
_BUILTIN_SPECIAL_IDS = frozenset(range(NUM_SPECIAL))

FORMAT_VERSION = 1

_REGISTRY: dict[str, type[Tokenizer]] = {}


class Tokenizer(ABC):
    """A reversible map between text and lists of token ids.

    Subclasses set ``kind`` (the value of the ``"kind"`` field in the saved JSON) and implement the
    abstract methods; subclasses with a ``kind`` register themselves for :func:`load_tokenizer`.
    """

    kind: ClassVar[str] = ""
    #: False for kinds read from elsewhere rather than trained by aiayn (a pretrained vocabulary).
    trained: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.kind:
            _REGISTRY[cls.kind] = cls

    # ---- special ids (0-4 in the built-in tokenizers; a pretrained vocabulary has its own) -----
    @property
    def pad_id(self) -> int:
        """Id of ``<pad>`` (0)."""
        return PAD_ID

    @property
    def bos_id(self) -> int | None:
        """Id of ``<s>`` (1); None only for a pretrained vocabulary without one (T5)."""
        return BOS_ID

    @property
    def eos_id(self) -> int:
        """Id of ``</s>`` (2)."""
        return EOS_ID

    @property
    def unk_id(self) -> int | None:
        """Id of ``<unk>`` (3); None only for a pretrained vocabulary without one."""
        return UNK_ID

    @property
    def mask_id(self) -> int | None:
        """Id of ``<mask>`` (4); None only for a pretrained vocabulary without one (GPT-2, T5)."""
        return MASK_ID

    @property
    def decoder_start_id(self) -> int:
        """The first id of a seq2seq decoder's input (the target shifted right): ``bos_id`` here; a pretrained
        vocabulary uses its model's own (T5 and Marian start from pad, BART from EOS)."""
        return BOS_ID

    @property
    def special_ids(self) -> frozenset[int]:
        """The ids of special tokens, which ``decode(skip_special=True)`` drops: 0-4 here."""
        return _BUILTIN_SPECIAL_IDS

    # ---- the protocol ------------------------------------------------------------------------
    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of ids, special tokens included; every id is in ``range(vocab_size)``."""

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Map text to token ids, without BOS/EOS. Unknown symbols become ``unk_id``."""

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Encode many texts; ``encode_batch(xs)[i] == encode(xs[i])``."""
        return [self.encode(t) for t in texts]

    @abstractmethod
    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        """Map ids back to text.

        Args:
            ids: token ids (any iterable of ints, e.g. a list or a 1-D tensor's ``tolist()``).
            skip_special: drop the special tokens (:attr:`special_ids`, ``<unk>`` included) instead of
                writing them.
                Decoding never stops early at ``</s>``; cut the ids first if you need that.
        """

    def decode_batch(self, batch: Sequence[Sequence[int]], skip_special: bool = True) -> list[str]:
        """Decode many id lists; ``decode_batch(b)[i] == decode(b[i])``."""
        return [self.decode(ids, skip_special=skip_special) for ids in batch]

    @abstractmethod
    def token_to_id(self, token: str) -> int | None:
        """The id of a vocabulary entry, or None when ``token`` is not in the vocabulary."""

    @abstractmethod
    def id_to_token(self, idx: int) -> str:
        """The vocabulary entry for ``idx``; AiaynError when ``idx`` is out of range."""

    @abstractmethod
    def normalize(self, text: str) -> str:
        """What ``decode(encode(text))`` returns: the text as this tokenizer can represent it."""

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """The tokenizer's state as JSON-ready data (without ``kind``/``format_version``)."""

    @classmethod
    @abstractmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<dict>") -> Tokenizer:
        """Rebuild a tokenizer from :meth:`to_dict` output; ``source`` names it in errors."""

    # ---- shared helpers ----------------------------------------------------------------------
    def _check_id(self, idx: int) -> None:
        if not 0 <= idx < self.vocab_size:
            raise AiaynError(
                f"token id {idx} is out of range for this {self.kind} tokenizer (vocab_size "
                f"{self.vocab_size}); the ids were made with a different tokenizer or model"
            )

    def save(self, path: str | Path) -> None:
        """Write the tokenizer to one JSON file (atomically); :func:`load_tokenizer` reads it back."""
        data = {"kind": self.kind, "format_version": FORMAT_VERSION, **self.to_dict()}
        atomic_write_text(Path(path), json.dumps(data, ensure_ascii=False, indent=1) + "\n")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size})"


class TableTokenizer(Tokenizer):
    """Base of tokenizers with an explicit vocabulary list (char, word): ids are positions in ``_itos``.

    Subclasses set ``_itos`` (special tokens first, then the vocabulary), ``_stoi`` (vocabulary only),
    ``separator`` (how decoded pieces join) and implement :meth:`pieces` (text -> tokens).
    """

    separator = ""
    _itos: list[str]
    _stoi: dict[str, int]

    def pieces(self, text: str) -> list[str]:
        """Split text into the units the vocabulary holds."""
        raise NotImplementedError

    @property
    def vocab_size(self) -> int:
        return len(self._itos)

    def encode(self, text: str) -> list[int]:
        get = self._stoi.get
        return [get(p, UNK_ID) for p in self.pieces(text)]

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        out = []
        for i in ids:
            i = int(i)
            if 0 <= i < NUM_SPECIAL and skip_special:
                continue
            self._check_id(i)
            out.append(self._itos[i])
        return self.separator.join(out)

    def token_to_id(self, token: str) -> int | None:
        if token in SPECIAL_TOKENS:
            return SPECIAL_TOKENS.index(token)
        return self._stoi.get(token)

    def id_to_token(self, idx: int) -> str:
        self._check_id(idx)
        return self._itos[idx]

    def normalize(self, text: str) -> str:
        stoi = self._stoi
        return self.separator.join(p for p in self.pieces(text) if p in stoi)


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load a tokenizer saved with :meth:`Tokenizer.save`, whatever its kind.

    Args:
        path: the JSON file.

    Raises:
        AiaynError: the file is missing, is not valid JSON, or has no known ``"kind"``.
    """
    path = Path(path)
    if not path.is_file():  # a file of a checkpoint whose save was cut short: the previous copy, <dir>.old
        path = recovered_file(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise _no_tokenizer(path) from None
    except OSError as e:
        raise AiaynError(f"{path}: cannot read the tokenizer file ({e}); check the path") from None
    return parse_tokenizer(data, path)


def checkpoint_tokenizer(ck: CheckpointRead, name: str) -> Tokenizer:
    """The tokenizer file ``name`` of a checkpoint pinned for one load, checked against its manifest.

    Raises:
        AiaynError: as :func:`load_tokenizer`, or the file differs from the checkpoint's manifest.
    """
    data = ck.read_bytes(name)
    if data is None:
        raise _no_tokenizer(ck.file(name))
    return parse_tokenizer(data, ck.file(name))


def _no_tokenizer(path: Path) -> AiaynError:
    return AiaynError(f"{path}: no such tokenizer file; check the path, or train and save a tokenizer first")


def parse_tokenizer(data: bytes | str, path: str | Path) -> Tokenizer:
    """The tokenizer that the JSON text ``data`` of the file ``path`` (named in errors) describes.

    Raises:
        AiaynError: not UTF-8, not valid JSON (nested too deeply included), or no known ``"kind"``.
    """
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as e:
        raise AiaynError(f"{path}: cannot read the tokenizer file ({e}); check the path") from None
    try:
        data = parse_json(text)
    except BadJSON as e:
        raise AiaynError(
            f"{where(path, e.line)}: the tokenizer file is not valid JSON ({e.detail}); "
            "it is corrupt or not a tokenizer file: train and save the tokenizer again"
        ) from None
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in _REGISTRY:
        trained = sorted(k for k, c in _REGISTRY.items() if c.trained)
        imported = " or ".join(repr(k) for k, c in sorted(_REGISTRY.items()) if not c.trained)
        raise AiaynError(
            f'{path}: unknown tokenizer kind {kind!r}; the "kind" field must be one of {trained}'
            f"{f' (trained) or {imported} (a pretrained vocabulary)' if imported else ''}. "
            "Is this a tokenizer file saved by aiayn?"
        )
    version = data.get("format_version", FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise AiaynError(
            f"{path}: tokenizer format_version {version!r} is not supported (this aiayn reads "
            f"{FORMAT_VERSION}); train and save the tokenizer again with this version"
        )
    return _REGISTRY[kind].from_dict(data, source=str(path))


def require_keys(data: dict[str, Any], keys: Sequence[str], source: str) -> None:
    """Raise AiaynError naming ``source`` when ``data`` lacks any of ``keys``."""
    missing = [k for k in keys if k not in data]
    if missing:
        raise AiaynError(
            f"{source}: tokenizer data lacks {missing}; the file is corrupt: train and save it again"
        )
