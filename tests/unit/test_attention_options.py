"""The attention options of ModelConfig: validated, round-tripped, wired into the model as they say (backends equal,
QK-norm, logit soft-capping, sparse patterns), and declined by the CPU accelerator, which then equals the reference."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from aiayn import ModelConfig, build_model
from aiayn import config as C
from aiayn.check import check_accelerated, check_batched, check_cached
from aiayn.errors import AiaynError
from aiayn.nn import flex
from aiayn.nn import masks as M
from aiayn.nn.attention import MultiHeadAttention, scaled_dot_product_attention
from aiayn.nn.norms import RMSNorm

#: every new option away from its default, as a small decoder takes it
OPTIONS = {
    "attention_backend=tiled": dict(attention_backend="tiled"),
    "attention_backend=flex": dict(attention_backend="flex"),
    "attention=linear": dict(attention="linear"),
    "attention_mask=block_sparse": dict(attention_mask="block_sparse", sparse_block=2, sparse_stride=2),
    "attention_mask=local_global": dict(attention_mask="local_global", local_window=3, global_tokens=2),
    "qk_norm": dict(qk_norm=True),
    "attn_logit_softcap": dict(attn_logit_softcap=2.0),
}


@pytest.fixture(autouse=True)
def eager_flex(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flex.SETTINGS, "compile", False)
    warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")


def _tiny(arch: str = "decoder", **kw: object) -> ModelConfig:
    return ModelConfig.preset("tiny", arch=arch, dropout=0.0, **kw)


@pytest.mark.parametrize(("changes", "fragment"), [
    (dict(attention_backend="fast"), "attention_backend='fast': unknown"),
    (dict(attention="performer"), "attention='performer': unknown"),
    (dict(attention_mask="strided"), "attention_mask='strided': unknown"),
    (dict(attention_backend="tiled", attn_dropout=0.1), "has no attention dropout"),
    (dict(attention_mask="local_global", sliding_window=4, arch="decoder"), "already limits each query's keys"),
    (dict(attention="linear", position="alibi"), "position='alibi': attention='linear'"),
    (dict(attention="linear", attention_backend="flex"), "attention_backend='flex': attention='linear'"),
    (dict(attention="linear", attn_logit_softcap=30.0), "attn_logit_softcap=30.0: attention='linear'"),
    (dict(attn_logit_softcap=0.0), "attn_logit_softcap=0.0: must be > 0"),
    (dict(sparse_block=0), "sparse_block=0: must be a whole number >= 1"),
    (dict(global_tokens=-1), "global_tokens=-1: must be a whole number >= 0"),
    (dict(qk_norm="yes"), "qk_norm='yes': must be true or false"),
])
def test_each_attention_rule(changes: dict, fragment: str) -> None:
    with pytest.raises(AiaynError, match="invalid model config") as e:
        ModelConfig(**changes)
    assert fragment in str(e.value)


def test_the_attention_options_default_to_the_model_as_it_was_and_round_trip(tmp_path: Path) -> None:
    config = ModelConfig()
    assert (config.attention_backend, config.attention, config.attention_mask, config.qk_norm,
            config.attn_logit_softcap) == ("auto", "softmax", "dense", False, None)
    changed = _tiny(attention_mask="block_sparse", sparse_block=8, sparse_stride=4, qk_norm=True,
                    attn_logit_softcap=50.0, attention_backend="tiled")
    assert ModelConfig.from_json(changed.to_json(tmp_path / "c.json")) == changed
    assert C.ATTENTION_BACKENDS == ("auto", "reference", "sdpa", "tiled", "flex")


@pytest.mark.parametrize("arch", ["decoder", "encoder-decoder", "encoder"])
def test_every_backend_gives_the_reference_logits_and_gradients(arch: str) -> None:
    """With RoPE, GQA, padding and (in decoders) a sliding window; 1e-5 in fp32."""
    base = _tiny(arch, position="rope", n_kv_heads=2, sliding_window=None if arch == "encoder" else 5)
    ids = torch.randint(3, 64, (2, 11))
    ids[1, 8:] = 0  # padding
    results = {}
    for backend in C.ATTENTION_BACKENDS:
        torch.manual_seed(0)
        model = build_model(base.replace(attention_backend=backend))
        if arch == "encoder":
            out = model(ids, ids != 0, task="mlm").logits
        elif arch == "decoder":
            out = model(ids, is_token=ids != 0).logits
        else:
            out = model(ids, ids[:, :7]).logits
        grads = torch.autograd.grad(out.pow(2).mean(), list(model.parameters()), allow_unused=True)
        results[backend] = (out, grads)
    ref_out, ref_grads = results["reference"]
    for backend, (out, grads) in results.items():
        torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5, msg=backend)
        for g, r in zip(grads, ref_grads):
            if r is not None:
                torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-5, msg=backend)


def test_qk_norm_normalises_each_heads_queries_and_keys_before_attention() -> None:
    mha = MultiHeadAttention(16, 4, 2, qk_norm=True, norm_eps=1e-6)
    assert isinstance(mha.q_norm, RMSNorm) and mha.q_norm.weight.shape == (4,)
    with torch.no_grad():
        mha.q_norm.weight.uniform_(0.5, 2.0)
        mha.k_norm.weight.uniform_(0.5, 2.0)
    x = torch.randn(2, 5, 16)
    q, k, v = mha.qkv_proj(x).split([16, 8, 8], dim=-1)
    q, k, v = (y.view(2, 5, -1, 4).transpose(1, 2) for y in (q, k, v))  # (B, h, T, Dh)

    def rms(y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return y / y.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * w

    ref, _ = scaled_dot_product_attention(rms(q, mha.q_norm.weight), rms(k, mha.k_norm.weight), v, is_causal=True,
                                          backend="reference")
    expected = mha.out_proj(ref.transpose(1, 2).reshape(2, 5, 16))
    torch.testing.assert_close(mha(x, is_causal=True)[0], expected, atol=1e-6, rtol=1e-5)
    cross = MultiHeadAttention(16, 4, cross=True, qk_norm=True)
    k_mem, _ = cross.project_memory(torch.randn(2, 3, 16) * 10)
    torch.testing.assert_close(k_mem.pow(2).mean(-1), torch.ones(2, 4, 3), atol=1e-4, rtol=0)


def test_soft_capping_is_cap_tanh_of_the_scores_on_every_backend() -> None:
    q, k, v = torch.randn(2, 2, 6, 4) * 5, torch.randn(2, 2, 6, 4) * 5, torch.randn(2, 2, 6, 4)
    mask = M.sliding_window_mask(6, 3)
    scores = 2.0 * torch.tanh(q @ k.transpose(-2, -1) / 2 / 2.0)  # scale 1/sqrt(4)
    expected = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1) @ v
    for backend in ("auto", "reference", "sdpa", "tiled", "flex"):
        out, _ = scaled_dot_product_attention(q, k, v, mask=mask, backend=backend, softcap=2.0)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5, msg=backend)
    capped = build_model(_tiny(attn_logit_softcap=1e4))
    torch.manual_seed(0)
    plain = build_model(_tiny())
    capped.load_state_dict(plain.state_dict())
    ids = torch.randint(3, 64, (2, 9))
    torch.testing.assert_close(capped(ids).logits, plain(ids).logits, atol=1e-5, rtol=0)  # a far cap changes nothing


@pytest.mark.parametrize("causal", [True, False], ids=["decoder", "encoder"])
def test_the_sparse_patterns_from_the_config_are_the_masks_of_nn_masks(causal: bool) -> None:
    arch = "decoder" if causal else "encoder"
    stack_of = (lambda m: m.decoder) if causal else (lambda m: m.encoder)
    sparse = build_model(_tiny(arch, attention_mask="block_sparse", sparse_block=3, sparse_local_blocks=2,
                               sparse_stride=3))
    assert torch.equal(stack_of(sparse).pattern_mask(4, 20, "cpu"),
                       M.block_sparse_mask(4, 3, 2, 3, causal=causal, s=20))
    local = build_model(_tiny(arch, attention_mask="local_global", local_window=4, global_tokens=2))
    assert torch.equal(stack_of(local).pattern_mask(20, 20, "cpu"),
                       M.local_global_mask(20, 4, [0, 1], causal=causal))


@pytest.mark.parametrize("name", ["attention_mask=block_sparse", "attention_mask=local_global"])
def test_a_key_outside_the_pattern_changes_nothing(name: str) -> None:
    """One layer: a query's output depends on exactly the keys its pattern row allows."""
    torch.manual_seed(0)
    model = build_model(_tiny("decoder", n_layers=1, position="rope", **OPTIONS[name])).eval()
    allowed = model.decoder.pattern_mask(12, 12, "cpu")
    ids = torch.randint(3, 64, (1, 12))
    base = model(ids).logits[0]
    for j in range(12):
        changed = ids.clone()
        changed[0, j] = 3 + (int(ids[0, j]) - 2) % 60
        moved = (model(changed).logits[0] - base).abs().amax(-1) > 1e-6  # (T,)
        assert torch.equal(moved, allowed[:, j]), j  # query i moves exactly when it may see key j


@pytest.mark.parametrize("name", list(OPTIONS))
@pytest.mark.parametrize("arch", ["decoder", "encoder-decoder"])
def test_each_option_decodes_as_its_full_forward_and_batches_as_single_rows(name: str, arch: str) -> None:
    torch.manual_seed(0)
    model = build_model(_tiny(arch, position="rope", **OPTIONS[name]))
    for row in (check_cached(model, length=9), check_batched(model, length=9)):
        assert row.passed, f"{row.compared}: {row.max_diff:.2e}"


@pytest.mark.parametrize("name", list(OPTIONS))
def test_the_cpu_accelerator_equals_the_reference_for_each_option(name: str) -> None:
    """Every accelerated path (training step, padded logits, cached beam-reordered decoding, greedy choice) equals the
    reference with each option."""
    options = OPTIONS[name]
    config = _tiny("decoder", position="alibi" if name == "attention_mask=local_global" else "rope", **options)
    torch.manual_seed(0)
    failed = [f"{r.compared}: {r.max_diff:.2e}" for r in check_accelerated(build_model(config)) if not r.passed]
    assert not failed, failed


def test_a_sliding_window_model_decodes_with_the_rolling_cache_accelerated_or_not() -> None:
    """The core rolls a sliding window's cache, and so does the accelerated model (its memory is the window's, not
    the decoded length's); every accelerated path equals the reference."""
    from aiayn import accel

    config = _tiny("decoder", position="rope", sliding_window=3)
    torch.manual_seed(0)
    model = build_model(config).eval()
    assert model.new_cache(16).store.capacity == 3
    failed = [f"{r.compared}: {r.max_diff:.2e}" for r in check_accelerated(model) if not r.passed]
    assert not failed, failed
    fast = accel.accelerate(build_model(config).eval(), "decode")
    assert fast.new_cache(16).store.capacity == 3
