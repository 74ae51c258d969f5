"""The fp32 CPU matmul policy (aiayn.accel.cpu.gemm): oneDNN where it beats torch's BLAS, torch's everywhere else.

Every oneDNN path must equal torch's up to float rounding: linear layers forward and backward, the fused projection +
loss, whole models in training and inference (packed by size), decoding, int8 quantization of such a model. The
tests force each backend, so they hold on any host.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from aiayn import ModelConfig, build_model
from aiayn.accel import accelerate, describe
from aiayn.accel.cpu import gemm as cpu_gemm
from aiayn.accel.cpu import native
from aiayn.accel.cpu.fused_loss import linear_label_smoothed_nll
from aiayn.accel.cpu.gemm import (
    fp32_backend,
    fp32_inference_backend,
    linear,
    mm_nt,
    native_forward_applies,
    onednn_available,
    use_fp32_backend,
    weight_gradient,
)
from aiayn.accel.cpu.packed import MIN_ONEDNN_MACS, MIN_ONEDNN_MACS_FEW_ROWS, PackedLinear, frozen_weights
from aiayn.accel.cpu.quantize import quantize_int8
from aiayn.accel.cpu.settings import SETTINGS
from aiayn.generate import generate, translate
from aiayn.models.losses import label_smoothed_nll

needs_onednn = pytest.mark.skipif(not onednn_available(), reason="this PyTorch build has no oneDNN")


def _auto(monkeypatch: pytest.MonkeyPatch, vendor: str, capability: str) -> tuple[str, str]:
    """(training backend, inference backend) chosen automatically on such a CPU."""
    caches = (cpu_gemm._auto_backend, cpu_gemm._auto_inference_backend)
    for cache in caches:
        cache.cache_clear()
    monkeypatch.setattr(cpu_gemm, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(SETTINGS, "fp32_gemm", "auto")
    try:
        return fp32_backend(), fp32_inference_backend()
    finally:
        for cache in caches:
            cache.cache_clear()


@needs_onednn
def test_auto_trains_through_onednn_only_for_mkl_on_amd_with_avx512_and_decodes_through_it_on_amd(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: True)
    assert _auto(monkeypatch, "AuthenticAMD", "AVX512") == ("onednn", "onednn")
    # Zen 2/3: MKL's AVX2 path trains fastest, but streams a decoding step's weights slowly
    assert _auto(monkeypatch, "AuthenticAMD", "AVX2") == ("torch", "onednn")
    assert _auto(monkeypatch, "HygonGenuine", "AVX2") == ("torch", "onednn")
    assert _auto(monkeypatch, "GenuineIntel", "AVX512") == ("torch", "torch")
    assert _auto(monkeypatch, "", "AVX512") == ("torch", "torch")
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: False)  # another BLAS: leave training alone
    assert _auto(monkeypatch, "AuthenticAMD", "AVX512") == ("torch", "onednn")


def test_the_environment_and_the_context_override_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SETTINGS, "fp32_gemm", "torch")
    assert fp32_backend() == "torch"
    monkeypatch.setattr(SETTINGS, "fp32_gemm", "onednn")
    assert fp32_backend() == ("onednn" if onednn_available() else "torch")
    assert fp32_inference_backend() == fp32_backend()  # the override sets both
    with use_fp32_backend("torch"):
        assert fp32_backend() == fp32_inference_backend() == "torch"
    monkeypatch.setattr(SETTINGS, "fp32_gemm", "blas")
    with pytest.raises(ValueError, match="fp32_gemm='blas': choose one of auto, onednn, torch"):
        fp32_backend()
    with pytest.raises(ValueError, match="fp32_gemm='blas'"):
        fp32_inference_backend()
    with pytest.raises(ValueError, match="choose one of"):
        with use_fp32_backend("mkl"):
            pass


@needs_onednn
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("x_grad", [True, False])
def test_onednn_linear_equals_f_linear_forward_and_backward(bias: bool, x_grad: bool) -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 7, 48, requires_grad=x_grad)
    w = torch.randn(40, 48, requires_grad=True)
    b = torch.randn(40, requires_grad=True) if bias else None
    grad_out = torch.randn(3, 7, 40)
    results = []
    for backend in ("onednn", "torch"):
        with use_fp32_backend(backend):
            y = linear(x, w, b)
        grads = torch.autograd.grad(y, [t for t in (x, w, b) if t is not None and t.requires_grad], grad_out)
        results.append((y, *grads))
    assert results[0][0].grad_fn.name().startswith("OneDNNLinear")  # the oneDNN path really ran
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["onednn", "torch"])
@pytest.mark.parametrize("out_features,in_features", [(40, 48), (48, 40), (0, 8)])
def test_weight_gradient_equals_g_transposed_times_x_and_adds_in_place(backend: str, out_features: int,
                                                                       in_features: int) -> None:
    torch.manual_seed(0)
    g, x = torch.randn(21, out_features), torch.randn(21, in_features)  # (M, out), (M, in)
    want = g.T @ x
    with use_fp32_backend(backend):
        torch.testing.assert_close(weight_gradient(g, x), want, rtol=1e-5, atol=1e-5)
        total = torch.ones(out_features, in_features)
        assert weight_gradient(g, x, total) is total  # added in place
        torch.testing.assert_close(total, want + 1, rtol=1e-5, atol=1e-5)
        assert weight_gradient(g[:0], x[:0]).count_nonzero() == 0  # no rows: zeros


@needs_onednn
def test_other_dtypes_autocast_and_empty_inputs_take_torchs_path() -> None:
    w = torch.randn(8, 16, dtype=torch.float64, requires_grad=True)
    x = torch.randn(4, 16, dtype=torch.float64)
    with use_fp32_backend("onednn"):
        assert linear(x, w).grad_fn.name() != "OneDNNLinearBackward"
        torch.testing.assert_close(linear(x, w), F.linear(x, w))
        w32 = w.detach().float().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert linear(x.float(), w32).dtype == torch.bfloat16  # autocast's own cast, as for F.linear
        assert linear(torch.randn(0, 16), w32).shape == (0, 8)
        out = torch.empty(4, 8)
        assert mm_nt(x.float(), w32.detach(), out=out) is out
        torch.testing.assert_close(out, x.float() @ w32.detach().T, rtol=1e-5, atol=1e-5)


def _config(arch: str) -> ModelConfig:
    kw = {"n_classes": 3} if arch == "encoder" else {}
    return ModelConfig.preset("tiny", arch=arch, vocab_size=300, d_model=64, d_ff=256, **kw)


def _build(arch: str, backend: str, purpose: str | None = None) -> nn.Module:
    """The reference model (``purpose`` None) or the CPU-accelerated one for "train" or "decode" (in eval mode), its
    layers chosen under ``backend``; the same weights whichever."""
    torch.manual_seed(0)
    with use_fp32_backend(backend):
        model = build_model(_config(arch))
        if purpose is None:
            return model
        return accelerate(model.eval() if purpose == "decode" else model, purpose, accel="auto")


@needs_onednn
@pytest.mark.parametrize("arch", ["encoder-decoder", "decoder", "encoder"])
def test_training_acceleration_uses_onednn_linears_only_where_it_is_the_backend(arch: str) -> None:
    fast, plain, reference = _build(arch, "onednn", "train"), _build(arch, "torch", "train"), _build(arch, "torch")
    linears = [m for m in fast.modules() if isinstance(m, nn.Linear)]
    assert linears and all(type(m) is PackedLinear for m in linears)
    assert not any(type(m) is PackedLinear for m in plain.modules())
    assert not describe(reference)  # the core alone builds plain layers
    for other in (plain, reference):
        assert fast.state_dict().keys() == other.state_dict().keys()
        assert all(torch.equal(a, b) for a, b in zip(fast.state_dict().values(), other.state_dict().values()))
    if arch != "encoder":  # the output layer stays tied to the embedding table
        embed = fast.tgt_embed if arch == "encoder-decoder" else fast.embed
        assert fast.lm_head.proj.weight is embed.weight


@needs_onednn
@pytest.mark.parametrize("arch", ["encoder-decoder", "decoder"])
def test_training_steps_match_between_backends(arch: str) -> None:
    """Three SGD steps of the fused-loss training path: same losses and weights up to rounding. (Not Adam: it
    divides by the gradient's size, so on the key bias, whose true gradient is zero, it amplifies rounding to
    +-lr.)"""
    ids = torch.randint(3, 300, (4, 12))
    losses, params = {}, {}
    for backend in ("onednn", "torch"):
        model = _build(arch, backend, "train").train()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses[backend] = []
        with use_fp32_backend(backend):
            for step in range(3):
                torch.manual_seed(10 + step)  # the same dropout masks
                hidden = (model(ids, ids[:, :-1], compute_logits=False) if arch == "encoder-decoder"
                          else model(ids[:, :-1], compute_logits=False)).hidden
                loss = linear_label_smoothed_nll(hidden, model.lm_head.proj.weight, ids[:, 1:], 0.1)[0]
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses[backend].append(loss.item())
        params[backend] = [p.detach() for p in model.parameters()]
    assert losses["onednn"] == pytest.approx(losses["torch"], rel=1e-5)
    for a, b in zip(params["onednn"], params["torch"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@needs_onednn
def test_inference_packs_by_size_and_matches_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "panel_linear_preferred", lambda: False)  # oneDNN's products, as with AVX-512
    plain = _build("decoder", "torch").eval()
    with use_fp32_backend("onednn"):
        fast = accelerate(copy.deepcopy(plain), "decode", accel="auto")
        ffn_in = fast.decoder.layers[0].ffn.w_in
        assert type(ffn_in) is PackedLinear
        for ids in (torch.randint(3, 300, (1, 1)), torch.randint(3, 300, (4, 40))):
            with torch.inference_mode():
                torch.testing.assert_close(fast(ids).logits, plain(ids).logits, rtol=1e-5, atol=1e-5)
            if ids.numel() == 1:
                assert ffn_in._packed is None  # one row x 64 x 256: below MIN_ONEDNN_MACS, F.linear
    # 160 rows x 64 x 256 multiply-adds reach MIN_ONEDNN_MACS, one row does not
    assert 160 * 64 * 256 >= MIN_ONEDNN_MACS > 64 * 256
    assert ffn_in._packed is not None


@needs_onednn
def test_decoding_and_int8_agree_between_backends() -> None:
    s2s_plain = _build("encoder-decoder", "torch").eval()
    lm_plain = _build("decoder", "torch").eval()
    src = torch.randint(4, 300, (3, 9))
    prompts = [[5, 6, 7], [8, 9]]
    with use_fp32_backend("onednn"):
        s2s = _build("encoder-decoder", "onednn", "decode")
        lm = _build("decoder", "onednn", "decode")
        assert type(lm.decoder.layers[0].ffn.w_in) is PackedLinear
        beams = translate(s2s, src, beam_size=4, max_len_b=10)
        tokens = generate(lm, prompts, max_new_tokens=8, greedy=True)
        int8 = quantize_int8(lm)
        assert not any(type(m) is PackedLinear for m in int8.modules())
        assert len(generate(int8, prompts, max_new_tokens=4, greedy=True)) == 2
    with use_fp32_backend("torch"):
        ref_beams = translate(s2s_plain, src, beam_size=4, max_len_b=10)
        ref_tokens = generate(lm_plain, prompts, max_new_tokens=8, greedy=True)
    assert [[h.tokens for h in s] for s in beams] == [[h.tokens for h in s] for s in ref_beams]
    assert tokens == ref_tokens


def _count_kernels(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count which kernel serves each linear call: BLAS (``F.linear``), oneDNN packed, oneDNN unpacked, or the
    autograd wrapper around oneDNN (``OneDNNLinear``)."""
    from aiayn.accel.cpu import packed

    calls = {"blas": 0, "packed": 0, "unpacked": 0, "autograd": 0}

    def counted(name: str, fn):  # noqa: ANN001, ANN202
        def wrapper(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(packed.F, "linear", counted("blas", F.linear))
    monkeypatch.setattr(packed, "packed_linear", counted("packed", packed.packed_linear))
    monkeypatch.setattr(cpu_gemm, "_onednn_nt", counted("unpacked", cpu_gemm._onednn_nt))
    monkeypatch.setattr(cpu_gemm.OneDNNLinear, "apply", counted("autograd", cpu_gemm.OneDNNLinear.apply))
    return calls


@needs_onednn
def test_inference_takes_blas_below_the_size_threshold_and_never_the_autograd_wrapper(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Small inference products go to BLAS (a third of oneDNN's fixed cost), larger ones to the packed kernel, and
    no inference call pays for the autograd.Function around oneDNN (oneDNN's products at many rows, as on a CPU
    with AVX-512: with AVX2 the native panel kernel takes them, tests/unit/test_native.py)."""
    monkeypatch.setattr(native, "panel_linear_preferred", lambda: False)
    layer = nn.Linear(64, 256)
    packed = PackedLinear.from_linear(layer)
    small, large = torch.randn(1, 64), torch.randn(160, 64)  # 16k multiply-adds, and 2.6M
    assert small.numel() * 256 < MIN_ONEDNN_MACS <= large.numel() * 256
    calls = _count_kernels(monkeypatch)
    with use_fp32_backend("onednn"), torch.inference_mode():
        torch.testing.assert_close(packed(small), layer(small), rtol=1e-5, atol=1e-5)
        assert calls == {"blas": 2, "packed": 0, "unpacked": 0, "autograd": 0}  # the reference layer is one
        torch.testing.assert_close(packed(large), layer(large), rtol=1e-5, atol=1e-5)
        assert calls == {"blas": 3, "packed": 1, "unpacked": 0, "autograd": 0}
        # without the packed copy (see the next test), the kernel itself: same values, no autograd wrapper
        torch.testing.assert_close(linear(large, layer.weight, layer.bias), layer(large), rtol=1e-5, atol=1e-5)
        assert calls["unpacked"] == 1 and calls["autograd"] == 0
    with use_fp32_backend("onednn"):  # autograd on: the wrapper, whose backward runs through oneDNN too
        x = large.clone().requires_grad_()
        packed(x).sum().backward()
        assert calls["autograd"] == 1 and x.grad is not None


@needs_onednn
def test_few_row_products_take_the_packed_kernel_from_their_own_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    """A beam step's 4 rows x 256 x 256 (2^18 multiply-adds, under MIN_ONEDNN_MACS) go to the packed kernel, with the
    same values as nn.Linear; 4 rows of a narrower layer, and one row of the same layer, stay on BLAS."""
    layer, narrow = nn.Linear(256, 256), nn.Linear(64, 256)
    fast, fast_narrow = PackedLinear.from_linear(layer), PackedLinear.from_linear(narrow)
    beams, one_row, narrow_beams = torch.randn(4, 256), torch.randn(1, 256), torch.randn(4, 64)
    assert MIN_ONEDNN_MACS_FEW_ROWS <= beams.numel() * 256 < MIN_ONEDNN_MACS
    assert narrow_beams.numel() * 256 < MIN_ONEDNN_MACS_FEW_ROWS
    calls = _count_kernels(monkeypatch)
    with use_fp32_backend("onednn"), torch.inference_mode(), frozen_weights():
        for _ in range(2):  # the plan is made once and kept for the block
            torch.testing.assert_close(fast(beams, "relu"), F.relu(F.linear(beams, layer.weight, layer.bias)),
                                       rtol=1e-5, atol=1e-5)
        assert calls["packed"] == 2
        calls.update(blas=0, packed=0)
        torch.testing.assert_close(fast_narrow(narrow_beams), F.linear(narrow_beams, narrow.weight, narrow.bias),
                                   rtol=1e-5, atol=1e-5)
        assert calls["blas"] == 2 and calls["packed"] == 0  # the reference is the other BLAS call
        torch.testing.assert_close(fast(one_row), layer(one_row), rtol=1e-5, atol=1e-5)
        assert calls["packed"] == 0


@needs_onednn
@pytest.mark.parametrize("backend", ["onednn", "torch"])
def test_models_made_cast_or_reloaded_under_inference_mode(backend: str) -> None:
    """Weights made under ``torch.inference_mode`` record no in-place change, so the packed kernel must never serve
    them a stale copy: a model built there decodes like one built outside, and one cast there, then reloaded
    there, follows its new weights."""
    from aiayn.nn.precision import cast_for_inference

    ids = torch.randint(3, 300, (4, 40))  # large enough for every layer's packed kernel
    reference = _build("decoder", "torch").eval()
    other = _build("decoder", "torch").eval()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05 * torch.randn_like(p))
    with use_fp32_backend(backend), torch.inference_mode():
        built_inside = _build("decoder", backend, "decode")
        assert type(built_inside.decoder.layers[0].ffn.w_in) is PackedLinear
        torch.testing.assert_close(built_inside(ids).logits, reference(ids).logits, rtol=1e-4, atol=1e-4)
        cast = accelerate(cast_for_inference(copy.deepcopy(reference), "float32"), "decode", accel="auto")
        assert type(cast.decoder.layers[0].ffn.w_in) is PackedLinear
        torch.testing.assert_close(cast(ids).logits, reference(ids).logits, rtol=1e-4, atol=1e-4)  # packs
        cast.load_state_dict(other.state_dict())  # an in-place copy, inside inference mode
        torch.testing.assert_close(cast(ids).logits, other(ids).logits, rtol=1e-4, atol=1e-4)


@needs_onednn
@pytest.mark.parametrize("fused", [True, False])
def test_the_packed_copy_follows_optimizer_steps_fused_ones_too(fused: bool) -> None:
    """Fused Adam (the trainer's default where supported) changes weights without moving their version counter;
    evaluation between training steps must still see the current weights, not the packed copy of the first one."""
    ids = torch.randint(3, 300, (4, 40))  # large enough for every layer's packed kernel
    with use_fp32_backend("onednn"):
        model = _build("decoder", "onednn", "train")
        assert type(model.decoder.layers[0].ffn.w_in) is PackedLinear
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, fused=fused)
        for _ in range(2):
            model.eval()
            with torch.inference_mode():
                model(ids)  # packs the current weights (the second time: must repack)
            model.train()
            model(ids).logits.square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        model.eval()
        with torch.inference_mode():
            fresh = copy.deepcopy(model)  # copies leave the packed weights behind
            torch.testing.assert_close(model(ids).logits, fresh(ids).logits, rtol=1e-5, atol=1e-5)


@needs_onednn
def test_one_row_products_split_over_two_threads_equal_f_linear() -> None:
    """Where oneDNN is the fp32 backend, one row times a mid-sized weight runs as two half-width products in one
    bmm (MKL runs a single row on one thread): same values as F.linear, biases, activations and weight changes
    followed; odd widths, several rows, one thread and tiny products keep F.linear."""
    from aiayn.accel.cpu.packed import MIN_SPLIT_ROW_MACS

    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with use_fp32_backend("onednn"), torch.no_grad():
            for bias in (True, False):
                layer = nn.Linear(384, 1152, bias=bias)
                fast = PackedLinear.from_linear(layer)
                assert MIN_SPLIT_ROW_MACS <= 384 * 1152 < MIN_ONEDNN_MACS
                for x in (torch.randn(1, 384), torch.randn(1, 1, 384)):
                    torch.testing.assert_close(fast(x), layer(x), rtol=1e-5, atol=1e-5)
                    torch.testing.assert_close(fast(x, activation="gelu"), F.gelu(layer(x)), rtol=1e-5, atol=1e-5)
                assert fast._halves is not None and fast._halves.shape == (2, 384, 576)
                layer.weight.mul_(-2.0)  # an in-place change: the split copy is remade
                x = torch.randn(1, 384)
                torch.testing.assert_close(fast(x), layer(x), rtol=1e-5, atol=1e-5)
            for shape, rows in (((384, 1151), 1), ((384, 1152), 3), ((64, 256), 1)):
                plain = PackedLinear.from_linear(nn.Linear(*shape))
                x = torch.randn(rows, shape[0])
                torch.testing.assert_close(plain(x), F.linear(x, plain.weight, plain.bias), rtol=1e-5, atol=1e-5)
                assert plain._halves is None
            torch.set_num_threads(1)
            single = PackedLinear.from_linear(nn.Linear(384, 1152))
            single(torch.randn(1, 384))
            assert single._halves is None
    finally:
        torch.set_num_threads(threads)


needs_native = pytest.mark.skipif(native.library() is None, reason="native kernels not built")


def _native_forward_at_test_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The native forward product at test sizes: as on an AVX2 CPU, with small thresholds."""
    monkeypatch.setattr(native, "panel_linear_preferred", lambda: True)
    monkeypatch.setattr(cpu_gemm, "NATIVE_FORWARD_MIN_OUT", 40)
    monkeypatch.setattr(cpu_gemm, "NATIVE_FORWARD_MIN_ROWS", 8)


@pytest.fixture
def native_forward_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    _native_forward_at_test_sizes(monkeypatch)


@needs_native
@pytest.mark.usefixtures("native_forward_everywhere")
def test_native_forward_applies_to_wide_fp32_outputs_only() -> None:
    x, w = torch.randn(8, 32), torch.randn(40, 32)
    with use_fp32_backend("torch"):
        assert native_forward_applies(x, w)
        assert not native_forward_applies(x[:7], w)  # too few rows
        assert native_forward_applies(x.view(2, 4, 32), w)  # rows in all, over the leading dimensions
        assert not native_forward_applies(x, torch.randn(40, 31))  # a mismatch is F.linear's to report
        assert not native_forward_applies(x, w[:39])  # too few outputs
        assert not native_forward_applies(torch.randn(8, 769), torch.randn(40, 769))  # too many inputs
        assert not native_forward_applies(x.double(), w.double())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert not native_forward_applies(x, w)
    with use_fp32_backend("onednn"):  # oneDNN trains (an AVX-512 AMD CPU): its products, not the panel kernel
        assert not native_forward_applies(x, w) or not onednn_available()


@needs_native
@pytest.mark.usefixtures("native_forward_everywhere")
@pytest.mark.parametrize("bias", [True, False])
def test_native_forward_linear_equals_f_linear_forward_and_backward(bias: bool) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 6, 32, requires_grad=True)
    w = torch.randn(50, 32, requires_grad=True)
    b = torch.randn(50, requires_grad=True) if bias else None
    g = torch.randn(2, 6, 50)
    with use_fp32_backend("torch"):
        calls = []
        original = native.panel_linear_once
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(native, "panel_linear_once", lambda *a, **k: calls.append(1) or original(*a, **k))
            y = linear(x, w, b)
        assert calls, "the native product did not run"
        grads = torch.autograd.grad(y, [x, w] + ([b] if bias else []), g)
        ref = F.linear(x, w, b)
        ref_grads = torch.autograd.grad(ref, [x, w] + ([b] if bias else []), g)
        torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
        for a, r in zip(grads, ref_grads):
            torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-5)
        with torch.no_grad():  # no autograd node: the kernel itself
            torch.testing.assert_close(linear(x, w, b), ref, rtol=1e-5, atol=1e-5)
        out = torch.empty(12, 50)
        assert mm_nt(x.detach().view(12, 32), w.detach(), out=out) is out
        torch.testing.assert_close(out, (x @ w.T).detach().view(12, 50), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("path", ["onednn", "native"])
@pytest.mark.parametrize("epsilon,ignore", [(0.0, None), (0.1, 0)])
def test_the_fused_loss_through_a_faster_product_equals_the_reference(monkeypatch: pytest.MonkeyPatch, path: str,
                                                                       epsilon: float, ignore: int | None) -> None:
    """The logits through oneDNN, or through the native panel kernel (at test sizes), equal the reference."""
    if path == "onednn" and not onednn_available():
        pytest.skip("this PyTorch build has no oneDNN")
    if path == "native":
        if native.library() is None:
            pytest.skip("native kernels not built")
        _native_forward_at_test_sizes(monkeypatch)
    torch.manual_seed(1)
    h = torch.randn(300, 32, requires_grad=True)
    w = torch.randn(50, 32, requires_grad=True)
    labels = torch.randint(0, 50, (300,))
    labels[::7] = -100
    calls = []
    original = native.panel_linear_once
    monkeypatch.setattr(native, "panel_linear_once", lambda *a, **k: calls.append(a[0].shape[0]) or original(*a, **k))
    with use_fp32_backend("onednn" if path == "onednn" else "torch"):
        loss, nll, n = linear_label_smoothed_nll(h, w, labels, epsilon, ignore_vocab_id=ignore, chunk_rows=128)
    if path == "native":  # whole chunks; the last, short one through BLAS
        assert calls and all(rows == 128 for rows in calls)
    else:
        assert not calls
    grad_h, grad_w = torch.autograd.grad(loss, [h, w])
    ref = label_smoothed_nll(h @ w.T, labels, epsilon, "sum", ignore)
    ref = ref[0] if isinstance(ref, tuple) else ref
    ref_h, ref_w = torch.autograd.grad(ref, [h, w])
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(grad_h, ref_h, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad_w, ref_w, rtol=1e-5, atol=1e-4)
