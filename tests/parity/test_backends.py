"""The fused backend (torch SDPA) equals the reference backend (explicit softmax) for every mask, bias and
head layout, with finite gradients; and whole models give the same logits on either backend."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn

from aiayn import ModelConfig, build_model
from aiayn.accel import accelerate
from aiayn.accel.cpu import functional as cpu_functional
from aiayn.accel.cpu import short_attention
from aiayn.accel.cpu.functional import cpu_attention_kernel
from aiayn.config import ARCHS, POSITIONS
from aiayn.nn import masks as M
from aiayn.nn.attention import MultiHeadAttention, _expand_kv, scaled_dot_product_attention
from aiayn.nn.positions import ALiBi, T5RelativeBias

B, H, T, DH = 3, 4, 8, 8
ATOL = 1e-5


def _is_token() -> Tensor:
    """(B, T) bool, right padding of different lengths (no example fully padded)."""
    return torch.arange(T)[None, :] < torch.tensor([[T], [5], [2]])


def _keys_after(first_real: list[int]) -> Tensor:
    """(B, T) bool: key j is a real token when j > first_real[b] (left padding up to that index)."""
    return torch.arange(T)[None, :] > torch.tensor(first_real)[:, None]


def _doc_ids() -> Tensor:
    """(B, T) packed documents; -1 marks padding."""
    return torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2], [0, 1, 1, 1, 1, 1, -1, -1], [5, 5, 5, 5, 6, 6, 6, 6]])


# name -> (mask (broadcastable to (B, H, T, S)) or None, is_causal, number of keys S)
MASKS: dict[str, Callable[[], tuple[Tensor | None, bool, int]]] = {
    "none": lambda: (None, False, T),
    "padding": lambda: (M.padding_mask(_is_token()), False, T),
    "causal": lambda: (M.causal_mask(T), False, T),
    "is_causal": lambda: (None, True, T),
    "is_causal+padding": lambda: (M.padding_mask(_is_token()), True, T),
    "causal-cached": lambda: (M.causal_mask(T, T + 4), False, T + 4),  # queries are the last T of S keys
    "is_causal-cached": lambda: (None, True, T + 4),
    "prefix-lm": lambda: (M.prefix_lm_mask(T, torch.tensor([3, 0, T])), False, T),
    "sliding-window": lambda: (M.sliding_window_mask(T, 3), False, T),
    "sliding-window-bidir": lambda: (M.sliding_window_mask(T, 2, causal=False), False, T),
    "sliding-window-cached": lambda: (M.sliding_window_mask(T, 3, T + 4), False, T + 4),
    "local-global": lambda: (M.local_global_mask(T, 2, [0, 5]), False, T),
    "local-global-causal": lambda: (M.local_global_mask(T, 2, [0, 5], causal=True), False, T),
    "block-sparse": lambda: (M.block_sparse_mask(T, 2, 1, stride=2), False, T),
    "block-sparse-causal": lambda: (M.block_sparse_mask(T, 2, 2, causal=True), False, T),
    "document": lambda: (M.document_mask(_doc_ids()), False, T),
    "document-bidir": lambda: (M.document_mask(_doc_ids(), causal=False), False, T),
    "combined": lambda: (M.combine(M.padding_mask(_is_token()), M.sliding_window_mask(T, 3),
                                   M.document_mask(_doc_ids())), False, T),
    # query 0 sees no key (key 0 is padding for example 1): a fully masked row
    "empty-row": lambda: (M.combine(M.padding_mask(_keys_after([-1, 0, -1])), M.causal_mask(T)), False, T),
    "empty-example": lambda: (M.padding_mask(_keys_after([-1, T, -1]) & _is_token()), False, T),
    "empty-row-is_causal": lambda: (M.padding_mask(torch.arange(T)[None, :] > 0).expand(B, 1, 1, T), True, T),
}


def _bias(kind: str, s: int) -> Tensor | None:
    """(1, H, T, S) additive bias for queries at the last T of S positions."""
    if kind == "none":
        return None
    q_pos, k_pos = torch.arange(s - T, s)[None], torch.arange(s)[None]
    if kind == "alibi":
        return ALiBi(H)(q_pos, k_pos)
    rel = T5RelativeBias(H, 16, 32, bidirectional=True)
    nn.init.normal_(rel.embedding.weight, 0.0, 1.0)
    return rel(q_pos, k_pos).detach()


def _empty_rows(mask: Tensor | None, is_causal: bool, s: int) -> Tensor:
    """(B, 1|H, T, 1) True where a query may attend no key."""
    full = torch.ones(B, 1, T, s, dtype=torch.bool)
    if mask is not None:
        full = full & mask
    if is_causal:
        full = full & M.causal_mask(T, s)
    return ~full.any(-1, keepdim=True)


def _run(backend: str, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None,
         is_causal: bool, kernel: Callable | None = None) -> tuple[Tensor, tuple[Tensor, ...]]:
    q, k, v = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    out, _ = scaled_dot_product_attention(q, k, v, mask=mask, bias=bias, backend=backend, is_causal=is_causal,
                                          kernel=kernel)
    (out * torch.linspace(-1, 1, out.numel(), device=out.device).view_as(out)).sum().backward()
    return out.detach(), (q.grad, k.grad, v.grad)


# (bias, kv heads): every head layout without a bias, and each bias with a grouped layout (kept to five
# combinations per mask so the whole grid stays fast; the bias path does not depend on the head layout)
LAYOUTS = [("none", H), ("none", 2), ("none", 1), ("alibi", 2), ("t5", 1)]


@pytest.mark.parametrize("kernel", ["torch", "two-matmuls"])
@pytest.mark.parametrize("bias_kind,kv_heads", LAYOUTS, ids=[f"{b}-{({H: 'mha', 2: 'gqa', 1: 'mqa'})[k]}"
                                                             for b, k in LAYOUTS])
@pytest.mark.parametrize("mask_name", list(MASKS))
def test_sdpa_equals_reference(mask_name: str, bias_kind: str, kv_heads: int, kernel: str, device: str,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    """kernel "torch": the core's fused kernel (torch's); "two-matmuls": :mod:`aiayn.accel.cpu.short_attention`,
    which the CPU accelerator's kernel (:func:`~aiayn.accel.cpu.functional.cpu_attention_kernel`) trains CPU attention
    over few keys with (this grid has at most 12)."""
    if kernel == "two-matmuls" and device != "cpu":
        pytest.skip("the two-matmul path serves CPU training only")
    served = []
    real_attention = short_attention.attention
    monkeypatch.setattr(short_attention, "attention", lambda *a, **kw: served.append(1) or real_attention(*a, **kw))
    mask, is_causal, s = MASKS[mask_name]()
    bias = _bias(bias_kind, s)
    q, k, v = torch.randn(B, H, T, DH), torch.randn(B, kv_heads, s, DH), torch.randn(B, kv_heads, s, DH)
    empty = _empty_rows(mask, is_causal, s).expand(B, H, T, DH).to(device)
    # the same inputs on every device; the kernels are the device's own
    mask, bias, q, k, v = (None if x is None else x.to(device) for x in (mask, bias, q, k, v))
    ref, ref_grads = _run("reference", q, k, v, mask, bias, is_causal)
    fused, fused_grads = _run("sdpa", q, k, v, mask, bias, is_causal,
                              kernel=cpu_attention_kernel if kernel == "two-matmuls" else None)
    assert bool(served) == (kernel == "two-matmuls")
    torch.testing.assert_close(fused, ref, atol=ATOL, rtol=0)
    for g_fused, g_ref in zip(fused_grads, ref_grads, strict=True):
        assert bool(torch.isfinite(g_fused).all()) and bool(torch.isfinite(g_ref).all())
        torch.testing.assert_close(g_fused, g_ref, atol=ATOL, rtol=0)
    assert bool(torch.isfinite(ref).all()) and bool(torch.isfinite(fused).all())
    assert bool((ref[empty] == 0).all()) and bool((fused[empty] == 0).all())
    if mask_name.startswith("empty"):
        assert bool(empty.any())


@pytest.mark.parametrize("mask_name", ["padding", "causal-cached", "document", "empty-row", "empty-example"])
def test_weights_are_a_distribution_over_allowed_keys(mask_name: str) -> None:
    mask, is_causal, s = MASKS[mask_name]()
    q, k, v = torch.randn(B, H, T, DH), torch.randn(B, H, s, DH), torch.randn(B, H, s, DH)
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask, bias=_bias("alibi", s), backend="sdpa",
                                                return_weights=True, is_causal=is_causal)
    assert weights is not None and weights.shape == (B, H, T, s)
    allowed = torch.ones(B, H, T, s, dtype=torch.bool) & mask
    assert bool((weights[~allowed] == 0).all())
    empty = _empty_rows(mask, is_causal, s)[..., 0].expand(B, H, T)
    torch.testing.assert_close(weights.sum(-1), (~empty).float(), atol=1e-6, rtol=0)
    torch.testing.assert_close(out, weights @ v, atol=ATOL, rtol=0)


# ---------------------------------------------------------------------------------------------- GQA / MQA
@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_expand_kv_is_repeat_interleave(kv_heads: int) -> None:
    x = torch.randn(B, kv_heads, 5, DH)
    torch.testing.assert_close(_expand_kv(x, 8), x.repeat_interleave(8 // kv_heads, dim=1), atol=0, rtol=0)


def test_gqa_with_all_kv_heads_is_mha() -> None:
    mha = MultiHeadAttention(32, 4)
    gqa = MultiHeadAttention(32, 4, n_kv_heads=4)
    gqa.load_state_dict(mha.state_dict())
    x = torch.randn(B, T, 32)
    torch.testing.assert_close(gqa(x, is_causal=True)[0], mha(x, is_causal=True)[0], atol=0, rtol=0)


@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
@pytest.mark.parametrize("kv_heads", [1, 2], ids=["mqa", "gqa"])
def test_gqa_equals_mha_with_repeated_kv_weights(kv_heads: int, cross: bool) -> None:
    """Key/value head j serves query heads j*g .. j*g+g-1 (g = H / Hkv): MHA with each kv head's weights
    repeated g times in place computes the same function."""
    d, h, dh = 32, 4, 8
    g = h // kv_heads
    gqa = MultiHeadAttention(d, h, kv_heads, cross=cross)
    mha = MultiHeadAttention(d, h, cross=cross)
    for p in gqa.parameters():
        nn.init.normal_(p, 0.0, 0.3)

    def repeat_heads(t: Tensor) -> Tensor:  # (Hkv*Dh, ...) -> (H*Dh, ...)
        return t.view(kv_heads, dh, *t.shape[1:]).repeat_interleave(g, dim=0).reshape(h * dh, *t.shape[1:])

    with torch.no_grad():
        mha.out_proj.load_state_dict(gqa.out_proj.state_dict())
        if cross:
            mha.q_proj.load_state_dict(gqa.q_proj.state_dict())
            src, dst, offset = gqa.kv_proj, mha.kv_proj, 0
        else:
            src, dst, offset = gqa.qkv_proj, mha.qkv_proj, h * dh
            dst.weight[:offset] = src.weight[:offset]
            dst.bias[:offset] = src.bias[:offset]
        kv = kv_heads * dh
        for i in range(2):  # k then v
            rows = slice(offset + i * kv, offset + (i + 1) * kv)
            dst.weight[offset + i * h * dh: offset + (i + 1) * h * dh] = repeat_heads(src.weight[rows])
            dst.bias[offset + i * h * dh: offset + (i + 1) * h * dh] = repeat_heads(src.bias[rows])
    x = torch.randn(B, T, d)
    memory = torch.randn(B, 6, d) if cross else None
    memory_is_token = torch.arange(6)[None] < torch.tensor([[6], [3], [1]])  # (B, 6)
    mask = M.padding_mask(memory_is_token) if cross else M.causal_mask(T)
    for backend in ("reference", "sdpa"):
        gqa.backend = mha.backend = backend
        want, _ = mha(x, memory, mask=mask)
        torch.testing.assert_close(gqa(x, memory, mask=mask)[0], want, atol=ATOL, rtol=0)


# ---------------------------------------------------------------------------------------------- model level
def _set_backend(model: nn.Module, backend: str) -> int:
    n = 0
    for mod in model.modules():
        if isinstance(mod, MultiHeadAttention):
            mod.backend = backend
            n += 1
    return n


def _logits(model: nn.Module, arch: str, inputs: dict[str, Tensor]) -> Tensor:
    with torch.no_grad():
        if arch == "encoder-decoder":
            return model(inputs["src"], inputs["tgt"]).logits
        return model(inputs["ids"], **{k: v for k, v in inputs.items() if k != "ids"}).logits


def _model(arch: str, position: str, **kw: object) -> nn.Module:
    cfg = ModelConfig(arch=arch, vocab_size=40, d_model=32, n_heads=4, n_kv_heads=2, n_layers=1, d_ff=48,
                      max_len=64, dropout=0.0, position=position, **kw)
    model = build_model(cfg).eval()
    with torch.no_grad():  # nonzero biases and norms, and T5 buckets that matter
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("arch", ARCHS)
def test_model_logits_same_on_both_backends(arch: str, position: str) -> None:
    model = _model(arch, position)
    ids = torch.randint(1, 40, (B, 12))
    if arch == "encoder-decoder":
        src = ids.clone()
        src[1, 7:] = 0  # right padding (pad_id 0)
        src[2, 3:] = 0
        inputs = {"src": src, "tgt": torch.randint(1, 40, (B, 9))}
    elif arch == "encoder":
        ids[1, 7:] = 0
        inputs = {"ids": ids}
    else:
        is_token = torch.ones(B, 12, dtype=torch.bool)
        is_token[1, :4] = False  # left padding: pad queries see no key (empty rows)
        inputs = {"ids": ids, "is_token": is_token}
    assert _set_backend(model, "reference") > 0
    ref = _logits(model, arch, inputs)
    _set_backend(model, "sdpa")
    fused = _logits(model, arch, inputs)
    assert bool(torch.isfinite(ref).all())
    torch.testing.assert_close(fused, ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("extra", ["documents", "prefix-lm", "sliding-window"])
def test_decoder_mask_variants_same_on_both_backends(position: str, extra: str) -> None:
    model = _model("decoder", position, sliding_window=4 if extra == "sliding-window" else None)
    ids = torch.randint(1, 40, (B, 12))
    inputs: dict[str, Tensor] = {"ids": ids}
    if extra == "documents":
        inputs["doc_ids"] = torch.tensor([[0] * 5 + [1] * 7, [0] * 12, [0, 0, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3]])
        inputs["positions"] = torch.tensor([[*range(5), *range(7)], [*range(12)],
                                            [0, 1, 0, 1, 2, 0, 1, 2, 3, 0, 1, 2]])
    elif extra == "prefix-lm":
        inputs["prefix_len"] = torch.tensor([4, 0, 12])
    _set_backend(model, "reference")
    ref = _logits(model, "decoder", inputs)
    _set_backend(model, "sdpa")
    torch.testing.assert_close(_logits(model, "decoder", inputs), ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("autocast", [False, True])
def test_cpu_low_precision_training_attends_in_float32(dtype: torch.dtype, autocast: bool) -> None:
    """Trained in bf16/fp16 on CPU (a low-precision model, or float32 inputs under autocast), the CPU accelerator's
    kernel for the fused backend (:func:`~aiayn.accel.cpu.functional.cpu_attention_kernel`) attends in float32 (torch's
    CPU flash kernel is far slower in bf16 with a backward) and hands back the low-precision dtype: output and
    gradients equal float32 attention of the same rounded inputs, with a bias and a padding mask. Without gradients
    it keeps the low-precision kernel."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, T, DH, generator=g).to(dtype) for _ in range(3))
    bias = torch.randn(1, H, T, T, generator=g)
    mask = M.padding_mask(_is_token())
    grad_out = torch.randn(B, H, T, DH, generator=g).to(dtype)

    def run(inputs: list[Tensor], autocast: bool) -> tuple[Tensor, list[Tensor]]:
        leaves = [x.clone().requires_grad_() for x in inputs]
        with torch.autocast("cpu", dtype=dtype, enabled=autocast):
            out, _ = scaled_dot_product_attention(*leaves, mask=mask, bias=bias, backend="sdpa",
                                                  kernel=cpu_attention_kernel)
        out.backward(grad_out.to(out.dtype))
        return out, [x.grad for x in leaves]

    got, got_grads = run([q, k, v], autocast)
    ref, ref_grads = run([q.float(), k.float(), v.float()], False)
    assert got.dtype == dtype and all(x.dtype == dtype for x in got_grads)
    torch.testing.assert_close(got, ref.to(dtype), rtol=0, atol=0)  # exactly float32's result, rounded once
    for x, r in zip(got_grads, ref_grads):
        torch.testing.assert_close(x, r.to(dtype), rtol=0, atol=0)
    with torch.no_grad():
        assert scaled_dot_product_attention(q, k, v, mask=mask, bias=bias, backend="sdpa",
                                            kernel=cpu_attention_kernel)[0].dtype == dtype


@pytest.mark.parametrize("arch", ["encoder-decoder", "decoder"])
def test_only_an_accelerated_model_trains_low_precision_attention_in_float32(arch: str,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A bf16 model accelerated for training attends in float32 on the CPU (every attention of a step), the
    reference model in its own dtype through torch's kernel; both train to close losses."""
    seen: list[torch.dtype] = []  # the dtype of every attention the accelerator's kernel serves
    real_fused = cpu_functional.fused_attention
    monkeypatch.setattr(cpu_functional, "fused_attention",
                        lambda q, *a, **kw: seen.append(q.dtype) or real_fused(q, *a, **kw))
    real_short = short_attention.attention
    monkeypatch.setattr(short_attention, "attention",
                        lambda q, *a, **kw: seen.append(q.dtype) or real_short(q, *a, **kw))
    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", arch=arch, vocab_size=40, dropout=0.0)
    reference = build_model(cfg).to(torch.bfloat16).train()
    model = accelerate(build_model(cfg).to(torch.bfloat16).train(), "train", accel="auto")
    model.load_state_dict(reference.state_dict())
    ids = torch.randint(3, 40, (2, 9))
    losses = []
    for net in (reference, model):
        out = net(ids, ids) if arch == "encoder-decoder" else net(ids)
        loss = out.logits.float().square().mean()
        loss.backward()
        losses.append(loss.item())
        if net is reference:
            assert seen == []  # the core's attention: torch's kernel, in bf16
    assert seen and set(seen) == {torch.float32}
    assert losses[1] == pytest.approx(losses[0], rel=2e-2)


def test_a_kernel_gets_grouped_keys_as_they_are() -> None:
    """The kernel seam receives k and v with their Hkv heads (no copy per query head), and its output is the
    reference's."""
    from aiayn.nn.attention import fused_attention, scaled_dot_product_attention

    q, k, v = torch.randn(2, 8, 3, 16), torch.randn(2, 2, 5, 16), torch.randn(2, 2, 5, 16)
    seen = []

    def kernel(q, k, v, *args):
        seen.append(k.shape[1])
        return fused_attention(q, k, v, *args)

    for backend in ("auto", "sdpa"):
        out, _ = scaled_dot_product_attention(q, k, v, backend=backend, kernel=kernel)
        want, _ = scaled_dot_product_attention(q, k, v, backend="reference")
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
    assert seen == [2, 2]
