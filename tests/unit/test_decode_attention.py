"""Decoding-step attention (aiayn.accel.cpu.decode_attention): two matmuls equal torch's flash kernel, the kernel is
chosen by the shape alone (a setting pins it), and decodes agree."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from aiayn import ModelConfig, build_model
from aiayn.accel import accelerate
from aiayn.accel.cpu import decode_attention
from aiayn.accel.cpu.functional import cpu_attention_kernel
from aiayn.accel.cpu.settings import SETTINGS
from aiayn.generate import generate, translate
from aiayn.nn.attention import scaled_dot_product_attention


@pytest.fixture(autouse=True)
def _auto_choice(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(SETTINGS, "decode_attention", "auto")


def _time_major(b: int, h: int, s: int, d: int) -> torch.Tensor:
    """(B, H, S, Dh) keys viewed out of a (capacity, B, H, Dh) cache, as SelfAttnCache hands them out."""
    return torch.randn(s + 3, b, h, d)[:s].permute(1, 2, 0, 3)


@pytest.mark.parametrize("t", [1, 4])
def test_two_matmuls_equal_the_flash_kernel(t: int) -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(16, 4, t, 32), _time_major(16, 4, 20, 32), _time_major(16, 4, 20, 32)
    mask = torch.rand(16, 1, t, 20) > 0.3
    mask[:, :, :, 0] = True
    for m in (None, mask):
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3)
        torch.testing.assert_close(decode_attention.matmul_attention(q, k, v, m, 0.3), want, rtol=1e-5, atol=1e-6)


def test_rows_with_no_allowed_key_give_zeros_on_both_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(32, 4, 1, 16), torch.randn(32, 4, 9, 16), torch.randn(32, 4, 9, 16)
    mask = torch.ones(32, 1, 1, 9, dtype=torch.bool)
    mask[3] = False  # a row that may attend nowhere
    outs = {}
    for choice in ("flash", "matmul"):
        monkeypatch.setattr(SETTINGS, "decode_attention", choice)
        with torch.no_grad():
            outs[choice] = scaled_dot_product_attention(q, k, v, mask=mask, kernel=cpu_attention_kernel)[0]
    assert torch.equal(outs["matmul"][3], torch.zeros_like(outs["matmul"][3]))
    torch.testing.assert_close(outs["matmul"], outs["flash"], rtol=1e-5, atol=1e-6)


def test_the_choice_depends_on_the_shape_only(monkeypatch: pytest.MonkeyPatch) -> None:
    big = (torch.randn(32, 4, 1, 16), torch.randn(32, 4, 9, 16), torch.randn(32, 4, 9, 16))  # 128 blocks
    small = (torch.randn(4, 4, 1, 16), torch.randn(4, 4, 9, 16), torch.randn(4, 4, 9, 16))  # 16 blocks
    assert [decode_attention.chosen_kernel(*big, None, 0.25) for _ in range(3)] == ["matmul"] * 3
    assert decode_attention.chosen_kernel(*small, None, 0.25) == "flash"
    for choice in ("flash", "matmul"):
        monkeypatch.setattr(SETTINGS, "decode_attention", choice)
        assert decode_attention.chosen_kernel(*big, None, 0.25) == choice


def test_only_fp32_cpu_inference_steps_qualify() -> None:
    q, k = torch.randn(2, 4, 1, 8), torch.randn(2, 4, 5, 8)
    assert decode_attention.applies(q, k, 0.0, False)
    assert not decode_attention.applies(q, k, 0.1, False)  # dropout
    assert not decode_attention.applies(q, k, 0.0, True)  # causal flag
    assert not decode_attention.applies(torch.randn(2, 4, 9, 8), k, 0.0, False)  # a prompt, not a step
    assert not decode_attention.applies(q.bfloat16(), k.bfloat16(), 0.0, False)
    assert not decode_attention.applies(q.requires_grad_(), k, 0.0, False)  # training


def test_decodes_agree_between_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    s2s = accelerate(build_model(ModelConfig.preset("tiny", arch="encoder-decoder", vocab_size=300)).eval(), "decode")
    lm = accelerate(build_model(ModelConfig.preset("tiny", arch="decoder", vocab_size=300)).eval(), "decode")
    src = torch.randint(4, 300, (20, 9))
    src[:5, 6:] = 0  # padded sources: a cross-attention mask
    prompts = torch.randint(4, 300, (20, 5)).tolist()
    out = {}
    for choice in ("flash", "matmul"):
        monkeypatch.setattr(SETTINGS, "decode_attention", choice)
        beams = translate(s2s, src, beam_size=4, max_len_b=12)
        out[choice] = ([[h.tokens for h in s] for s in beams],
                       generate(lm, prompts, max_new_tokens=8, greedy=True))
    assert out["matmul"] == out["flash"]
