"""Exact greedy argmax through an fp16 screen of the output layer (aiayn.accel.cpu.screened_argmax)."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import aiayn.accel.cpu.screened_argmax as SA
from aiayn import build_model
from aiayn.accel import accelerate
from aiayn.accel.cpu.packed import onednn_bf16_available
from aiayn.accel.cpu.settings import SETTINGS
from aiayn.config import ModelConfig
from aiayn.generate import generate
from aiayn.generate.common import next_scores


def reference_argmax(h: torch.Tensor, weight: torch.Tensor, banned: list[int] = ()) -> torch.Tensor:
    """The fp32 logits' argmax, banned ids excluded: what greedy search took before the screen."""
    return next_scores(F.linear(h, weight), banned).argmax(dim=1)


INT8_REASON = "int8 screens need torch's AVX-512 int8 kernel or aiayn's native kernels"
SCREEN_DTYPES = [torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    not onednn_bf16_available(), reason="bf16 screens need native bf16 matmuls in oneDNN (AVX512-BF16 / AMX)")),
    pytest.param(torch.int8, marks=pytest.mark.skipif(
        not SA.int8_screen_available(), reason=INT8_REASON))]


@pytest.mark.parametrize("dtype", SCREEN_DTYPES)
@pytest.mark.parametrize("scale", [1e-6, 1e-3, 0.02, 1.0, 100.0])
@pytest.mark.parametrize("same_sign", [False, True])
def test_screened_logits_stay_within_the_bound(scale: float, same_sign: bool, dtype: torch.dtype) -> None:
    # same-sign inputs make the fp32 sum's rounding largest; tiny scales put fp16 values among the subnormals
    g = torch.Generator().manual_seed(0)
    d = (512 if dtype == torch.int8 else 4096) if same_sign else 384  # int8 screens take at most 512 columns
    w = torch.randn(512, d, generator=g, dtype=torch.float64) * scale
    h = torch.randn(4, d, generator=g, dtype=torch.float64) * 7
    if same_sign:
        w, h = w.abs(), h.abs()
    screen = SA.make_screen(w.float(), dtype)
    assert screen is not None and screen.dtype == dtype
    s = SA.screened_logits(h.float(), screen)
    int8_out = torch.bfloat16 if SA.int8_screen_kernel() == "torch" else torch.float32
    assert s.dtype == (int8_out if dtype == torch.int8 else dtype) and s.shape == (4, 512)
    exact = F.linear(h, w) / torch.linalg.vector_norm(h, dim=1, keepdim=True)
    err = (s.double() - exact).abs().max().item()
    assert err <= screen.bound
    assert err > screen.bound / 100  # the bound is not vacuous


@pytest.mark.parametrize(("v", "block"), [(50, 128), (50, 16), (128, 128), (300, 128), (5000, 128)])
def test_candidates_are_every_entry_near_the_row_maximum(v: int, block: int) -> None:
    g = torch.Generator().manual_seed(v)
    s = torch.randn(6, v, generator=g).to(torch.bfloat16)
    s[2, 7] = float("nan")  # a NaN row has no candidate
    s[4, :] = 1.0  # every entry ties
    rows, cols = SA.candidates(s, 0.25, block=block)  # (50, 128): no whole block, the tail alone
    got = sorted(zip(rows.tolist(), cols.tolist()))
    x = s.float()
    expected = (x >= x.amax(dim=1, keepdim=True) - 0.25).nonzero().tolist()
    assert got == [tuple(p) for p in expected] and 2 not in rows.tolist()
    assert sum(r == 4 for r in rows.tolist()) == v


@pytest.mark.parametrize("dtype", SCREEN_DTYPES)
def test_screen_matches_fp32_argmax_with_bans_and_ties(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    v, d = 3000, 256
    w = torch.randn(v, d, generator=g) * 0.05
    w[2000] = w[700]  # an exact tie: the lower id must win, as with Tensor.argmax
    h = torch.randn(64, d, generator=g)
    h[5] = w[700] * 40  # row 5's best tokens are 700 and 2000 (equal logits)
    h[6] = w[17] * 40  # row 6's best token is banned
    screen = SA.make_screen(w, dtype)
    banned = [0, 17]
    got = SA.screened_argmax(h, w, screen, torch.tensor(banned))
    assert got is not None
    assert torch.equal(got, reference_argmax(h, w, banned))
    assert got[5] == 700 and got[6] != 17


@pytest.mark.skipif(not SA.int8_screen_available(), reason=INT8_REASON)
def test_int8_screen_rows_are_within_the_measured_error() -> None:
    g = torch.Generator().manual_seed(2)
    w = torch.randn(300, 64, generator=g) * 0.1
    w[7] = 0.0  # an all-zero row: scale 1, nothing to round
    w[8, 3] = 1e-38  # a tiny one
    screen = SA.make_screen(w, torch.int8)
    q = screen.weight.double() * screen.scales.double()[:, None]
    assert (q - w.double()).abs().max() <= screen.scales.double().max() / 2
    assert screen.weight.abs().max() <= 127 and q[7].abs().max() == 0
    assert SA.make_screen(torch.full((4, 16), float("inf")), torch.int8) is None


def test_unsettled_rows_ask_for_the_full_logits() -> None:
    w = torch.randn(1000, 64) * 0.05
    screen = SA.make_screen(w)
    h = torch.randn(2, 64)
    h[1, 3] = float("nan")
    assert SA.screened_argmax(h, w, screen) is None  # no candidate in row 1
    flat = torch.zeros(1000, 64)
    flat[:, 0] = 1.0  # every logit equal: 1000 candidates
    assert SA.screened_argmax(torch.randn(1, 64), flat, SA.make_screen(flat)) is None
    assert SA.make_screen(torch.full((4, 8), 1e5)) is None  # logits beyond fp16's range


def _count_screens(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = SA.screened_argmax

    def counted(h, *args, **kwargs):
        calls.append(h.shape[0])
        return real(h, *args, **kwargs)

    monkeypatch.setattr(SA, "screened_argmax", counted)
    return calls


def _screen_everything(monkeypatch: pytest.MonkeyPatch, int8: bool = False) -> None:
    """Screen layers of any size; one row in int8 (where it runs) only if ``int8``, else as on a CPU without an int8
    kernel (fp16 at one and two rows)."""
    monkeypatch.setattr(SA, "MIN_FP16_SCREENED_WEIGHTS", {1: 1000, 2: 1000})
    monkeypatch.setattr(SA, "MIN_BF16_SCREENED_WEIGHTS", 1000)
    monkeypatch.setattr(SA, "MIN_INT8_SCREENED_WEIGHTS", 1000)
    monkeypatch.setattr(SA, "MIN_NATIVE_INT8_SCREENED_WEIGHTS", 1000)
    if not int8:
        monkeypatch.setattr(SA, "int8_screen_kernel", lambda: None)


@pytest.mark.parametrize("kernel", [None, "torch", "native"])
@pytest.mark.parametrize("bf16", [False, True])
def test_which_screen_by_rows_size_width_and_int8_kernel(kernel: str | None, bf16: bool,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SA, "int8_screen_kernel", lambda: kernel)
    monkeypatch.setattr(SA, "onednn_bf16_available", lambda: bf16)
    fp16_min, int8_min = SA.MIN_FP16_SCREENED_WEIGHTS[1], SA.MIN_INT8_SCREENED_WEIGHTS
    native_min = SA.MIN_NATIVE_INT8_SCREENED_WEIGHTS
    if kernel == "native":  # only int8 at one row pays, at any width up to INT8_MAX_WIDTH
        assert SA.screen_dtype(1, native_min, 392) == SA.screen_dtype(1, native_min) == torch.int8
        assert SA.screen_dtype(1, native_min - 1, 384) is None
        assert SA.screen_dtype(1, native_min, SA.INT8_MAX_WIDTH + 16) is None
        assert SA.screen_dtype(2, 1 << 30, 384) is None and SA.screen_dtype(16, 1 << 30, 384) is None
        return
    int8 = kernel == "torch"
    assert SA.screen_dtype(1, max(int8_min, fp16_min), 384) == (torch.int8 if int8 else torch.float16)
    assert SA.screen_dtype(1, fp16_min, 392) == torch.float16  # torch's kernel: multiples of 16 columns
    assert SA.screen_dtype(1, fp16_min, SA.INT8_MAX_WIDTH + 16) == torch.float16
    assert SA.screen_dtype(1, min(fp16_min, int8_min) - 1, 384) is None
    two = SA.MIN_BF16_SCREENED_WEIGHTS if bf16 else SA.MIN_FP16_SCREENED_WEIGHTS[2]
    assert SA.screen_dtype(2, two, 384) == (torch.bfloat16 if bf16 else torch.float16)
    assert SA.screen_dtype(16, 1 << 30, 384) == (torch.bfloat16 if bf16 else None)


def test_greedy_head_screens_only_where_it_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_screens(monkeypatch)
    _screen_everything(monkeypatch)
    bf16 = onednn_bf16_available()
    assert SA.screen_dtype(1, 1000) == torch.float16 and SA.screen_dtype(1, 999) is None
    assert SA.screen_dtype(2, 1000) == (torch.bfloat16 if bf16 else torch.float16)
    assert SA.screen_dtype(16, 1000) == (torch.bfloat16 if bf16 else None)
    proj = nn.Linear(32, 500, bias=False)
    head = SA.GreedyHead(proj, banned_ids=[3])
    with torch.inference_mode():
        for rows in (1, 2, 16):
            h = torch.randn(rows, 32)
            assert torch.equal(head(h), reference_argmax(h, proj.weight, [3]))
    assert calls == ([1, 2, 16] if bf16 else [1, 2])  # 16 rows without native bf16: the full logits
    screened = list(calls)
    with_bias = nn.Linear(32, 500)
    with torch.inference_mode():
        h = torch.randn(1, 32)
        assert torch.equal(SA.GreedyHead(with_bias)(h), (with_bias(h)).argmax(dim=1))
        monkeypatch.setattr(SETTINGS, "screened_argmax", False)
        SA.GreedyHead(proj)(h)
    assert calls == screened
    half = nn.Linear(32, 500, bias=False).to(torch.bfloat16)  # a bf16 model's states reach the head in fp32
    with torch.inference_mode():
        h = torch.randn(2, 32).to(torch.bfloat16)
        assert torch.equal(SA.GreedyHead(half)(h.float()), next_scores(half(h)).argmax(dim=1))
    assert calls == screened


def test_the_screen_follows_the_weight(monkeypatch: pytest.MonkeyPatch) -> None:
    _screen_everything(monkeypatch)
    proj = nn.Linear(32, 500, bias=False)
    head = SA.GreedyHead(proj)
    h = torch.randn(1, 32)
    opt = torch.optim.Adam(proj.parameters(), lr=1.0, fused=True)  # moves no version counter
    for _ in range(3):
        with torch.inference_mode():
            assert torch.equal(head(h), reference_argmax(h, proj.weight))
        proj(torch.randn(8, 32)).square().mean().backward()
        opt.step()
    with torch.no_grad():
        proj.weight.neg_()
    with torch.inference_mode():
        assert torch.equal(head(h), reference_argmax(h, proj.weight))
    entries = len(SA._screens._entries)
    del head, proj, opt
    gc.collect()
    assert len(SA._screens._entries) == entries - 1  # freed with its weight


@pytest.mark.parametrize(("batch", "int8"), [(1, False), (1, True), (2, False), (5, False)])
def test_screened_generation_equals_fp32_generation(batch: int, int8: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if batch > 2 and not onednn_bf16_available():
        pytest.skip("more than two rows are screened only with native bf16 matmuls")
    if int8 and not SA.int8_screen_available():
        pytest.skip(INT8_REASON)
    calls = _count_screens(monkeypatch)
    _screen_everything(monkeypatch, int8=int8)
    cfg = ModelConfig.preset("gpt2-small", n_layers=2, d_model=64, n_heads=2, d_ff=128, vocab_size=3000,
                             max_len=128, dropout=0.0)
    torch.manual_seed(0)
    reference = build_model(cfg).eval()
    model = accelerate(build_model(cfg).eval(), "decode", accel="auto")
    model.load_state_dict(reference.state_dict())
    prompts = [[5, 9, 200, 41, 7][: 5 - i] for i in range(batch)]
    screened = generate(model, prompts, max_new_tokens=40, greedy=True, stop_ids=(), pad_id=0)
    assert calls and set(calls) == {batch}
    assert any(dtype == torch.int8 for _, dtype in SA._screens._entries) or not int8
    monkeypatch.setattr(SETTINGS, "screened_argmax", False)
    assert screened == generate(model, prompts, max_new_tokens=40, greedy=True, stop_ids=(), pad_id=0)
    assert len(calls) == 40  # one choice per new token, none after the switch went off
    assert screened == generate(reference, prompts, max_new_tokens=40, greedy=True, stop_ids=(), pad_id=0)
    assert len(calls) == 40  # the reference model's head never screens


def test_a_head_stops_screening_after_failed_screens(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_screens(monkeypatch)
    _screen_everything(monkeypatch)
    proj = nn.Linear(16, 400, bias=False)
    with torch.no_grad():
        proj.weight[:] = proj.weight[0].clone()  # every logit the same: 400 candidates, no screen settles
    head = SA.GreedyHead(proj)
    with torch.inference_mode():
        for _ in range(SA.GreedyHead.MAX_FAILED_SCREENS + 3):
            h = torch.randn(1, 16)
            assert torch.equal(head(h), reference_argmax(h, proj.weight))
    assert len(calls) == SA.GreedyHead.MAX_FAILED_SCREENS
