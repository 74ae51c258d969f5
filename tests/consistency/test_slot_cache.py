"""The KV cache addressed by slot decodes exactly as the one addressed by position and as the full forward: a
sliding-window model's cache of ``window`` slots (memory bounded by the window) and a static cache of fixed shapes."""

from __future__ import annotations

import pytest
import torch

from aiayn import ModelConfig, build_model
from aiayn.check import check_cached
from aiayn.generate.lm import left_pad
from aiayn.nn.cache import DecoderCache

ATOL = 1e-5
WINDOW = 4
VARIANTS = {
    "rope": dict(position="rope"),
    "alibi-gqa": dict(position="alibi", n_kv_heads=2),
    "t5": dict(position="t5"),
    "learned-tiled": dict(position="learned", attention_backend="tiled"),
}


def _model(arch: str = "decoder", **kw: object) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(ModelConfig.preset("tiny", arch=arch, sliding_window=WINDOW, **kw)).eval()


def _decode(model: torch.nn.Module, ids: torch.Tensor, cache: DecoderCache, chunks: list[int]) -> torch.Tensor:
    """Logits of ``ids`` fed in chunks of the given sizes through ``cache``."""
    out, start = [], 0
    for size in chunks:
        out.append(model(ids[:, start:start + size], cache=cache).logits)
        start += size
    return torch.cat(out, 1)


@pytest.mark.parametrize("chunks", [[2] + [1] * 14, [7] + [1] * 8, [3, 5, 1, 6, 1]],
                         ids=["short-prompt", "prompt-longer-than-the-window", "chunks"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_rolling_equals_full_cache_and_full_forward(variant: str, chunks: list[int]) -> None:
    model = _model(**VARIANTS[variant])
    ids = torch.randint(3, 64, (2, sum(chunks)))
    with torch.inference_mode():
        full = model(ids).logits
        rolling_cache = model.new_cache(ids.shape[1])
        assert rolling_cache.slotted and rolling_cache.store.capacity == WINDOW
        rolling = _decode(model, ids, rolling_cache, chunks)
        kept = _decode(model, ids, DecoderCache(model.config.n_layers, ids.shape[1]), chunks)
        static = _decode(model, ids, model.new_cache(ids.shape[1], static=True), chunks)
    torch.testing.assert_close(rolling, kept, atol=ATOL, rtol=0)
    torch.testing.assert_close(rolling, full, atol=ATOL, rtol=0)
    torch.testing.assert_close(static, full, atol=ATOL, rtol=0)


@pytest.mark.parametrize("chunks", [[2] + [1] * 10, [5, 1, 3, 1, 1, 1]], ids=["steps", "chunks"])
@pytest.mark.parametrize("variant", ["rope", "alibi-gqa", "t5", "learned-tiled", "sinusoidal"])
def test_a_static_cache_without_a_window_equals_the_full_forward(variant: str, chunks: list[int]) -> None:
    torch.manual_seed(0)
    kw = VARIANTS.get(variant, dict(position="sinusoidal"))
    model = build_model(ModelConfig.preset("tiny", arch="decoder", **kw)).eval()
    ids = torch.randint(3, 64, (2, sum(chunks)))
    with torch.inference_mode():
        full = model(ids).logits
        cache = model.new_cache(ids.shape[1] + 3, static=True)
        static = _decode(model, ids, cache, chunks)
    torch.testing.assert_close(static, full, atol=ATOL, rtol=0)
    assert cache.store.data.shape[0] == ids.shape[1] + 3 and cache.length == ids.shape[1]


def test_a_static_cache_refuses_a_chunk_past_its_capacity() -> None:
    model = build_model(ModelConfig.preset("tiny", arch="decoder")).eval()
    with torch.inference_mode():
        cache = model.new_cache(6, static=True)
        model(torch.randint(3, 64, (1, 4)), cache=cache)
        with pytest.raises(ValueError, match="do not fit a static cache of 6"):
            model(torch.randint(3, 64, (1, 3)), cache=cache)


def test_memory_is_bounded_by_the_window() -> None:
    model = _model(position="rope", n_kv_heads=2)
    ids = torch.randint(3, 64, (3, 40))
    with torch.inference_mode():
        cache = model.new_cache(64)
        _decode(model, ids, cache, [5] + [1] * 35)
    for layer in cache.self_attn:
        assert layer.k.shape == layer.v.shape == (WINDOW, 3, 2, 8)  # (W, B, Hkv, Dh) after 40 positions
    assert cache.slot_pos.shape == (3, WINDOW) and cache.step_mask.shape == (3, 1, 1, WINDOW)
    assert cache.length == 40


def test_left_padded_rows_decode_as_each_sequence_alone() -> None:
    model = _model(position="alibi")
    seqs = [[1, 5, 6, 7, 8, 9, 10, 11, 12, 13], [1, 12, 13], [1, 20, 21, 22, 23, 24]]
    ids, is_token = left_pad(seqs)
    positions = (is_token.long().cumsum(1) - 1).clamp(min=0)
    with torch.inference_mode():
        cache = model.new_cache(ids.shape[1])
        out = [model(ids[:, :6], is_token=is_token[:, :6], positions=positions[:, :6], cache=cache).logits]
        for t in range(6, ids.shape[1]):
            s = slice(t, t + 1)
            out.append(model(ids[:, s], is_token=is_token[:, s], positions=positions[:, s], cache=cache).logits)
        cached = torch.cat(out, 1)
        for i, seq in enumerate(seqs):
            alone = model(torch.tensor([seq])).logits[0]
            torch.testing.assert_close(cached[i][is_token[i]], alone, atol=ATOL, rtol=0)


def test_beam_reordering_moves_the_slots_with_their_rows() -> None:
    model = _model(position="t5")
    ids = torch.randint(3, 64, (3, 12))
    order = torch.tensor([1, 1, 2])
    with torch.inference_mode():
        cache = model.new_cache(16)
        _decode(model, ids[:, :10], cache, [6] + [1] * 4)
        cache.reorder(order)
        steps = _decode(model, ids[order, 10:], cache, [1, 1])
        full = model(ids[order]).logits[:, 10:]
    torch.testing.assert_close(steps, full, atol=ATOL, rtol=0)


def test_an_encoder_decoder_with_a_window_decodes_as_its_full_forward() -> None:
    model = _model("encoder-decoder", position="rope")
    assert check_cached(model, length=12).passed
    src = torch.tensor([[5, 6, 7, 8, 9], [10, 11, 12, 0, 0]])
    tgt = torch.randint(3, 64, (2, 11))
    with torch.inference_mode():
        memory, src_is_token, _ = model.encode(src)
        full = model.decode(tgt, memory, src_is_token).logits
        cache = model.new_cache(16)
        assert cache.slotted
        steps = [model.decode(tgt[:, t:t + 1], memory, src_is_token, cache=cache).logits for t in range(11)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=ATOL, rtol=0)


def test_a_capacity_within_the_window_keeps_the_cache_addressed_by_position() -> None:
    assert not _model(position="rope").new_cache(WINDOW).slotted
