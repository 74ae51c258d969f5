"""The operations of one decoding step, counted (``bench/step_ops.py``'s counter: every operator call that reaches
torch's dispatcher), for two small models: an encoder-decoder under beam 4 and a GPT-2-like decoder under greedy
decoding, each as the reference core and as ``load_pretrained`` accelerates it. A count, not a timing: a change
that adds operations to the step fails here; one that removes some lowers the pins.

At small sizes a step's time goes mostly to the work between operators, so these counts are a step's cost."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import benchlib  # noqa: E402
import step_ops  # noqa: E402
import translate_beam  # noqa: E402
from generate_lm import LMSize  # noqa: E402

from aiayn.accel.cpu import native  # noqa: E402

SEQ2SEQ = translate_beam.Seq2SeqSize("tiny", d_model=32, d_ff=64, n_heads=4, n_layers=2, vocab_size=61)
DECODER = LMSize(n_layers=2, d_model=32, n_heads=4, vocab_size=97, max_len=64)

#: operations per step of the reference core: plain torch, the same on every host
REFERENCE = {"seq2seq beam 4": 99, "decoder greedy": 65}
#: at most this many accelerated, where the native kernels are built (their calls are not torch operations)
ACCELERATED = {"seq2seq beam 4": 96, "decoder greedy": 63}


def _cases():
    return {"seq2seq beam 4": (lambda: translate_beam.reference_model(SEQ2SEQ), step_ops.seq2seq_decode),
            "decoder greedy": (lambda: step_ops.lm_model(DECODER), step_ops.lm_decode)}


def _per_step(model, decode) -> float:
    ops = step_ops.count(model, decode)
    return sum(v for k, v in ops.items() if k != "benchmark's EOS mask")


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("case", list(REFERENCE))
def test_a_reference_step_makes_the_pinned_number_of_operations(case: str) -> None:
    build, decode = _cases()[case]
    assert _per_step(build(), decode) == REFERENCE[case]


@pytest.mark.parametrize("case", list(ACCELERATED))
def test_an_accelerated_step_makes_no_more_operations_than_pinned(case: str) -> None:
    if native.library() is None:
        pytest.skip(f"the native kernels are not built here ({native.build_error}); the torch fallbacks count more")
    build, decode = _cases()[case]
    got = _per_step(benchlib.for_decoding(build()), decode)
    assert got <= ACCELERATED[case], f"{case}: {got:g} operations per step, more than the {ACCELERATED[case]} pinned"
    assert got <= REFERENCE[case], "the accelerator adds operations to the reference core's step"
