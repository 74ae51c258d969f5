"""Tests for aiayn.data.packing: document packing for decoder-only training."""

from __future__ import annotations

import random

import pytest
import torch

from aiayn.data.packing import IGNORE_INDEX, PAD_DOC_ID, pack_documents
from aiayn.errors import AiaynError

EOS, PAD = 2, 0


def _random_docs(seed: int, n: int = 12, max_len: int = 20) -> list[list[int]]:
    rng = random.Random(seed)
    # Ids >= 5 so EOS/PAD never occur inside a document.
    return [[rng.randrange(5, 50) for _ in range(rng.randrange(1, max_len))] for _ in range(n)]


def test_small_example_by_hand() -> None:
    p = pack_documents([[10, 11, 12], [20, 21]], block_size=4)
    assert p.input_ids.tolist() == [[10, 11, 12, EOS], [20, 21, EOS, PAD]]
    assert p.labels.tolist() == [[11, 12, EOS, -100], [21, EOS, -100, -100]]
    assert p.doc_ids.tolist() == [[0, 0, 0, 0], [1, 1, 1, -1]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3], [0, 1, 2, 0]]


def test_document_split_across_blocks_restarts_positions() -> None:
    p = pack_documents([[5, 6, 7, 8, 9, 10]], block_size=4, append_eos=False)
    assert p.input_ids.tolist() == [[5, 6, 7, 8], [9, 10, PAD, PAD]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3], [0, 1, 0, 0]]
    assert p.labels.tolist() == [[6, 7, 8, -100], [10, -100, -100, -100]]
    assert p.doc_ids.tolist() == [[0, 0, 0, 0], [0, 0, -1, -1]]


@pytest.mark.parametrize("seed,block_size", [(0, 8), (1, 16), (2, 7), (3, 64)])
def test_invariants(seed: int, block_size: int) -> None:
    docs = _random_docs(seed)
    p = pack_documents(docs, block_size)
    ids, labels, doc, pos = p.input_ids, p.labels, p.doc_ids, p.position_ids
    N, T = ids.shape
    assert T == block_size and all(t.shape == (N, T) and t.dtype == torch.long for t in (labels, doc, pos))

    # Every token of every doc (plus its EOS) appears exactly once, in order.
    flat_ids, flat_doc = ids.flatten(), doc.flatten()
    for i, d in enumerate(docs):
        assert flat_ids[flat_doc == i].tolist() == d + [EOS]
    total = sum(len(d) + 1 for d in docs)
    assert int((flat_doc != PAD_DOC_ID).sum()) == total

    # Padding only at the end: the non-pad positions are a prefix of the flat stream.
    pad = flat_doc == PAD_DOC_ID
    assert not pad[:total].any() and pad[total:].all()
    assert (flat_ids[pad] == PAD).all() and (labels.flatten()[pad] == IGNORE_INDEX).all()
    assert N == -(-total // block_size)

    # No label crosses a document or block boundary; every other label is the next token.
    for b in range(N):
        for t in range(T):
            same = t + 1 < T and doc[b, t] != PAD_DOC_ID and doc[b, t + 1] == doc[b, t]
            assert labels[b, t].item() == (ids[b, t + 1].item() if same else IGNORE_INDEX)

    # Positions reset to 0 at each document start and at each block start, else count up.
    for b in range(N):
        for t in range(T):
            if doc[b, t] == PAD_DOC_ID:
                assert pos[b, t] == 0
            elif t == 0 or doc[b, t - 1] != doc[b, t]:
                assert pos[b, t] == 0
            else:
                assert pos[b, t] == pos[b, t - 1] + 1


def test_document_mask_from_doc_ids_blocks_cross_document_attention() -> None:
    p = pack_documents([[7, 8], [9, 10, 11]], block_size=8)
    doc = p.doc_ids  # (1, 8)
    mask = (doc[:, :, None] == doc[:, None, :]) & torch.ones(8, 8, dtype=torch.bool).tril()
    # Token 0 of doc 1 (flat position 3) sees only itself.
    assert mask[0, 3].nonzero().flatten().tolist() == [3]
    # Every row has at least one allowed key (pads see pads), so attention never yields NaN.
    assert mask.any(-1).all()


def test_options_and_errors() -> None:
    p = pack_documents([[5, 6, EOS], [], [7, EOS]], block_size=3, append_eos=False, pad_id=99)
    assert p.input_ids.tolist() == [[5, 6, EOS], [7, EOS, 99]]
    assert p.doc_ids.tolist() == [[0, 0, 0], [2, 2, -1]]  # the empty doc 1 is skipped
    assert len(p) == 2 and p[1].input_ids.shape == (1, 3)
    with pytest.raises(AiaynError, match="nothing to pack"):
        pack_documents([[], []], block_size=4, append_eos=False)
    with pytest.raises(AiaynError, match="block_size"):
        pack_documents([[5]], block_size=1)
