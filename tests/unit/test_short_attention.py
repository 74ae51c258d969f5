"""CPU training attention over few keys (:mod:`aiayn.accel.cpu.short_attention`): which calls take it (through the
accelerator's attention kernel, :func:`aiayn.accel.cpu.functional.cpu_attention_kernel`), and that a whole accelerated
model trains the same through it as through torch's flash kernel and as the reference model."""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from aiayn import ModelConfig, build_model
from aiayn.accel import accelerate
from aiayn.accel.cpu import short_attention
from aiayn.accel.cpu.functional import cpu_attention_kernel
from aiayn.nn import masks as M
from aiayn.nn.attention import scaled_dot_product_attention as reference_sdpa

#: the core's attention with the CPU accelerator's kernel, as an accelerated model's attention layers call it
scaled_dot_product_attention = functools.partial(reference_sdpa, kernel=cpu_attention_kernel)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(T, S) of every call that took the two-matmul path."""
    seen: list[tuple[int, int]] = []
    real = short_attention.attention

    def spy(q, k, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append((q.shape[-2], k.shape[-2]))
        return real(q, k, *args, **kwargs)

    monkeypatch.setattr(short_attention, "attention", spy)
    return seen


def _qkv(t: int, s: int, grad: bool = True) -> list[torch.Tensor]:
    shapes = [(2, 4, t, 16), (2, 4, s, 16), (2, 4, s, 16)]
    return [torch.randn(shape, requires_grad=grad) for shape in shapes]


def test_cpu_training_over_few_keys_takes_two_matmuls(calls: list[tuple[int, int]]) -> None:
    scaled_dot_product_attention(*_qkv(5, short_attention.MAX_KEYS), is_causal=False)
    scaled_dot_product_attention(*_qkv(7, 7), is_causal=True)
    assert calls == [(5, short_attention.MAX_KEYS), (7, 7)]
    scaled_dot_product_attention(*_qkv(5, short_attention.MAX_KEYS + 1))  # too many keys: torch's kernel
    scaled_dot_product_attention(*_qkv(5, 9, grad=False))  # nothing to train: torch's kernel
    with torch.no_grad():
        scaled_dot_product_attention(*_qkv(5, 9))
    reference_sdpa(*_qkv(5, 9))  # the core's own kernel never takes it
    assert len(calls) == 2


@pytest.mark.parametrize("mask_kind", ["padding", "causal", "cached-causal", "document"])
def test_two_matmuls_equal_torch_kernel_at_training_sizes(mask_kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """At a training-like size (40 keys, head width 32), outputs and all three gradients agree with the flash
    kernel, including a fully padded example (its rows attend nowhere and give zeros)."""
    b, h, t, dh = 3, 4, 40, 32
    s = t + 6 if mask_kind == "cached-causal" else t
    lengths = torch.tensor([s, 17, 0])
    is_causal, mask = False, None
    if mask_kind == "padding":
        mask = M.padding_mask(torch.arange(s)[None, :] < lengths[:, None])
    elif mask_kind == "causal":
        is_causal = True
    elif mask_kind == "cached-causal":
        mask = M.causal_mask(t, s)
    else:
        mask = M.document_mask(torch.arange(t)[None, :].expand(b, t) // 9)
    torch.manual_seed(0)
    q, k, v = torch.randn(b, h, t, dh), torch.randn(b, h, s, dh), torch.randn(b, h, s, dh)
    weight = torch.randn(b, h, t, dh)
    results = {}
    for kernel, max_keys in (("flash", 0), ("two-matmuls", short_attention.MAX_KEYS)):
        monkeypatch.setattr(short_attention, "MAX_KEYS", max_keys)
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
        out, _ = scaled_dot_product_attention(*leaves, mask=mask, is_causal=is_causal)
        (out * weight).sum().backward()
        results[kernel] = [out.detach()] + [x.grad for x in leaves]
    for got, want in zip(results["two-matmuls"], results["flash"], strict=True):
        assert bool(torch.isfinite(got).all())
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_attention_dropout_applies_to_the_weights() -> None:
    q, k, v = _qkv(6, 6)
    out = short_attention.attention(q, k, v, None, None, 1.0, True, 0.25)  # every weight dropped
    assert bool((out == 0).all())
    kept = short_attention.attention(q, k, v, None, None, 0.0, True, 0.25)
    assert bool((kept != 0).any())


@pytest.mark.parametrize("arch", ["encoder-decoder", "decoder"])
def test_a_training_step_matches_the_flash_kernel(arch: str, monkeypatch: pytest.MonkeyPatch,
                                                  calls: list[tuple[int, int]]) -> None:
    """One forward + backward of a small model accelerated for training (padding in the sources, GQA) gives the same
    loss and parameter gradients whichever kernel trains its attention, and the same as the reference model."""
    cfg = ModelConfig.preset("paper-base" if arch == "encoder-decoder" else "gpt2-small", d_model=64, d_ff=128,
                             n_heads=4, n_kv_heads=2, n_layers=2, vocab_size=50, max_len=64, dropout=0.0)
    torch.manual_seed(0)
    reference = build_model(cfg)
    model = accelerate(copy.deepcopy(reference), "train", accel="auto")
    src = torch.randint(4, 50, (3, 11))
    src[1, 7:] = cfg.pad_id
    tgt = torch.randint(4, 50, (3, 9))
    grads = {}
    for kernel, max_keys in (("flash", 0), ("two-matmuls", short_attention.MAX_KEYS), ("reference", None)):
        net = reference if max_keys is None else model
        if max_keys is not None:
            monkeypatch.setattr(short_attention, "MAX_KEYS", max_keys)
        net.zero_grad(set_to_none=True)
        out = net(src, tgt) if arch == "encoder-decoder" else net(tgt)
        out.logits.float().square().mean().backward()
        grads[kernel] = {name: p.grad.clone() for name, p in net.named_parameters() if p.grad is not None}
        assert bool(calls) == (kernel == "two-matmuls")  # every attention of the model: 6 or 2 calls; none else
        calls.clear()
    assert grads["flash"].keys() == grads["two-matmuls"].keys() == grads["reference"].keys() and grads["flash"]
    for name, want in grads["flash"].items():
        torch.testing.assert_close(grads["two-matmuls"][name], want, atol=1e-5, rtol=1e-4, msg=name)
        torch.testing.assert_close(grads["reference"][name], want, atol=1e-5, rtol=1e-4, msg=name)
