"""Prepacked output layers: same parameters, ties and state_dict; same outputs and decodes; never stale; training,
other dtypes, copies and int8 quantization still work."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from aiayn import ModelConfig, build_model
from aiayn.accel.cpu import native
from aiayn.accel.cpu.gemm import use_fp32_backend
from aiayn.accel.cpu.layout import column_major_linears, is_column_major
from aiayn.accel.cpu.packed import PackedLinear, onednn_available, unpack_output_layers
from aiayn.accel.cpu.packed import pack_output_layers as pack_wide_only
from aiayn.accel.cpu.quantize import quantize_int8
from aiayn.checkpoint import load_model_state, save_checkpoint
from aiayn.generate import generate, translate
from aiayn.models.heads import LMHead

pytestmark = pytest.mark.skipif(not onednn_available(), reason="this PyTorch build has no oneDNN")


@pytest.fixture(autouse=True)
def _torch_fp32_backend(monkeypatch: pytest.MonkeyPatch):
    """These tests hold the policy of hosts where torch's BLAS is the fp32 backend (fp32 packed from two rows, only
    where packed); tests/unit/test_cpu_gemm.py covers hosts where oneDNN is (every layer, by size). oneDNN's packed
    products serve many rows, as on a CPU with AVX-512: on AVX2 ones the native panel kernel takes them
    (tests/unit/test_native.py)."""
    monkeypatch.setattr(native, "panel_linear_preferred", lambda: False)
    with use_fp32_backend("torch"):
        yield


def _model(arch: str, seed: int = 0, **kw: object) -> nn.Module:
    torch.manual_seed(seed)
    kw = {"n_classes": 3, **kw} if arch == "encoder" else kw
    return build_model(ModelConfig.preset("tiny", arch=arch, vocab_size=300, **kw)).eval()


def pack_output_layers(model: nn.Module) -> nn.Module:
    """Pack these tests' narrow models too (by default only layers at least 256 wide are packed)."""
    return pack_wide_only(model, min_in_features=1)


def cpu_inference_layout(model: nn.Module) -> nn.Module:
    """``aiayn.accel.cpu.layout.cpu_inference_layout`` with the narrow output layers of these tests packed too."""
    return pack_output_layers(column_major_linears(model))


def _logits(model: nn.Module, arch: str, ids: torch.Tensor) -> torch.Tensor:
    return model(ids, ids[:, :6]).logits if arch == "encoder-decoder" else model(ids).logits


@pytest.mark.parametrize("arch", ["encoder-decoder", "decoder"])
def test_packing_keeps_parameters_ties_and_state_dict(arch: str) -> None:
    model = _model(arch)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = [id(p) for p in model.parameters()]
    cpu_inference_layout(model)
    assert type(model.lm_head.proj) is PackedLinear
    assert all(is_column_major(m.weight) for m in model.modules() if isinstance(m, nn.Linear))
    assert [id(p) for p in model.parameters()] == params
    embed = model.tgt_embed if arch == "encoder-decoder" else model.embed
    assert model.lm_head.proj.weight is embed.weight
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], v) for k, v in before.items())
    pack_output_layers(model)  # idempotent
    assert type(model.lm_head.proj) is PackedLinear


@pytest.mark.parametrize("arch", ["encoder-decoder", "decoder"])
def test_packed_outputs_match_plain_linear(arch: str) -> None:
    ref = _model(arch)
    packed = cpu_inference_layout(copy.deepcopy(ref))
    ids = torch.randint(3, 300, (3, 9))
    with torch.inference_mode():
        a, b = _logits(ref, arch, ids), _logits(packed, arch, ids)
    assert packed.lm_head.proj._packed is not None  # the packed path really ran
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def test_an_encoder_mlm_head_is_packed_too() -> None:
    ref = build_model(ModelConfig.preset("bert-base", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=300,
                                         max_len=16)).eval()
    packed = pack_output_layers(copy.deepcopy(ref))
    assert any(isinstance(m, LMHead) and type(m.proj) is PackedLinear for m in packed.modules())
    ids = torch.randint(3, 300, (2, 8))
    with torch.inference_mode():
        torch.testing.assert_close(packed(ids).logits, ref(ids).logits, rtol=1e-5, atol=1e-5)


def test_packed_decoding_matches_plain() -> None:
    ref = _model("encoder-decoder")
    packed = cpu_inference_layout(copy.deepcopy(ref))
    src = torch.randint(4, 300, (3, 7))
    beams = [translate(m, src, beam_size=3, max_len_b=8) for m in (ref, packed)]
    assert [[h.tokens for h in s] for s in beams[0]] == [[h.tokens for h in s] for s in beams[1]]
    lm = _model("decoder")
    lm_packed = cpu_inference_layout(copy.deepcopy(lm))
    prompts = [[5, 6, 7], [8, 9]]
    assert generate(lm, prompts, max_new_tokens=6, greedy=True) == generate(lm_packed, prompts, max_new_tokens=6,
                                                                             greedy=True)


def test_the_packed_copy_follows_weight_changes() -> None:
    model = pack_output_layers(_model("decoder"))
    other = _model("decoder", seed=1)
    ids = torch.randint(3, 300, (2, 7))
    with torch.inference_mode():
        model(ids)  # packs the seed-0 weights
        first = model.lm_head.proj._packed
    model.load_state_dict(other.state_dict())  # in-place copy_: the version counter moves
    with torch.inference_mode():
        torch.testing.assert_close(model(ids).logits, other(ids).logits, rtol=1e-5, atol=1e-5)
    assert model.lm_head.proj._packed is not first
    with torch.no_grad():
        model.embed.weight.mul_(2.0)  # an in-place change of the tied table
        other.embed.weight.mul_(2.0)
        torch.testing.assert_close(model(ids).logits, other(ids).logits, rtol=1e-5, atol=1e-5)


def test_training_and_other_dtypes_take_the_plain_path() -> None:
    ref = _model("decoder").train()
    model = pack_output_layers(copy.deepcopy(ref)).train()
    ids = torch.randint(3, 300, (2, 7))
    torch.manual_seed(3)
    _logits(ref, "decoder", ids).square().mean().backward()
    torch.manual_seed(3)
    _logits(model, "decoder", ids).square().mean().backward()
    assert model.lm_head.proj._packed is None  # autograd on: never packed
    torch.testing.assert_close(model.embed.weight.grad, ref.embed.weight.grad)
    double = pack_output_layers(_model("decoder")).double()
    with torch.inference_mode():
        out = double(ids).logits
    assert out.dtype == torch.float64 and double.lm_head.proj._packed is None


def test_copies_saving_and_int8_quantization(tmp_path) -> None:
    model = cpu_inference_layout(_model("encoder-decoder"))
    ids = torch.randint(3, 300, (2, 7))
    with torch.inference_mode():
        expected = _logits(model, "encoder-decoder", ids)
    clone = copy.deepcopy(model)
    assert clone.lm_head.proj._packed is None and clone.lm_head.proj.weight is clone.tgt_embed.weight
    with torch.inference_mode():
        torch.testing.assert_close(_logits(clone, "encoder-decoder", ids), expected)
    save_checkpoint(tmp_path / "ck", model, {})
    fresh = _model("encoder-decoder", seed=5)
    load_model_state(tmp_path / "ck", fresh)
    with torch.inference_mode():
        torch.testing.assert_close(_logits(fresh, "encoder-decoder", ids), expected, rtol=1e-5, atol=1e-5)
    int8 = quantize_int8(model)
    assert not any(isinstance(m, PackedLinear | nn.Linear) for m in int8.modules())  # the output layer too
    assert type(model.lm_head.proj) is PackedLinear  # the fp32 model is left as it was
    assert type(unpack_output_layers(model).lm_head.proj) is nn.Linear


def test_one_row_takes_the_plain_path_and_more_rows_the_packed_one() -> None:
    proj = PackedLinear.from_linear(nn.Linear(16, 300))
    x = torch.randn(3, 16)
    with torch.inference_mode():
        one = proj(x[:1])  # a matrix-vector product: F.linear is faster there
        assert proj._packed is None
        many = proj(x)
        assert proj._packed is not None
    torch.testing.assert_close(one, many[:1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(many, nn.functional.linear(x, proj.weight, proj.bias), rtol=1e-5, atol=1e-5)


def test_narrow_output_layers_are_left_alone_by_default() -> None:
    from aiayn.accel.cpu.layout import cpu_inference_layout as real_layout
    from aiayn.accel.cpu.packed import MIN_PACKED_IN_FEATURES

    narrow = real_layout(_model("decoder"))
    proj = narrow.lm_head.proj
    assert proj.in_features < MIN_PACKED_IN_FEATURES
    # never given a packed copy: a plain nn.Linear, or (with the native kernels) one for a decoding step's few rows
    assert type(proj) is nn.Linear or (type(proj) is PackedLinear and proj.few_rows_only)
    proj(torch.randn(8, proj.in_features))
    assert getattr(proj, "_packed", None) is None
    wide = real_layout(build_model(ModelConfig.preset("tiny", arch="decoder", vocab_size=300, d_model=256)))
    assert type(wide.lm_head.proj) is PackedLinear


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_fused_activation_equals_the_function_after_the_product(activation: str, monkeypatch) -> None:
    """The feed-forward layer's activation, applied by oneDNN inside the packed product at CPU inference, gives
    exactly what the activation after the product gives (fp32), on every route a PackedLinear takes."""
    from aiayn.accel.cpu import packed as packed_module

    fn = {"relu": torch.relu, "gelu": torch.nn.functional.gelu}[activation]
    torch.manual_seed(0)
    layer = nn.Linear(64, 256)
    fast = PackedLinear.from_linear(layer)
    kernel_activations = []
    real_kernel = packed_module.torch.ops.mkldnn._linear_pointwise

    def spy(x, w, b, attr, scalars, algorithm):  # noqa: ANN001, ANN202
        kernel_activations.append(attr)
        return real_kernel(x, w, b, attr, scalars, algorithm)

    monkeypatch.setattr(packed_module.torch.ops.mkldnn, "_linear_pointwise", spy)
    x = torch.randn(5, 64) * 3
    for backend in ("torch", "onednn"):
        with use_fp32_backend(backend), torch.no_grad():
            for rows in (x[:1], x):  # one row: F.linear, then the activation; five rows: packed and fused
                assert torch.equal(fast(rows, activation=activation), fn(layer(rows)))
    assert kernel_activations and set(kernel_activations) == {activation}
    # training: the plain differentiable path, the activation after it
    xg = x.clone().requires_grad_()
    fast(xg, activation=activation).sum().backward()
    ref = x.clone().requires_grad_()
    fn(layer(ref)).sum().backward()
    torch.testing.assert_close(xg.grad, ref.grad)


@pytest.mark.parametrize("activation", ["relu", "gelu", "swiglu"])
def test_feed_forward_fuses_its_activation_only_where_it_can(activation: str, monkeypatch) -> None:
    """An accelerated model's FFN asks its packed first layer for the fused activation (relu, gelu) and leaves gated
    ones alone; the logits equal those of the reference model."""
    from aiayn.accel import accelerate
    from aiayn.nn.feedforward import FeedForward

    cfg = ModelConfig.preset("tiny", arch="decoder", vocab_size=300, activation=activation)
    torch.manual_seed(0)
    plain = build_model(cfg).eval()
    with use_fp32_backend("onednn"):
        fast = build_model(cfg).eval()
        fast.load_state_dict(plain.state_dict())
        accelerate(fast, "decode", accel="auto")
        ffn = next(m for m in fast.modules() if isinstance(m, FeedForward))
        assert type(ffn) is FeedForward and type(ffn.w_in) is PackedLinear  # the core module, a packed layer
        asked = []
        real_forward = PackedLinear.forward

        def spy(self, x, activation=None):  # noqa: ANN001, ANN202
            if self is ffn.w_in:
                asked.append(activation)
            return real_forward(self, x, activation)

        monkeypatch.setattr(PackedLinear, "forward", spy)
        ids = torch.randint(3, 300, (4, 40))
        with torch.inference_mode():
            torch.testing.assert_close(fast(ids).logits, plain(ids).logits, rtol=1e-5, atol=1e-5)
    assert asked == [None if activation == "swiglu" else activation]


@pytest.mark.parametrize("backend", ["torch", "onednn"])
def test_frozen_blocks_choose_once_per_shape_and_start_afresh(backend: str, monkeypatch) -> None:
    """Inside ``frozen_weights`` a layer keeps its choice per input shape and dtype (every shape still gets its own
    product, with the same values); a new block sees weight changes made between blocks; copies drop the plans."""
    from aiayn.accel.cpu import packed

    layer = nn.Linear(64, 256)
    fast = PackedLinear.from_linear(layer)
    one, many = torch.randn(1, 64), torch.randn(160, 64)
    choices = []
    real_plan = PackedLinear.plan
    monkeypatch.setattr(PackedLinear, "plan",
                        lambda self, x, a: choices.append(tuple(x.shape)) or real_plan(self, x, a))
    with use_fp32_backend(backend), torch.inference_mode():
        with packed.frozen_weights():
            for _ in range(3):
                for x in (one, many):
                    torch.testing.assert_close(fast(x), layer(x), rtol=1e-5, atol=1e-5)
            with packed.frozen_weights():  # nested: the outer block's choices
                fast(one)
            assert fast(many, activation="relu").min() >= 0
            assert choices == [(1, 64), (160, 64), (160, 64)]  # (the last: another activation)
            assert fast._plans is not None and len(fast._plans[2]) == 3
            assert copy.deepcopy(fast)._plans is None
        with packed.frozen_weights():  # nothing changed: a later block keeps the choices
            torch.testing.assert_close(fast(many), layer(many), rtol=1e-5, atol=1e-5)
        assert len(choices) == 3
        layer.weight.mul_(-1.0)  # between blocks: the next block sees it
        fast(one)  # and so does every call outside a block
        assert len(choices) == 4
        with packed.frozen_weights():
            torch.testing.assert_close(fast(many), layer(many), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(fast(one), layer(one), rtol=1e-5, atol=1e-5)
        assert len(choices) == 6


def test_a_frozen_block_holds_only_in_its_own_thread() -> None:
    """Another thread, outside any block, keeps checking at every call: it may be training meanwhile."""
    import threading

    from aiayn.accel.cpu import packed

    layer = PackedLinear.from_linear(nn.Linear(8, 4))
    seen = {}

    def other() -> None:
        seen["block"] = packed.frozen_block()
        x = torch.randn(3, 8, requires_grad=True)
        layer(x).sum().backward()  # training in the other thread: gradients flow
        seen["grad"] = x.grad is not None

    with packed.frozen_weights():
        assert packed.frozen_block() > 0
        with torch.inference_mode():
            layer(torch.randn(3, 8))  # a plan for this shape, in this thread's block
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert seen == {"block": 0, "grad": True} and packed.frozen_block() == 0


def test_kept_choices_follow_every_change_between_blocks(monkeypatch) -> None:
    """A later block keeps a layer's choices only while its weight and bias, autocast, the backend and the thread
    count are as they were; any change between blocks gives fresh choices and the right values, and with autograd
    on the choices last one block only."""
    from aiayn.accel.cpu import packed

    layer = nn.Linear(64, 256)
    fast = PackedLinear.from_linear(layer)
    x = torch.randn(160, 64)
    made = []
    real_plan = PackedLinear.plan
    monkeypatch.setattr(PackedLinear, "plan", lambda self, x, a: made.append(1) or real_plan(self, x, a))

    def block() -> None:
        with packed.frozen_weights(), torch.inference_mode():
            torch.testing.assert_close(fast(x), layer(x), rtol=1e-5, atol=1e-5)

    threads = torch.get_num_threads()
    changes = [lambda: None,  # nothing: kept
               lambda: layer.weight.detach().add_(1.0),  # in place: a new version
               lambda: setattr(layer, "bias", nn.Parameter(torch.randn(256))),  # a new bias
               lambda: torch.optim.SGD(layer.parameters(), lr=0.1).step(),  # an optimizer step (no gradients)
               lambda: torch.set_num_threads(1 if threads > 1 else 2)]
    try:
        with use_fp32_backend("onednn"):
            block()
            for i, change in enumerate(changes):
                change()
                fast.bias = layer.bias
                block()
                assert len(made) == 1 + i, f"change {i}"
        with use_fp32_backend("torch"):  # another backend
            block()
        assert len(made) == len(changes) + 1
    finally:
        torch.set_num_threads(threads)
    for _ in range(2):  # autograd on: every block chooses afresh
        with packed.frozen_weights():
            fast(x)
    assert len(made) == len(changes) + 3


@pytest.mark.skipif(native.library() is None, reason="the native kernels are not built here")
@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_few_rows_only_layers_take_the_native_kernel_at_few_rows_and_blas_above(activation, monkeypatch) -> None:
    """Where torch's BLAS is the fp32 backend (this module's fixture), the decoding layout's layers use aiayn's
    few-row kernel up to native.MAX_LINEAR_ROWS rows and F.linear above, never a packed copy or the panel product
    (even where the panel product is preferred), and keep that through copies."""
    from aiayn.accel.cpu.layout import cpu_inference_layout as real_layout

    monkeypatch.setattr(native, "panel_linear_preferred", lambda: True)
    layer = real_layout(nn.Sequential(nn.Linear(64, 96)))[0]
    assert type(layer) is PackedLinear and layer.few_rows_only and is_column_major(layer.weight)
    calls = []
    for name in ("rows_linear_plan", "panel_linear_plan"):
        real = getattr(native, name)
        monkeypatch.setattr(native, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    act = {None: lambda y: y, "relu": torch.relu, "gelu": torch.nn.functional.gelu}[activation]
    with torch.no_grad():
        for rows in (1, native.MAX_LINEAR_ROWS, native.MAX_LINEAR_ROWS + 1, 40):
            x = torch.randn(rows, 64)
            want = act(torch.nn.functional.linear(x, layer.weight, layer.bias))
            torch.testing.assert_close(layer(x, activation), want, atol=1e-5, rtol=1e-5)
            assert calls == (["rows_linear_plan"] if rows <= native.MAX_LINEAR_ROWS else []), rows
            calls.clear()
    assert layer._packed is None and layer._panels is None
    assert copy.deepcopy(layer).few_rows_only
