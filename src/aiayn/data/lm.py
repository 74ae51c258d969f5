"""Language-modeling data: read a plain-text corpus, split it, and cut it into (input, target) blocks.

The training sampler follows nanoGPT's ``get_batch``: each batch is ``B`` random contiguous windows of
``T + 1`` tokens, the input being the first ``T`` and the target the last ``T`` (the input shifted by
one). Unlike nanoGPT, the random offsets come from a private :class:`torch.Generator` whose state is
saved in :meth:`RandomBlockSampler.state_dict`, so a resumed run sees exactly the batches an
uninterrupted run would have seen.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from aiayn.errors import AiaynError, where


def read_text(path: str | Path) -> str:
    """Read a whole UTF-8 text file (plain, or gzip when the name ends in ``.gz``).

    Decoding is strict: invalid UTF-8 raises :class:`AiaynError` naming ``path:line`` of the first bad
    byte. A leading byte-order mark is dropped and Windows line ends (``\\r\\n``) become ``\\n``, as
    Python's text mode does.

    Args:
        path: The file to read.

    Returns:
        The file's text.
    """
    p = Path(path)
    if not p.is_file():
        hint = "it is a folder; name a file in it" if p.is_dir() else "check the path"
        raise AiaynError(f"{where(p)}: no such file ({hint})")
    try:
        data = gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()
    except (OSError, EOFError) as e:
        raise AiaynError(f"{where(p)}: cannot read the file ({e}); check that it is a valid file") from e
    try:
        text = data.decode("utf-8-sig", errors="strict")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise AiaynError(
            f"{where(p, line)}: invalid UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}); "
            f"re-encode the file as UTF-8, e.g. `iconv -f latin1 -t utf-8 {p} > fixed.txt`"
        ) from None
    return text.replace("\r\n", "\n")


def load_text_corpus(path: str | Path) -> str | list[str]:
    """Load a plain-text corpus.

    Args:
        path: A UTF-8 text file (plain or ``.gz``), or a folder whose ``*.txt`` files (not recursive)
            are the documents, taken in order of file name.

    Returns:
        The file's text for a file, or one string per document for a folder.

    Raises:
        AiaynError: The path does not exist, the folder holds no ``*.txt`` file, the corpus is
            empty, or a file is not valid UTF-8.
    """
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.glob("*.txt") if f.is_file())
        if not files:
            raise AiaynError(
                f"{where(p)}: the folder holds no *.txt file; put one document per .txt file in it"
            )
        docs = [read_text(f) for f in files]
        if not any(docs):
            raise AiaynError(f"{where(p)}: every *.txt file in the folder is empty; add text to them")
        return docs
    if not p.exists():
        raise AiaynError(f"{where(p)}: no such file or folder; check the path")
    text = read_text(p)
    if not text:
        raise AiaynError(f"{where(p)}: the file is empty; give a corpus with some text in it")
    return text


def split_text(
    text: str | list[str], val_fraction: float = 0.1
) -> tuple[str, str] | tuple[list[str], list[str]]:
    """Split a corpus into train and validation parts, the validation part taken from the end.

    A string is cut by characters, nanoGPT's split: the first ``1 - val_fraction`` of the characters
    train, the rest validate. A list of documents is cut by document count the same way, whole
    documents staying on one side.

    Args:
        text: The corpus text, or its documents.
        val_fraction: Fraction held out for validation, in ``[0, 1)``.

    Returns:
        ``(train, val)``, of the same type as ``text``.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise AiaynError(f"val_fraction must be in [0, 1), got {val_fraction}; e.g. use 0.1")
    cut = int(len(text) * (1.0 - val_fraction))
    return text[:cut], text[cut:]


def _check_ids(ids: torch.Tensor, block_size: int, what: str) -> None:
    if ids.dim() != 1:
        raise ValueError(f"{what}: ids must be a 1-D tensor of token ids, got shape {tuple(ids.shape)}")
    if block_size < 1:
        raise AiaynError(f"{what}: block_size must be at least 1, got {block_size}")


class RandomBlockSampler:
    """Random contiguous blocks of a token stream, nanoGPT style, reproducible and resumable.

    Args:
        ids: The token stream, a LongTensor of shape (N,).
        block_size: Block length T; needs N > T.
        batch_size: Number of blocks B per batch.
        seed: Seed of the private generator: the same seed gives the same batches.

    Example:
        >>> s = RandomBlockSampler(torch.arange(100), block_size=8, batch_size=4, seed=0)
        >>> x, y = s.next()  # x, y: (4, 8); y[:, :-1] == x[:, 1:]
    """

    def __init__(self, ids: torch.Tensor, block_size: int, batch_size: int, seed: int) -> None:
        _check_ids(ids, block_size, "RandomBlockSampler")
        if batch_size < 1:
            raise AiaynError(f"RandomBlockSampler: batch_size must be at least 1, got {batch_size}")
        if ids.numel() <= block_size:
            raise AiaynError(
                f"the training text has {ids.numel()} tokens but block_size={block_size} needs at least "
                f"{block_size + 1}; lower block_size (a recipe's data.block_size) or give more text"
            )
        self.ids = ids.long()
        self.block_size = block_size
        self.batch_size = batch_size
        self.seed = seed
        self.step = 0
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(seed)
        self._offsets = torch.arange(block_size + 1)  # (T+1,)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw the next batch.

        Returns:
            ``(x, y)``, LongTensors of shape (B, T) on the device of ``ids``, ``y`` being ``x``
            shifted left by one token.
        """
        n_starts = self.ids.numel() - self.block_size
        starts = torch.randint(n_starts, (self.batch_size,), generator=self.generator)  # (B,)
        idx = (starts[:, None] + self._offsets[None, :]).to(self.ids.device)  # (B, T+1)
        window = self.ids[idx]  # (B, T+1)
        self.step += 1
        return window[:, :-1], window[:, 1:]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.next()

    def state_dict(self) -> dict[str, Any]:
        """The sampler's position: ``generator_state`` (uint8 tensor), ``step`` and ``seed`` (ints)."""
        return {"generator_state": self.generator.get_state().clone(), "step": self.step, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a position saved by :meth:`state_dict`; the next batch is the one that would have
        followed when the state was saved."""
        missing = {"generator_state", "step"} - set(state)
        if missing:
            raise AiaynError(
                f"sampler state lacks {sorted(missing)}; resume from a checkpoint written by this version"
            )
        gen_state = state["generator_state"]
        if not isinstance(gen_state, torch.Tensor):
            gen_state = torch.as_tensor(gen_state)
        self.generator.set_state(gen_state.to(device="cpu", dtype=torch.uint8))
        self.step = int(state["step"])
        self.seed = int(state.get("seed", self.seed))


def sequential_blocks(
    ids: torch.Tensor, block_size: int, batch_size: int = 1
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Non-overlapping blocks covering a token stream once, for evaluation (e.g. perplexity).

    Every token but the first is a target exactly once. Full blocks come in batches of up to
    ``batch_size``; a final shorter block (the remainder) comes alone, as a batch of one.

    Args:
        ids: The token stream, a LongTensor of shape (N,), N >= 2.
        block_size: Block length T.
        batch_size: Blocks per batch B.

    Yields:
        ``(x, y)`` of shape (B, T) (or (1, T') for the remainder), ``y`` = ``x`` shifted by one.
    """
    _check_ids(ids, block_size, "sequential_blocks")
    if batch_size < 1:
        raise AiaynError(f"sequential_blocks: batch_size must be at least 1, got {batch_size}")
    if ids.numel() < 2:
        raise AiaynError(f"the evaluation corpus has {ids.numel()} tokens; it needs at least 2")
    n_targets = ids.numel() - 1
    n_full = n_targets // block_size
    x_full = ids[: n_full * block_size].view(n_full, block_size)  # (n_full, T)
    y_full = ids[1 : n_full * block_size + 1].view(n_full, block_size)  # (n_full, T)
    for i in range(0, n_full, batch_size):
        yield x_full[i : i + batch_size], y_full[i : i + batch_size]
    start = n_full * block_size
    if start < n_targets:
        yield ids[start:-1].unsqueeze(0), ids[start + 1 :].unsqueeze(0)  # (1, T')
