"""Pack variable-length documents into fixed-length blocks for decoder-only training.

The documents are laid end to end and the stream is cut every ``block_size`` tokens, so no space is
wasted except at the end of the last block. Each token keeps the index of its document
(``doc_ids``), from which a model builds the document mask
``doc_ids[:, :, None] == doc_ids[:, None, :]`` (combined with the causal mask) so that no token attends
across a document boundary, and ``labels`` never ask a token to predict the first token of another
document.

Documents longer than the room left in a block are split across blocks. Position ids count from 0 at
each document start and also restart at 0 at each block start, since the part of a document in a
later block cannot see its earlier part anyway (and absolute position tables stay within
``block_size``). The last token of each block has label -100: its next token, if any, sits in the
next block.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from aiayn.errors import AiaynError

IGNORE_INDEX = -100
PAD_DOC_ID = -1


@dataclass(frozen=True)
class PackedBlocks:
    """Packed training blocks, every tensor a LongTensor of shape (N, T).

    Attributes:
        input_ids: Token ids; padding (only at the end of the last block) is ``pad_id``.
        labels: The next token when it belongs to the same document and the same block, else -100.
        doc_ids: Index of each token's document in the input list; -1 on padding.
        position_ids: Position within the document, restarting at 0 at each document start and at
            each block start; 0 on padding.
    """

    input_ids: torch.Tensor
    labels: torch.Tensor
    doc_ids: torch.Tensor
    position_ids: torch.Tensor

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def __getitem__(self, index: int | slice | torch.Tensor) -> PackedBlocks:
        """Select blocks (e.g. a batch by a tensor of block indices); the result stays 2-D."""
        if isinstance(index, int):
            index = slice(index, index + 1)
        return PackedBlocks(
            self.input_ids[index], self.labels[index], self.doc_ids[index], self.position_ids[index]
        )


def pack_documents(
    docs: Sequence[Sequence[int]],
    block_size: int,
    *,
    append_eos: bool = True,
    eos_id: int = 2,
    pad_id: int = 0,
) -> PackedBlocks:
    """Pack documents into blocks of ``block_size`` tokens.

    Args:
        docs: Token-id lists, one per document. Empty documents are skipped (their index is unused).
        block_size: Block length T.
        append_eos: Append ``eos_id`` to every document (set False when the caller already did).
        eos_id: End-of-sequence id.
        pad_id: Id written into the padding at the end of the last block.

    Returns:
        :class:`PackedBlocks` with N = ceil(total tokens / T) blocks.
    """
    if block_size < 2:
        raise AiaynError(f"block_size must be at least 2 for packing, got {block_size}")
    pieces: list[torch.Tensor] = []
    doc_index: list[int] = []
    for i, doc in enumerate(docs):
        if len(doc) == 0:
            continue
        t = torch.as_tensor(list(doc), dtype=torch.long)
        if append_eos:
            t = torch.cat([t, torch.tensor([eos_id])])
        pieces.append(t)
        doc_index.append(i)
    if not pieces:
        raise AiaynError("nothing to pack: every document is empty; check the corpus and the tokenizer")

    lengths = torch.tensor([p.numel() for p in pieces])  # (D,)
    stream = torch.cat(pieces)  # (L,)
    doc = torch.repeat_interleave(torch.tensor(doc_index), lengths)  # (L,)
    doc_start = torch.repeat_interleave(torch.cumsum(lengths, 0) - lengths, lengths)  # (L,)

    total = stream.numel()
    n_blocks = -(-total // block_size)
    n_pad = n_blocks * block_size - total
    pos = torch.arange(total)  # (L,)
    block_start = pos - pos % block_size
    position_ids = pos - torch.maximum(doc_start, block_start)

    # Next token in the same document and the same block, else ignored.
    labels = torch.full((total,), IGNORE_INDEX, dtype=torch.long)
    same = (doc[1:] == doc[:-1]) & (pos[1:] % block_size != 0)  # (L-1,)
    labels[:-1] = torch.where(same, stream[1:], labels[:-1])

    def pad(t: torch.Tensor, value: int) -> torch.Tensor:
        return torch.cat([t, torch.full((n_pad,), value, dtype=torch.long)]).view(n_blocks, block_size)

    return PackedBlocks(
        input_ids=pad(stream, pad_id),
        labels=pad(labels, IGNORE_INDEX),
        doc_ids=pad(doc, PAD_DOC_ID),
        position_ids=pad(position_ids, 0),
    )
