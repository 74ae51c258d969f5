"""Every accelerated path equals the reference core, for configurations generated from the config's own choice lists.

The cases cover every pair of values of (architecture, norm, norm position, activation, position scheme, MHA/GQA/MQA,
sliding window): a new value added to a choice list in ``aiayn.config`` enters this test by itself, and the
accelerator must either compute it exactly as the reference does or decline it (``aiayn.accel.cpu.support``).
Each case compares a training step's loss and gradients, inference logits of a padded batch, cached decoding steps
with beams reordered, and the greedy choice, with and without the native kernels (``aiayn.check``).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from aiayn import config as C
from aiayn.accel.cpu import native
from aiayn.accel.cpu.support import unsupported
from aiayn.check import check_accelerated
from aiayn.config import ModelConfig
from aiayn.models.build import build_model

HEADS = {"mha": 4, "gqa": 2, "mqa": 1}
DIMENSIONS: dict[str, tuple] = {
    "arch": C.ARCHS,
    "norm": C.NORMS,
    "norm_position": C.NORM_POSITIONS,
    "activation": C.ACTIVATIONS,
    "position": C.POSITIONS,
    "heads": tuple(HEADS),
    "sliding_window": (None, 3),
}


def pairwise_cases(dimensions: dict[str, tuple]) -> list[dict]:
    """A small list of cases in which every pair of values of two dimensions occurs at least once (greedy cover)."""
    names = list(dimensions)
    uncovered = {(a, va, b, vb) for a, b in itertools.combinations(names, 2)
                 for va in dimensions[a] for vb in dimensions[b]}
    candidates = [dict(zip(names, values)) for values in itertools.product(*dimensions.values())]
    cases = []
    while uncovered:
        best = max(candidates, key=lambda c: sum((a, c[a], b, c[b]) in uncovered
                                                 for a, b in itertools.combinations(names, 2)))
        cases.append(best)
        uncovered -= {(a, best[a], b, best[b]) for a, b in itertools.combinations(names, 2)}
    return cases


def _config(case: dict) -> ModelConfig:
    window = case["sliding_window"] if case["arch"] != "encoder" else None
    return ModelConfig(arch=case["arch"], vocab_size=97, d_model=32, n_heads=4, n_kv_heads=HEADS[case["heads"]],
                       n_layers=2, d_ff=48, max_len=64, dropout=0.1, norm=case["norm"],
                       norm_position=case["norm_position"], activation=case["activation"], position=case["position"],
                       sliding_window=window, tie_embeddings=case["arch"] != "encoder")


CASES = pairwise_cases(DIMENSIONS)


def test_the_cases_cover_every_pair_of_choices() -> None:
    seen = {(a, c[a], b, c[b]) for c in CASES for a, b in itertools.combinations(DIMENSIONS, 2)}
    for a, b in itertools.combinations(DIMENSIONS, 2):
        for va, vb in itertools.product(DIMENSIONS[a], DIMENSIONS[b]):
            assert (a, va, b, vb) in seen
    assert len(CASES) < 60  # a cover, not the product (864 x 2 cases)


@pytest.mark.parametrize("native_kernels", [True, False], ids=["native", "torch"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(v) for v in c.values()))
def test_accelerated_equals_reference(case: dict, native_kernels: bool) -> None:
    if native_kernels and native.library() is None:
        pytest.skip(f"the native kernels are not built here: {native.build_error}")
    config = _config(case)
    assert not unsupported(config), "a choice of the config lists the accelerator does not state it supports"
    torch.manual_seed(0)
    model = build_model(config)
    failed = [f"{r.compared}: {r.max_diff:.2e} > {r.tolerance:.0e}"
              for r in check_accelerated(model, native=native_kernels) if not r.passed]
    assert not failed, "\n".join(failed)


def test_an_unsupported_choice_falls_back_to_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """A config value the accelerator does not list makes its fast decoding step decline, and decoding still
    equals the reference."""
    from aiayn.accel.cpu import fast_step, support

    config = _config(CASES[0] | {"arch": "decoder"})
    monkeypatch.setitem(support.SUPPORTED, "activation", tuple(v for v in C.ACTIVATIONS if v != config.activation))
    assert unsupported(config) == [f"activation={config.activation!r}"]
    calls = []
    monkeypatch.setattr(fast_step.FastDecoderStep, "__call__", lambda *a, **k: calls.append(1))
    torch.manual_seed(0)
    rows = check_accelerated(build_model(config))
    assert all(r.passed for r in rows) and not calls
