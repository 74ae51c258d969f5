"""Opt-in int8 inference: close to fp32 for every family, the fp32 model untouched, decoding works, CPU only."""

from __future__ import annotations

import copy
import io
import os

import pytest
import torch
from torch import nn

from aiayn import AiaynError, ModelConfig, build_model
from aiayn.accel.cpu import native, quantize
from aiayn.accel.cpu.quantize import Int8Linear, _DynamicLinear, quantize_int8
from aiayn.accel.cpu.settings import SETTINGS
from aiayn.generate import generate, translate


def _model(arch: str, **kw: object) -> nn.Module:
    torch.manual_seed(0)
    return build_model(ModelConfig.preset("tiny", arch=arch, vocab_size=50, **kw)).eval()


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("arch", ["encoder-decoder", "decoder", "encoder"])
def test_int8_outputs_are_close_to_fp32_and_every_linear_is_quantized(arch: str) -> None:
    model = _model(arch, n_classes=3) if arch == "encoder" else _model(arch)
    q = quantize_int8(model)
    ids = torch.randint(3, 50, (3, 9))
    with torch.no_grad():
        if arch == "encoder-decoder":
            ref, out = model(ids, ids[:, :6]).logits, q(ids, ids[:, :6]).logits
        else:
            ref, out = model(ids).logits, q(ids).logits
    assert out.shape == ref.shape
    assert _relative_error(out, ref) < 0.05
    assert not any(type(m) is nn.Linear for m in q.modules())  # the output layer too, tied or not
    assert not any(m.training for m in q.modules())  # the copy in eval mode, its int8 layers too
    assert all(type(m) is not nn.Linear or m.weight.dtype == torch.float32 for m in model.modules())


def test_the_fp32_model_is_left_untouched() -> None:
    model = _model("decoder")
    ids = torch.randint(3, 50, (2, 7))
    types = [type(m) for m in model.modules()]
    with torch.no_grad():
        before = model(ids).logits
        quantize_int8(model)
        after = model(ids).logits
    assert torch.equal(before, after)
    assert [type(m) for m in model.modules()] == types  # no layer swapped for a quantized one
    assert sum(isinstance(m, nn.Linear) for m in model.modules()) > 0


def test_int8_decoding_runs_and_mostly_agrees_with_fp32(decisive_decoders: tuple[nn.Module, nn.Module]) -> None:
    """Greedy LM generation and beam translation through the KV cache work on the int8 copy."""
    lm, s2s = decisive_decoders
    prompts = [[5, 6, 7], [9, 3]]
    ref = generate(lm, prompts, max_new_tokens=12, greedy=True, stop_ids=())
    out = generate(quantize_int8(lm), prompts, max_new_tokens=12, greedy=True, stop_ids=())
    assert [len(x) for x in out] == [len(x) for x in ref]
    agree = sum(a == b for r, o in zip(ref, out, strict=True) for a, b in zip(r, o, strict=True))
    assert agree >= 0.5 * sum(len(r) for r in ref)

    src = torch.randint(3, 50, (3, 6))
    ref = translate(s2s, src, beam_size=3, max_len_b=5)
    out = translate(quantize_int8(s2s), src, beam_size=3, max_len_b=5)
    assert all(r[0].tokens for r in ref)
    for r, o in zip(ref, out, strict=True):
        assert o[0].tokens == r[0].tokens and o[0].score == pytest.approx(r[0].score, rel=0.05)


def test_int8_off_the_cpu_is_a_clear_error() -> None:
    with torch.device("meta"):
        model = build_model(ModelConfig.preset("tiny", arch="decoder", vocab_size=50))
    with pytest.raises(AiaynError, match="CPU only"):
        quantize_int8(model)


def _int8_layer() -> Int8Linear:
    torch.manual_seed(0)
    layer = quantize_int8(nn.Sequential(nn.Linear(96, 40)))[0]
    assert type(layer) is Int8Linear
    return layer


@pytest.mark.skipif(native.library() is None, reason="the native kernels are not built here")
def test_a_steps_few_rows_take_the_weight_only_kernel_and_more_rows_torchs(monkeypatch) -> None:
    """Up to native.MAX_LINEAR_ROWS fp32 rows: the int8 weight times the unrounded rows (so each row's result is
    its own, alone or beside others); more rows, or the native kernels off: torch's dynamic int8 kernel as before."""
    monkeypatch.setattr(quantize, "int8_dot_product", lambda: False)
    layer, g = _int8_layer(), torch.Generator().manual_seed(1)
    w, b = layer.weight().dequantize(), layer.bias()
    with torch.no_grad():
        x = torch.randn(native.MAX_LINEAR_ROWS, 96, generator=g)
        got = layer(x)
        torch.testing.assert_close(got, nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-5)
        assert torch.equal(layer(x[1:2]), got[1:2])  # a row alone == the same row among others
        assert not torch.equal(_DynamicLinear.forward(layer, x)[1:2], _DynamicLinear.forward(layer, x[1:2]))
        many = torch.randn(native.MAX_LINEAR_ROWS + 1, 96, generator=g)
        assert torch.equal(layer(many), _DynamicLinear.forward(layer, many))
        monkeypatch.setattr(SETTINGS, "native", False)
        assert torch.equal(layer(x), _DynamicLinear.forward(layer, x))


@pytest.mark.skipif(native.library() is None, reason="the native kernels are not built here")
def test_on_a_cpu_with_int8_dot_products_large_weights_take_torchs_kernel(monkeypatch) -> None:
    """A step's few rows times a weight of DOT_PRODUCT_MIN_WEIGHT bytes or more: torch's int8 x int8 kernel; a
    smaller weight keeps the weight-only kernel (rows independent)."""
    monkeypatch.setattr(quantize, "int8_dot_product", lambda: True)
    monkeypatch.setattr(quantize, "DOT_PRODUCT_MIN_WEIGHT", 96 * 40)
    layer, x = _int8_layer(), torch.randn(2, 96)
    with torch.no_grad():
        assert torch.equal(layer(x), _DynamicLinear.forward(layer, x))
        assert torch.equal(layer(x, "relu"), torch.relu(_DynamicLinear.forward(layer, x)))
        monkeypatch.setattr(quantize, "DOT_PRODUCT_MIN_WEIGHT", 96 * 40 + 1)
        assert torch.equal(layer(x[1:2]), layer(x)[1:2])
        assert not torch.equal(layer(x), _DynamicLinear.forward(layer, x))


def test_int8_dot_products_are_read_from_the_cpus_flags() -> None:
    if not os.path.exists("/proc/cpuinfo"):
        pytest.skip("no /proc/cpuinfo here")
    flags = next((ln.split() for ln in open("/proc/cpuinfo") if ln.startswith("flags")), None)
    if flags is None:
        pytest.skip("no CPU flags in /proc/cpuinfo here")
    assert quantize.int8_dot_product() == ("avx512_vnni" in flags)


@pytest.mark.skipif(native.library() is None, reason="the native kernels are not built here")
def test_the_few_row_path_follows_a_replaced_weight_and_survives_copies(monkeypatch) -> None:
    monkeypatch.setattr(quantize, "int8_dot_product", lambda: False)
    layer, x = _int8_layer(), torch.randn(2, 96)
    with torch.no_grad():
        layer(x)  # the int8 rows read and kept
        new_w = torch.quantize_per_tensor(torch.randn(40, 96) / 10, 0.002, 0, torch.qint8)
        layer.set_weight_bias(new_w, None)
        torch.testing.assert_close(layer(x), nn.functional.linear(x, new_w.dequantize()), rtol=1e-5, atol=1e-5)
        twin = copy.deepcopy(layer)
        assert type(twin) is Int8Linear and torch.equal(twin(x), layer(x))
        buf = io.BytesIO()
        torch.save(nn.Sequential(layer), buf)  # a whole int8 model saved after it decoded
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)[0]
        assert type(loaded) is Int8Linear and torch.equal(loaded(x), layer(x))
