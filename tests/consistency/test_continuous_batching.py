"""Continuous batching == each sequence alone: sequences of mixed prompt and output lengths, greedy and sampled,
arriving at different steps, prefilled in chunks, cancelled midway, decode what ``generate`` gives each alone."""

from __future__ import annotations

import random

import pytest
import torch

from aiayn import ModelConfig, build_model
from aiayn.accel import accelerate
from aiayn.generate import generate
from aiayn.generate.continuous import Continuation, ContinuousBatch
from aiayn.models import DecoderModel

PAD, STOP = 0, 5


def lm(position: str) -> DecoderModel:
    """A tiny pre-LN language model with large random weights (varied continuations, few near ties)."""
    torch.manual_seed(0)
    model = build_model(ModelConfig.preset("tiny", arch="decoder", position=position, norm_position="pre",
                                           tie_embeddings=False, vocab_size=40, max_len=128))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.5)
    return model.eval()


def requests(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [rng.randrange(1, 40) for _ in range(rng.randrange(1, 14))]
        greedy = i % 3 != 2
        out.append(dict(prompt=prompt, max_new_tokens=rng.randrange(1, 12), greedy=greedy,
                        temperature=1.0 if greedy else 0.9, top_k=None if greedy else 20, seed=None if greedy else i,
                        arrive=rng.randrange(0, 8)))
    return out


def alone(model: DecoderModel, r: dict) -> list[int]:
    kw = dict(greedy=True) if r["greedy"] else dict(temperature=r["temperature"], top_k=r["top_k"], seed=r["seed"])
    return generate(model, [r["prompt"]], max_new_tokens=r["max_new_tokens"], stop_ids=(STOP,), pad_id=PAD,
                    **kw)[0]


def batched(model: DecoderModel, reqs: list[dict], max_batch: int = 16, prefill_chunk: int = 512,
            cancel: set[int] = frozenset()) -> tuple[list[list[int]], list[str], ContinuousBatch]:
    batch = ContinuousBatch(model, pad_id=PAD, banned_ids=(PAD,), max_batch=max_batch, prefill_chunk=prefill_chunk)
    got: list[list[int]] = [[] for _ in reqs]
    ends: list[str] = [""] * len(reqs)
    seqs = [Continuation(r["prompt"], r["max_new_tokens"], frozenset({STOP}), r["greedy"], r["temperature"],
                         r["top_k"], None, r["seed"], on_token=lambda t, lp, top, i=i: got[i].append(t),
                         on_end=lambda why, i=i: ends.__setitem__(i, why)) for i, r in enumerate(reqs)]
    step = 0
    while step < 200 and (batch.busy or any(not e for e in ends)):
        for i, r in enumerate(reqs):
            if r["arrive"] == step:
                batch.add(seqs[i])
            if i in cancel and step == r["arrive"] + 2:
                batch.cancel(seqs[i])
        batch.step()
        step += 1
    assert all(ends), "every sequence ended"
    return got, ends, batch


@pytest.mark.parametrize("position", ["learned", "rope", "alibi"])
@pytest.mark.parametrize("accelerated", [False, True])
def test_every_sequence_decodes_as_it_does_alone(position: str, accelerated: bool) -> None:
    model = lm(position)
    if accelerated:
        model = accelerate(model, "decode", accel="auto")
    reqs = requests(24)
    got, ends, batch = batched(model, reqs, max_batch=8)
    for r, g, e in zip(reqs, got, ends):
        assert g == alone(model, r), r
        assert e == ("length" if len(g) == r["max_new_tokens"] else "stop")
    assert not batch.busy


def test_a_long_prompt_is_prefilled_in_chunks_and_equals_one_prefill() -> None:
    model = lm("rope")
    reqs = [dict(r, prompt=r["prompt"] * 4) for r in requests(6, seed=3)]
    assert [batched(model, reqs, prefill_chunk=5)[0]] == [[alone(model, r) for r in reqs]]


def test_a_cancelled_sequence_ends_and_the_others_are_unchanged() -> None:
    model = lm("learned")
    reqs = [dict(r, max_new_tokens=10) for r in requests(6, seed=5)]
    got, ends, _ = batched(model, reqs, cancel={1, 4})
    for i, r in enumerate(reqs):
        if i in (1, 4):
            assert ends[i] == "cancelled" and got[i] == alone(model, r)[:len(got[i])]
        else:
            assert got[i] == alone(model, r) and ends[i] != "cancelled"


def test_the_cache_follows_the_longest_running_row() -> None:
    """After a long sequence leaves, the cache forgets the positions only it used."""
    model = lm("rope")
    batch = ContinuousBatch(model, pad_id=PAD, banned_ids=(PAD,))
    long = Continuation(list(range(1, 30)), 6)
    short = Continuation([3, 4], 8)
    batch.add(long)
    batch.step()  # the long prompt prefilled, its first token fed
    batch.add(short)  # a group of its own: its two positions right-aligned to the long row's
    batch.step()
    assert batch._stepper.cache.length == 31
    while long in batch.rows:
        batch.step()
    live = [n for n, s in zip(batch._lengths, batch.rows) if s is not None]
    assert batch._stepper.cache.length == max(live) < 30
    while batch.busy:
        batch.step()
    assert len(short.tokens) <= 8 and long.ended and short.ended


def test_sequences_take_the_rows_of_those_that_left_and_still_decode_as_alone() -> None:
    """More sequences than rows, arriving over time: later ones reuse freed rows (no copy of the others)."""
    model = lm("rope")
    reqs = [dict(r, arrive=i) for i, r in enumerate(requests(30, seed=11))]
    got, ends, batch = batched(model, reqs, max_batch=4)
    assert [g for g in got] == [alone(model, r) for r in reqs]
    assert all(e in ("stop", "length") for e in ends)
