"""Every accelerated path equals the reference core, for configurations generated from the config's own choice lists.

The cases cover every pair of values of (architecture, norm, norm position, activation, GELU approximation, position
scheme, sinusoidal layout, RoPE scaling, MHA/GQA/MQA, sliding window, biases, embedding norm, token types, position
offset, output bias, tied-output rescale): a new value added to a choice list in ``aiayn.config`` enters this test by
itself. The accelerator changes kernels at the core's seams only, so every case must compute what the reference does.
Each case compares a training step's loss and gradients, inference logits of a padded batch, cached decoding steps
with beams reordered, and the greedy choice, with and without the native kernels (``aiayn.check``). Heads of another
width than d_model / n_heads (``head_dim``) are held to the reference the same way.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from aiayn import accel
from aiayn import config as C
from aiayn.accel.cpu import native
from aiayn.check import check_accelerated
from aiayn.config import ModelConfig
from aiayn.models.build import build_model

HEADS = {"mha": 4, "gqa": 2, "mqa": 1}
BIASES = {"all": dict(bias=True), "none": dict(bias=False), "qkv": dict(bias=False, qkv_bias=True)}
DIMENSIONS: dict[str, tuple] = {
    "arch": C.ARCHS,
    "norm": C.NORMS,
    "norm_position": C.NORM_POSITIONS,
    "activation": C.ACTIVATIONS,
    "gelu_approximate": C.GELU_APPROXIMATIONS,
    "position": C.POSITIONS,
    "sinusoidal_layout": C.SINUSOIDAL_LAYOUTS,
    "rope_scaling": C.ROPE_SCALINGS,
    "heads": tuple(HEADS),
    "sliding_window": (None, 3),
    "biases": tuple(BIASES),
    "embedding_norm": (False, True),
    "n_token_types": (None, 2),
    "position_offset": (0, 2),
    "output_bias": (False, True),
    "tied_output_scale": (False, True),
}


def pairwise_cases(dimensions: dict[str, tuple]) -> list[dict]:
    """A small list of cases in which every pair of values of two dimensions occurs at least once (greedy cover).

    Each case starts from the first pair not yet covered and takes, dimension by dimension, the value that covers
    the most uncovered pairs with the values chosen so far (first value on ties): deterministic, and it never lists
    the product of all dimensions.
    """
    names = list(dimensions)
    order = {name: i for i, name in enumerate(names)}
    combos = list(itertools.combinations(names, 2))
    uncovered = dict.fromkeys((a, va, b, vb) for a, b in combos for va in dimensions[a] for vb in dimensions[b])

    def pair(x: str, vx: object, y: str, vy: object) -> tuple:
        return (x, vx, y, vy) if order[x] < order[y] else (y, vy, x, vx)

    cases = []
    while uncovered:
        a, va, b, vb = next(iter(uncovered))
        case = {a: va, b: vb}
        for name in names:
            if name not in case:
                case[name] = max(dimensions[name],
                                 key=lambda v: sum(pair(x, vx, name, v) in uncovered for x, vx in case.items()))
        cases.append({name: case[name] for name in names})
        for x, y in combos:
            uncovered.pop((x, case[x], y, case[y]), None)
    return cases


def _config(case: dict) -> ModelConfig:
    """The case's config; a value that the architecture does not take falls back to the default (the pair is
    still listed: the test shows the accelerator takes the config as it is)."""
    encoder = case["arch"] == "encoder"
    scaled = case["rope_scaling"] != "none"
    return ModelConfig(arch=case["arch"], vocab_size=97, d_model=32, n_heads=4, n_kv_heads=HEADS[case["heads"]],
                       n_layers=2, d_ff=48, max_len=64, dropout=0.1, norm=case["norm"],
                       norm_position=case["norm_position"], activation=case["activation"],
                       gelu_approximate=case["gelu_approximate"], position=case["position"],
                       sinusoidal_layout=case["sinusoidal_layout"], position_offset=case["position_offset"],
                       rope_scaling=case["rope_scaling"], rope_scaling_factor=2.0 if scaled else 1.0,
                       rope_original_max_len=16 if scaled else None,
                       sliding_window=None if encoder else case["sliding_window"], **BIASES[case["biases"]],
                       embedding_norm=case["embedding_norm"],
                       n_token_types=None if case["arch"] == "encoder-decoder" else case["n_token_types"],
                       tie_embeddings=not encoder, output_bias=case["output_bias"] and not encoder,
                       tied_output_scale=case["tied_output_scale"] and not encoder)


CASES = pairwise_cases(DIMENSIONS)


def test_the_cases_cover_every_pair_of_choices() -> None:
    seen = {(a, c[a], b, c[b]) for c in CASES for a, b in itertools.combinations(DIMENSIONS, 2)}
    for a, b in itertools.combinations(DIMENSIONS, 2):
        for va, vb in itertools.product(DIMENSIONS[a], DIMENSIONS[b]):
            assert (a, va, b, vb) in seen
    assert len(CASES) < 60  # a cover, not the product (millions of cases)


@pytest.mark.parametrize("native_kernels", [True, False], ids=["native", "torch"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(v) for v in c.values()))
def test_accelerated_equals_reference(case: dict, native_kernels: bool) -> None:
    if native_kernels and native.library() is None:
        pytest.skip(f"the native kernels are not built here: {native.build_error}")
    config = _config(case)
    torch.manual_seed(0)
    model = build_model(config)
    failed = [f"{r.compared}: {r.max_diff:.2e} > {r.tolerance:.0e}"
              for r in check_accelerated(model, native=native_kernels) if not r.passed]
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("native_kernels", [True, False], ids=["native", "torch"])
@pytest.mark.parametrize("arch", C.ARCHS)
def test_heads_of_another_width_equal_the_reference(arch: str, native_kernels: bool) -> None:
    """A config whose heads are not d_model / n_heads wide (4 heads of 12 in 32): every accelerated path equals the
    reference."""
    if native_kernels and native.library() is None:
        pytest.skip(f"the native kernels are not built here: {native.build_error}")
    config = _config(CASES[0] | {"arch": arch}).replace(head_dim=12)
    torch.manual_seed(0)
    model = build_model(config)
    stack = model.encoder if arch == "encoder" else model.decoder
    assert stack.layers[0].self_attn.out_proj.weight.shape == (32, 4 * 12)  # (D, H * Dh)
    failed = [f"{r.compared}: {r.max_diff:.2e} > {r.tolerance:.0e}"
              for r in check_accelerated(model, native=native_kernels) if not r.passed]
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("purpose", accel.PURPOSES)
@pytest.mark.parametrize("arch", C.ARCHS)
def test_the_accelerator_changes_kernels_at_seams_only(arch: str, purpose: str) -> None:
    """No module changes its class: the accelerated model holds the core's modules (linear layers may be packed ones,
    modules of their own), with kernels in the seams that ``accel.describe`` and ``print(model)`` name."""
    from torch import nn

    torch.manual_seed(0)
    reference = build_model(_config(CASES[0] | {"arch": arch}))
    model = build_model(_config(CASES[0] | {"arch": arch}))
    model.load_state_dict(reference.state_dict())
    classes = {name: type(m) for name, m in reference.named_modules()}
    accel.accelerate(model if purpose == "train" else model.eval(), purpose)
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear) and type(m).__module__.startswith("aiayn.accel."):
            continue  # a packed or int8 linear layer in place of nn.Linear
        assert type(m) is classes.get(name, type(m)), f"{name}: {type(classes[name]).__name__} -> {type(m).__name__}"
    used = accel.describe(model)
    assert used.get("MultiHeadAttention.attention_kernel=cpu_attention_kernel")
    assert "attention_kernel=cpu_attention_kernel" in repr(model)
    if arch != "encoder":
        assert used.get("LMHead.loss_kernel=fused_loss") == 1
