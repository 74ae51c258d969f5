"""The same weights give the same numbers on CUDA as on the CPU: logits and gradients of every architecture and
positional scheme in float32, and close logits under bfloat16/float16 autocast. Skipped without a GPU."""

from __future__ import annotations

import copy

import pytest
import torch

from aiayn import ModelConfig, build_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

VARIANTS = {
    "encoder-sinusoidal": dict(arch="encoder", position="sinusoidal"),
    "encoder-t5": dict(arch="encoder", position="t5", norm_position="pre", norm="rmsnorm"),
    "decoder-rope-gqa-swiglu": dict(arch="decoder", position="rope", n_kv_heads=2, activation="swiglu"),
    "decoder-alibi-window": dict(arch="decoder", position="alibi", sliding_window=3),
    "decoder-learned-mqa": dict(arch="decoder", position="learned", n_kv_heads=1, norm_position="pre"),
    "seq2seq-sinusoidal": dict(arch="encoder-decoder", position="sinusoidal"),
    "seq2seq-rope-gelu": dict(arch="encoder-decoder", position="rope", activation="gelu"),
}


def _inputs(arch: str) -> dict[str, torch.Tensor]:
    """A right-padded batch of 3 for the architecture's forward (one row shorter, one very short)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 64, (3, 10), generator=g)
    ids[1, 6:] = 0
    ids[2, 2:] = 0
    if arch == "encoder-decoder":
        return {"src": ids, "tgt": torch.randint(3, 64, (3, 7), generator=g)}
    if arch == "encoder":
        return {"ids": ids, "is_token": ids != 0}
    return {"ids": ids}


def _pair(variant: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    cpu = build_model(ModelConfig.preset("tiny", dropout=0.0, **VARIANTS[variant]))
    return cpu, copy.deepcopy(cpu).cuda()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_cuda_logits_and_gradients_equal_cpu(variant: str) -> None:
    cpu, gpu = _pair(variant)
    inputs = _inputs(VARIANTS[variant]["arch"])
    out_cpu = cpu(**inputs).logits
    out_gpu = gpu(**{k: v.cuda() for k, v in inputs.items()}).logits
    assert out_gpu.device.type == "cuda"
    torch.testing.assert_close(out_gpu.cpu(), out_cpu, atol=1e-4, rtol=1e-4)
    weights = torch.linspace(-1, 1, out_cpu.numel()).view_as(out_cpu)
    (out_cpu * weights).sum().backward()
    (out_gpu * weights.cuda()).sum().backward()
    for (name, p_cpu), p_gpu in zip(cpu.named_parameters(), gpu.parameters(), strict=True):
        if p_cpu.grad is None:
            assert p_gpu.grad is None, name
            continue
        torch.testing.assert_close(p_gpu.grad.cpu(), p_cpu.grad, atol=1e-4, rtol=1e-3, msg=name)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("variant", ["decoder-rope-gqa-swiglu", "seq2seq-sinusoidal"])
def test_cuda_autocast_logits_are_close_to_float32(variant: str, dtype: torch.dtype) -> None:
    _, gpu = _pair(variant)
    inputs = {k: v.cuda() for k, v in _inputs(VARIANTS[variant]["arch"]).items()}
    with torch.inference_mode():
        full = gpu(**inputs).logits
        with torch.autocast("cuda", dtype=dtype):
            low = gpu(**inputs).logits
    assert bool(torch.isfinite(low).all())
    tolerance = 0.1 if dtype == torch.bfloat16 else 0.02  # 8 vs 11 mantissa bits over a few layers
    torch.testing.assert_close(low.float(), full, atol=tolerance, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("variant", ["decoder-rope-gqa-swiglu", "seq2seq-sinusoidal"])
def test_cuda_inference_cast_is_close_to_float32_and_decodes(variant: str, dtype: torch.dtype) -> None:
    """``--dtype`` on CUDA: the whole model cast (no CPU layout), logits close to fp32, cached decoding runs."""
    from aiayn.generate import generate, translate
    from aiayn.nn.precision import cast_for_inference

    _, gpu = _pair(variant)
    low = cast_for_inference(copy.deepcopy(gpu), dtype)
    assert all(p.dtype == dtype and p.is_cuda for p in low.parameters())
    inputs = {k: v.cuda() for k, v in _inputs(VARIANTS[variant]["arch"]).items()}
    with torch.inference_mode():
        full, out = gpu.eval()(**inputs).logits, low(**inputs).logits
    assert out.dtype == dtype and bool(torch.isfinite(out).all())
    tolerance = 0.1 if dtype == torch.bfloat16 else 0.02
    torch.testing.assert_close(out.float(), full, atol=tolerance, rtol=0)
    if VARIANTS[variant]["arch"] == "decoder":
        assert [len(x) for x in generate(low, [[5, 6], [7]], max_new_tokens=6, greedy=True, stop_ids=())] == [6, 6]
    else:
        assert len(translate(low, inputs["src"], beam_size=3, max_len_b=4)) == 3
