"""Cached (incremental) decoding gives the same logits as recomputing everything, for every model variant."""

from __future__ import annotations

import pytest
import torch

from aiayn import ModelConfig, build_model
from aiayn.generate.lm import left_pad

ATOL = 1e-5



DECODER_VARIANTS = {
    "none": dict(position="none"),
    "sinusoidal": dict(position="sinusoidal"),
    "learned": dict(position="learned"),
    "rope": dict(position="rope"),
    "alibi": dict(position="alibi"),
    "t5": dict(position="t5"),
    "sliding_window": dict(position="rope", sliding_window=3),
    "gqa": dict(position="rope", n_kv_heads=2),
    "mqa_pre_ln_swiglu": dict(position="alibi", n_kv_heads=1, norm_position="pre", norm="rmsnorm",
                              activation="swiglu"),
}


def _model(arch: str, **kw: object) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(ModelConfig.preset("tiny", arch=arch, **kw)).eval()


@pytest.mark.parametrize("variant", list(DECODER_VARIANTS))
def test_decoder_cached_equals_full(variant: str, device: str) -> None:
    """Prefill a chunk, then feed one token at a time: logits equal a full causal forward."""
    model = _model("decoder", **DECODER_VARIANTS[variant]).to(device)
    ids = torch.randint(3, 64, (2, 9)).to(device)
    with torch.inference_mode():
        full = model(ids).logits  # (B, T, V)
        cache = model.new_cache(4)  # smaller than needed: exercises growth
        chunks = [model(ids[:, :3], cache=cache).logits]
        for t in range(3, ids.shape[1]):
            chunks.append(model(ids[:, t:t + 1], cache=cache).logits)
    torch.testing.assert_close(torch.cat(chunks, 1), full, atol=ATOL, rtol=0)


@pytest.mark.parametrize("variant", ["none", "learned", "rope", "alibi", "t5", "sliding_window", "gqa"])
def test_decoder_left_padded_cached_equals_full(variant: str) -> None:
    """Left padding with shifted positions: cached steps equal the full forward at every real position."""
    model = _model("decoder", **DECODER_VARIANTS[variant])
    seqs = [[1, 5, 6, 7, 8, 9, 10, 11], [1, 12, 13, 14, 15], [1, 20, 21]]
    ids, is_token = left_pad(seqs)
    positions = (is_token.long().cumsum(1) - 1).clamp(min=0)
    prompt = 4
    with torch.inference_mode():
        full = model(ids, is_token=is_token, positions=positions).logits
        cache = model.new_cache(ids.shape[1])
        chunks = [model(ids[:, :prompt], is_token=is_token[:, :prompt], positions=positions[:, :prompt],
                        cache=cache).logits]
        for t in range(prompt, ids.shape[1]):
            step = slice(t, t + 1)
            chunks.append(model(ids[:, step], is_token=is_token[:, step], positions=positions[:, step],
                                cache=cache).logits)
    cached = torch.cat(chunks, 1)
    torch.testing.assert_close(cached[is_token], full[is_token], atol=ATOL, rtol=0)
    # and each row equals the same sequence run alone, without padding
    with torch.inference_mode():
        for i, s in enumerate(seqs):
            alone = model(torch.tensor([s])).logits[0]
            torch.testing.assert_close(cached[i][is_token[i]], alone, atol=ATOL, rtol=0)


def test_decoder_cached_prefix_lm_equals_full() -> None:
    """A bidirectional prefix prefilled into the cache, then causal steps: same as the full prefix-LM pass."""
    model = _model("decoder", position="rope")
    ids = torch.randint(3, 64, (2, 8))
    prefix_len = torch.tensor([4, 4])
    with torch.inference_mode():
        full = model(ids, prefix_len=prefix_len).logits
        cache = model.new_cache(8)
        chunks = [model(ids[:, :4], prefix_len=prefix_len, cache=cache).logits]
        for t in range(4, 8):
            chunks.append(model(ids[:, t:t + 1], cache=cache).logits)
    torch.testing.assert_close(torch.cat(chunks, 1), full, atol=ATOL, rtol=0)


@pytest.mark.parametrize("position", ["sinusoidal", "learned", "rope", "alibi", "t5", "none"])
def test_seq2seq_cached_equals_teacher_forced(position: str, device: str) -> None:
    """Step-by-step decoding with the cache equals the teacher-forced forward (padded sources)."""
    model = _model("encoder-decoder", position=position).to(device)
    src = torch.tensor([[5, 6, 7, 8, 9, 2], [10, 11, 2, 0, 0, 0]], device=device)
    tgt = torch.cat([torch.ones(2, 1, dtype=torch.long), torch.randint(3, 64, (2, 6))], 1).to(device)  # BOS + target
    with torch.inference_mode():
        full = model(src, tgt).logits
        memory, src_is_token, _ = model.encode(src)
        cache = model.new_cache(3)
        steps = [model.decode(tgt[:, :1], memory, src_is_token, cache=cache).logits]
        for t in range(1, tgt.shape[1]):  # memory is no longer needed once projected into the cache
            steps.append(model.decode(tgt[:, t:t + 1], None, src_is_token, cache=cache).logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=ATOL, rtol=0)


def test_seq2seq_cache_reorder_follows_rows() -> None:
    """After ``cache.reorder(index, index)`` the decoder continues as if the batch had been permuted/repeated."""
    model = _model("encoder-decoder", position="sinusoidal", n_kv_heads=2)
    src = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 0], [10, 2, 0, 0]])
    tgt = torch.cat([torch.ones(3, 1, dtype=torch.long), torch.randint(3, 64, (3, 4))], 1)
    index = torch.tensor([2, 0, 0, 1])
    with torch.inference_mode():
        memory, src_is_token, _ = model.encode(src)
        cache = model.new_cache(8)
        model.decode(tgt[:, :3], memory, src_is_token, cache=cache)
        cache.reorder(index, memory_index=index)
        got = model.decode(tgt[index, 3:], None, src_is_token[index], cache=cache).logits
        want = model(src[index], tgt[index]).logits[:, 3:]
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("return_weights", [False, True])
def test_seq2seq_rows_sharing_one_memory_row_decode_as_with_their_own(return_weights: bool) -> None:
    """Beam layout: runs of g rows share one cached memory row (group g) and decode exactly as if each row
    had its own copy, for both attention paths (sdpa, and the reference one that returns weights)."""
    model = _model("encoder-decoder", position="sinusoidal", n_kv_heads=2)
    src = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 0], [10, 2, 0, 0]])
    tgt = torch.cat([torch.ones(3, 1, dtype=torch.long), torch.randint(3, 64, (3, 5))], 1)
    memory_index = torch.tensor([2, 0])  # sentence 1 leaves; 2 and 0 get three rows each
    rows = torch.tensor([2, 2, 2, 0, 0, 0])
    tgt_rows = torch.cat([tgt[rows, :3], torch.randint(3, 64, (6, 3))], 1)  # the three rows then diverge
    with torch.inference_mode():
        memory, src_is_token, _ = model.encode(src)
        cache = model.new_cache(8)
        model.decode(tgt[:, :3], memory, src_is_token, cache=cache)
        cache.reorder(rows, memory_index=memory_index, group=3)
        assert cache.cross_attn[0].k.shape[0] == 2  # one copy per sentence, not one per row
        out = model.decode(tgt_rows[:, 3:], None, src_is_token[memory_index], cache=cache,
                           return_weights=return_weights)
        want = model(src[rows], tgt_rows, return_weights=return_weights)
    torch.testing.assert_close(out.logits, want.logits[:, 3:], atol=ATOL, rtol=0)
    if return_weights:
        for w, w_full in zip(out.attentions["cross"], want.attentions["cross"]):
            assert w.shape == (6, 4, 3, 4)
            torch.testing.assert_close(w, w_full[:, :, 3:], atol=ATOL, rtol=0)


def test_seq2seq_stepper_reorder_with_unknown_sources() -> None:
    """``reorder(index)`` without hints, after beams were grouped: a permutation within each sentence's rows keeps
    the shared memory, one across sentences gives every row its own; either way the logits follow the rows."""
    from aiayn.generate.steppers import Seq2SeqStepper

    model = _model("encoder-decoder", position="sinusoidal")
    src = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 0]])
    with torch.inference_mode():
        stepper = Seq2SeqStepper(model, src, capacity=8)
        stepper.first()
        stepper.reorder(torch.tensor([0, 0, 1, 1]), group=2)  # beam expansion: two rows per sentence
        first = torch.tensor([10, 11, 12, 13])
        stepper.step(first)
        history = [[1, 10], [1, 11], [1, 12], [1, 13]]
        for index, shared in ((torch.tensor([1, 0, 3, 2]), 2), (torch.tensor([2, 1, 0]), 1)):
            stepper.reorder(index)
            assert stepper.group == shared
            history = [history[i] + [20 + j] for j, i in enumerate(index.tolist())]
            got = stepper.step(torch.arange(20, 20 + len(history)))
            rows = [0 if i < 2 else 1 for i in index.tolist()] if shared == 1 else [0, 0, 1, 1]
            want = model(src[rows], torch.tensor(history)).logits[:, -1]
            torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
