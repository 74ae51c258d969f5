"""The time-major self-attention cache against a plain reference: appends, reorders and growth."""

from __future__ import annotations

import pytest
import torch

from aiayn.nn.cache import DecoderCache, time_major_index


def test_time_major_index_selects_rows_at_every_position() -> None:
    index = torch.tensor([2, 0, 0])
    got = time_major_index(index, length=2, batch=3)
    assert got.tolist() == [2, 0, 0, 5, 3, 3]


def test_appends_reorders_and_growth_match_a_reference() -> None:
    """Keys/values read back equal the reference (B, H, S, Dh) tensors after every kind of row change."""
    g = torch.Generator().manual_seed(0)
    h, d = 2, 3
    cache = DecoderCache(n_layers=1, capacity=3)
    layer = cache.self_attn[0]
    ref_k = ref_v = None
    batch = 4
    plan = [  # (new positions, rows to keep afterwards or None)
        (2, torch.tensor([1, 0, 3, 2])),  # permutation, same batch size
        (1, torch.tensor([0, 0, 1, 1, 2, 2])),  # more rows (beam expansion)
        (1, torch.tensor([5, 4, 3, 2, 1, 0])),  # the capacity of 3 grows on this append
        (2, torch.tensor([1, 3])),  # fewer rows (finished sentences)
        (1, torch.tensor([1, 1])),
        (3, None),
    ]
    for t, index in plan:
        k, v = torch.randn(batch, h, t, d, generator=g), torch.randn(batch, h, t, d, generator=g)
        got_k, got_v = layer.append(k, v)
        ref_k = k if ref_k is None else torch.cat([ref_k, k], 2)
        ref_v = v if ref_v is None else torch.cat([ref_v, v], 2)
        assert torch.equal(got_k, ref_k) and torch.equal(got_v, ref_v)
        if index is not None:
            cache.reorder(index)
            ref_k, ref_v = ref_k[index], ref_v[index]
            batch = index.shape[0]
    assert layer.length == ref_k.shape[2] == 10 and layer.k.shape[0] >= 10


def test_decoder_cache_reorders_every_layer() -> None:
    cache = DecoderCache(n_layers=2, capacity=4)
    ks = [torch.randn(3, 1, 2, 4) for _ in cache.self_attn]
    for c, k in zip(cache.self_attn, ks):
        c.append(k, -k)
    cache.reorder(torch.tensor([2, 2, 0]))
    for c, k in zip(cache.self_attn, ks):
        got_k, got_v = c.append(torch.zeros(3, 1, 0, 4), torch.zeros(3, 1, 0, 4))
        assert torch.equal(got_k, k[[2, 2, 0]]) and torch.equal(got_v, -k[[2, 2, 0]])


def test_append_step_equals_append_in_every_layer_through_reorders_and_growth() -> None:
    """The fused one-position write (a QKV projection's key and value heads, (B, 2 Hkv, 1, Dh)) reads back as two
    appends do."""
    g = torch.Generator().manual_seed(1)
    h, d, layers = 2, 3, 3
    fused, split = DecoderCache(n_layers=layers, capacity=2), DecoderCache(n_layers=layers, capacity=2)
    first = [torch.randn(4, h, 1, d, generator=g) for _ in range(2 * layers)]
    for i in range(layers):  # the first position goes through append() in both
        fused.self_attn[i].append(first[2 * i], first[2 * i + 1])
        split.self_attn[i].append(first[2 * i], first[2 * i + 1])
    batch = 4
    for index in (torch.tensor([1, 0, 3, 2]), torch.tensor([0, 0, 2]), torch.tensor([2, 1, 0]), None):
        for i in range(layers):  # a step: the capacity of 2 grows at the second one
            kv = torch.randn(batch, 2 * h, 1, d, generator=g)
            got_k, got_v = fused.self_attn[i].append_step(kv)
            k, v = kv.view(batch, 2, h, 1, d).unbind(1)
            want_k, want_v = split.self_attn[i].append(k, v)
            assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)
        if index is not None:
            fused.reorder(index)
            split.reorder(index)
            batch = index.shape[0]
    assert fused.self_attn[0].length == 5 and fused.store.data.shape[0] >= 5


def test_keys_that_do_not_fit_the_store_are_refused() -> None:
    cache = DecoderCache(n_layers=2, capacity=4)
    cache.self_attn[0].append(torch.randn(3, 2, 1, 4), torch.randn(3, 2, 1, 4))
    with pytest.raises(ValueError, match="batch 3, 2 heads of width 4"):
        cache.self_attn[1].append(torch.randn(3, 1, 1, 8), torch.randn(3, 1, 1, 8))


def _extend_and_reorder(cache: DecoderCache, plan: list) -> None:
    """Run (is_token (B, t) | None, positions (B, t), default, rows to keep | None) steps on ``cache``'s bookkeeping."""
    for is_token, positions, default, keep in plan:
        padded = is_token is not None and not bool(is_token.all())
        cache.extend(is_token, positions, padded, default=default)
        if keep is not None:
            cache.reorder(keep)


def test_default_unpadded_positions_are_not_stored_until_needed() -> None:
    """Steps at default positions with no padding keep nothing per row (no op per step or reorder); once a padded or
    explicitly placed step comes, the stored flags and ids equal those of a cache that stored every step."""
    b = 3
    steps = [  # (is_token, positions, default, rows to keep)
        (None, torch.arange(0, 2)[None].expand(b, 2), True, torch.tensor([2, 0, 0])),
        (None, torch.tensor([[2]]).expand(b, 1), True, None),
        (None, torch.tensor([[3]]).expand(b, 1), True, torch.tensor([1, 1, 2])),
    ]
    lazy, stored = DecoderCache(n_layers=1, capacity=8), DecoderCache(n_layers=1, capacity=8)
    _extend_and_reorder(lazy, steps)
    _extend_and_reorder(stored, [(s[0], s[1], False, s[3]) for s in steps])
    assert lazy.key_pos is None and lazy.key_mask is None and not lazy.padded
    assert lazy.length == stored.length == 4
    torch.testing.assert_close(lazy.key_positions(b), stored.key_pos)
    assert stored.key_mask.all()
    # a padded step: from here on both store, and agree
    pad_step = [(torch.tensor([[True], [False], [True]]), torch.tensor([[4]]).expand(b, 1), True,
                 torch.tensor([2, 1, 0]))]
    _extend_and_reorder(lazy, pad_step)
    _extend_and_reorder(stored, pad_step)
    assert lazy.padded and lazy.length == 5
    torch.testing.assert_close(lazy.key_mask, stored.key_mask)
    torch.testing.assert_close(lazy.key_pos, stored.key_pos)
    assert lazy.key_mask[:, 4].tolist() == [True, False, True]
    # explicit (non-default) positions also leave the lazy form, without padding
    explicit, reference = DecoderCache(n_layers=1, capacity=8), DecoderCache(n_layers=1, capacity=8)
    moved = [(None, torch.arange(0, 2)[None].expand(2, 2), True, None), (None, torch.tensor([[7], [9]]), False, None)]
    _extend_and_reorder(explicit, moved)
    _extend_and_reorder(reference, [(s[0], s[1], False, s[3]) for s in moved])
    assert not explicit.padded and explicit.key_pos.tolist() == [[0, 1, 7], [0, 1, 9]]
    torch.testing.assert_close(explicit.key_pos, reference.key_pos)
    torch.testing.assert_close(explicit.key_mask, reference.key_mask)
