"""Every mask in ``aiayn.nn.masks`` on small examples checked by hand (True = may attend)."""

from __future__ import annotations

import torch

from aiayn.nn import masks as M


def _m(rows: list[str]) -> torch.Tensor:
    """Mask from strings of 1/0, one per query row."""
    return torch.tensor([[c == "1" for c in r] for r in rows], dtype=torch.bool)


def test_padding_masks() -> None:
    ids = torch.tensor([[5, 6, 0, 0], [7, 0, 0, 0]])
    m = M.padding_mask_from_ids(ids, pad_id=0)
    assert m.shape == (2, 1, 1, 4) and m.dtype == torch.bool
    assert m[:, 0, 0].tolist() == [[True, True, False, False], [True, False, False, False]]
    assert torch.equal(M.padding_mask(ids != 0), m)
    # another pad id
    other = M.padding_mask_from_ids(torch.tensor([[3, 1, 3]]), pad_id=3)
    assert other[0, 0, 0].tolist() == [False, True, False]


def test_causal_mask_square_and_aligned_to_the_end_of_the_keys() -> None:
    assert torch.equal(M.causal_mask(3), _m(["100", "110", "111"]))
    # two new queries over five keys (KV cache): they sit at absolute positions 3 and 4
    assert torch.equal(M.causal_mask(2, 5), _m(["11110", "11111"]))
    assert torch.equal(M.causal_mask(1, 4), _m(["1111"]))


def test_sliding_window_mask() -> None:
    assert torch.equal(M.sliding_window_mask(5, 2), _m(["10000", "11000", "01100", "00110", "00011"]))
    assert torch.equal(M.sliding_window_mask(5, 2, causal=False),
                       _m(["11000", "11100", "01110", "00111", "00011"]))
    assert torch.equal(M.sliding_window_mask(2, 3, s=5), _m(["01110", "00111"]))
    # a window at least as long as the sequence is just the causal mask
    assert torch.equal(M.sliding_window_mask(4, 4), M.causal_mask(4))
    assert torch.equal(M.sliding_window_mask(4, 1), torch.eye(4, dtype=torch.bool))


def test_prefix_lm_mask() -> None:
    m = M.prefix_lm_mask(4, torch.tensor([2, 0, 4]))
    assert m.shape == (3, 1, 4, 4)
    assert torch.equal(m[0, 0], _m(["1100", "1100", "1110", "1111"]))
    assert torch.equal(m[1, 0], M.causal_mask(4))  # empty prefix: plain causal
    assert torch.equal(m[2, 0], torch.ones(4, 4, dtype=torch.bool))  # whole sequence is prefix
    assert torch.equal(M.prefix_lm_mask(4, torch.tensor([1]))[0, 0], M.causal_mask(4))


def test_local_global_mask() -> None:
    m = M.local_global_mask(6, window=2, global_positions=[0])
    assert torch.equal(m, _m(["111111",
                              "111000",
                              "111100",
                              "101110",
                              "100111",
                              "100011"]))
    mc = M.local_global_mask(6, window=2, global_positions=torch.tensor([0, 3]), causal=True)
    assert torch.equal(mc, _m(["100000",
                               "110000",
                               "111000",
                               "111100",
                               "100110",
                               "100111"]))


def test_block_sparse_mask() -> None:
    # blocks of 2 over 6 tokens: blocks 0,0,1,1,2,2; local_blocks=1 keeps only the own block
    assert torch.equal(M.block_sparse_mask(6, block=2),
                       _m(["110000", "110000", "001100", "001100", "000011", "000011"]))
    # summary block every 2 blocks: block 1 (kb % 2 == 1) is visible to all
    assert torch.equal(M.block_sparse_mask(6, block=2, stride=2),
                       _m(["111100", "111100", "001100", "001100", "001111", "001111"]))
    assert torch.equal(M.block_sparse_mask(6, block=2, local_blocks=2, causal=True),
                       _m(["100000", "110000", "111000", "111100", "001110", "001111"]))


def test_document_mask() -> None:
    docs = torch.tensor([[0, 0, 1, 1, 1, -1]])
    m = M.document_mask(docs)
    assert m.shape == (1, 1, 6, 6)
    assert torch.equal(m[0, 0], _m(["100000", "110000", "001000", "001100", "001110", "000001"]))
    mb = M.document_mask(docs, causal=False)
    assert torch.equal(mb[0, 0], _m(["110000", "110000", "001110", "001110", "001110", "000001"]))


def test_combine_broadcasts_and_ignores_none() -> None:
    assert M.combine() is None and M.combine(None, None) is None
    causal = M.causal_mask(3)
    assert M.combine(None, causal) is causal
    pad = M.padding_mask(torch.tensor([[True, True, False], [True, False, False]]))  # (2, 1, 1, 3)
    both = M.combine(causal, None, pad)
    assert both is not None and both.shape == (2, 1, 3, 3)
    assert torch.equal(both[0, 0], _m(["100", "110", "110"]))
    assert torch.equal(both[1, 0], _m(["100", "100", "100"]))
    assert torch.equal(M.combine(M.sliding_window_mask(4, 2), M.causal_mask(4)), M.sliding_window_mask(4, 2))


def test_render() -> None:
    m = _m(["10", "01"])
    assert M.render(m) == "   0 -inf\n-inf    0"
    assert M.render(m, as_bias=False) == "1 0\n0 1"
    assert M.render(m[None, None]) == M.render(m)  # leading singleton dims are squeezed
