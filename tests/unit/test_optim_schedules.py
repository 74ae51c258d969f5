"""Optimizer parameter groups and learning-rate schedules."""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch
from torch import nn

from aiayn.errors import AiaynError
from aiayn.train.optim import build_optimizer, param_groups
from aiayn.train.schedules import (
    SCHEDULES,
    build_scheduler,
    constant_warmup,
    inverse_sqrt_warmup,
    warmup_cosine,
)


class RMSNormLike(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(d))


class TiedLM(nn.Module):
    def __init__(self, vocab: int = 11, d: int = 6) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(5, d)
        self.proj = nn.Linear(d, d)
        self.ln = nn.LayerNorm(d)
        self.rms = RMSNormLike(d)
        self.ff = nn.Linear(d, d, bias=False)
        self.frozen = nn.Linear(d, d)
        self.frozen.requires_grad_(False)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied


def _ids(params: list) -> set[int]:
    return {id(p) for p in params}


def test_adamw_groups_exempt_norms_biases_embeddings_and_list_tied_once() -> None:
    m = TiedLM()
    groups = param_groups(m, weight_decay=0.1)
    decay, no_decay = groups[0]["params"], groups[1]["params"]
    assert groups[0]["weight_decay"] == 0.1 and groups[1]["weight_decay"] == 0.0
    assert _ids(decay) == {id(m.proj.weight), id(m.ff.weight)}
    assert _ids(no_decay) == {
        id(m.embed.weight),
        id(m.pos.weight),
        id(m.proj.bias),
        id(m.ln.weight),
        id(m.ln.bias),
        id(m.rms.scale),
    }
    all_params = decay + no_decay
    assert len(all_params) == len(_ids(all_params))  # the tied matrix appears once
    assert not _ids(all_params) & {id(m.frozen.weight), id(m.frozen.bias)}
    opt = build_optimizer(m, "adamw", lr=1e-3, weight_decay=0.1)
    assert isinstance(opt, torch.optim.AdamW)
    assert opt.defaults["betas"] == (0.9, 0.98) and opt.defaults["eps"] == 1e-9


def test_adam_paper_settings_and_errors() -> None:
    m = TiedLM()
    opt = build_optimizer(m, "adam", lr=1.0)
    assert type(opt) is torch.optim.Adam
    assert opt.defaults["betas"] == (0.9, 0.98) and opt.defaults["eps"] == 1e-9
    n_unique_trainable = len({id(p) for p in m.parameters() if p.requires_grad})
    assert sum(len(g["params"]) for g in opt.param_groups) == n_unique_trainable
    with pytest.raises(AiaynError, match="adam, adamw"):
        build_optimizer(m, "sgd", lr=1.0)
    with pytest.raises(AiaynError, match="adamw"):
        build_optimizer(m, "adam", lr=1.0, weight_decay=0.01)


def _paper(step: int, d_model: int, warmup: int) -> float:
    return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def test_inverse_sqrt_matches_paper_formula_and_peaks_at_warmup() -> None:
    s = inverse_sqrt_warmup(warmup=4000, d_model=512)
    for step in (1, 10, 1000, 3999, 4000, 4001, 10_000, 100_000):
        assert s.multiplier(step) == pytest.approx(_paper(step, 512, 4000), rel=1e-12)
    assert s.multiplier(4000) == pytest.approx((512 * 4000) ** -0.5)
    assert s.multiplier(4000) > s.multiplier(3999) and s.multiplier(4000) > s.multiplier(4001)
    assert s.multiplier(1) == pytest.approx(512**-0.5 * 4000**-1.5)
    normalized = inverse_sqrt_warmup(warmup=100, scale=2.0)
    assert normalized.multiplier(100) == pytest.approx(2.0)
    assert normalized.multiplier(400) == pytest.approx(1.0)


def test_scheduler_counts_steps_from_one() -> None:
    p = nn.Parameter(torch.zeros(2))
    opt = torch.optim.Adam([p], lr=1.0)
    sched = build_scheduler(opt, "inverse_sqrt_warmup", warmup=10, d_model=64)
    lrs = []
    for _ in range(12):
        lrs.append(opt.param_groups[0]["lr"])  # the lr the next optimizer.step() uses
        opt.step()
        sched.step()
    assert lrs == pytest.approx([_paper(k, 64, 10) for k in range(1, 13)], rel=1e-12)


def test_warmup_cosine_endpoints() -> None:
    s = warmup_cosine(warmup=10, total=110, min_ratio=0.1)
    assert s.multiplier(1) == pytest.approx(0.1)
    assert s.multiplier(5) == pytest.approx(0.5)
    assert s.multiplier(10) == pytest.approx(1.0)
    assert s.multiplier(60) == pytest.approx(0.1 + 0.9 * 0.5)  # half-way: cos(pi/2) = 0
    assert s.multiplier(110) == pytest.approx(0.1)
    assert s.multiplier(500) == pytest.approx(0.1)
    values = [s.multiplier(k) for k in range(10, 111)]
    assert all(a >= b for a, b in zip(values, values[1:]))
    no_warm = warmup_cosine(warmup=0, total=4)
    assert no_warm.multiplier(0) == pytest.approx(1.0)
    assert no_warm.multiplier(2) == pytest.approx(0.5)
    assert no_warm.multiplier(4) == pytest.approx(0.0, abs=1e-12)


def test_constant_warmup() -> None:
    s = constant_warmup(warmup=4)
    assert [s.multiplier(k) for k in (1, 2, 4, 5, 1000)] == pytest.approx([0.25, 0.5, 1, 1, 1])
    assert constant_warmup(0).multiplier(1) == 1.0


@pytest.mark.parametrize(
    "name,kw",
    [
        ("inverse_sqrt_warmup", {"warmup": 5, "d_model": 32}),
        ("warmup_cosine", {"warmup": 3, "total": 20, "min_ratio": 0.05}),
        ("constant_warmup", {"warmup": 7}),
    ],
)
def test_scheduler_resumes_exactly_through_safe_load(name: str, kw: dict) -> None:
    def make() -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
        p = nn.Parameter(torch.zeros(3))
        opt = torch.optim.AdamW([p], lr=0.5)
        return opt, build_scheduler(opt, name, **kw)

    opt, sched = make()
    for _ in range(6):
        opt.step()
        sched.step()
    buf = io.BytesIO()
    torch.save({"opt": opt.state_dict(), "sched": sched.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    expected = []
    for _ in range(15):
        opt.step()
        sched.step()
        expected.append(opt.param_groups[0]["lr"])

    opt2, sched2 = make()
    opt2.load_state_dict(saved["opt"])
    sched2.load_state_dict(saved["sched"])
    got = []
    for _ in range(15):
        opt2.step()
        sched2.step()
        got.append(opt2.param_groups[0]["lr"])
    assert got == expected
    assert all(math.isfinite(v) for v in got)


def test_build_scheduler_errors_list_valid_names_and_params() -> None:
    opt = torch.optim.Adam([nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(AiaynError) as e:
        build_scheduler(opt, "noam_typo")
    for valid in SCHEDULES:
        assert valid in str(e.value)
    with pytest.raises(AiaynError, match="unknown parameter.*warmupp"):
        build_scheduler(opt, "constant_warmup", warmupp=3)
    with pytest.raises(AiaynError, match="missing parameter.*total"):
        build_scheduler(opt, "warmup_cosine", warmup=3)
    with pytest.raises(AiaynError, match="warmup < total"):
        build_scheduler(opt, "warmup_cosine", warmup=3, total=3)
    with pytest.raises(AiaynError, match="warmup must be >= 1"):
        inverse_sqrt_warmup(warmup=0)


def test_fused_adam_is_the_default_on_cpu_and_matches_the_loop():
    """The default fused update gives the same parameters as the per-tensor loop."""
    torch.manual_seed(0)
    a = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 3))
    b = copy.deepcopy(a)
    opt_a = build_optimizer(a, "adamw", lr=1e-2, weight_decay=0.1)
    opt_b = build_optimizer(b, "adamw", lr=1e-2, weight_decay=0.1, fused=False)
    assert opt_a.defaults["fused"] is True and not opt_b.defaults["fused"]
    x = torch.randn(5, 4)
    for _ in range(3):
        for m, o in ((a, opt_a), (b, opt_b)):
            o.zero_grad()
            m(x).square().sum().backward()
            o.step()
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6)
