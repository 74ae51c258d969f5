"""Linear attention: its chunked, recurrent and non-causal forms equal its quadratic form; a linear-attention model
decodes with a state of constant size and gives the logits of a full forward pass."""

from __future__ import annotations

import pytest
import torch

from aiayn import ModelConfig, build_model
from aiayn.generate.lm import left_pad
from aiayn.nn import masks as M
from aiayn.nn.linear_attention import (
    LinearAttnState,
    LinearDecoderCache,
    attend_linear,
    causal_linear_attention,
    feature_map,
    linear_attention,
    quadratic_linear_attention,
)

TOL = dict(atol=1e-5, rtol=1e-5)
B, H, T, DH = 2, 4, 23, 8


def _qkv(heads_kv: int = H) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.randn(B, H, T, DH), torch.randn(B, heads_kv, T, DH), torch.randn(B, heads_kv, T, DH)


def test_the_feature_map_is_elu_plus_one_and_not_negative() -> None:
    x = torch.tensor([-30.0, -1.0, 0.0, 2.0])
    torch.testing.assert_close(feature_map(x), torch.tensor([torch.exp(torch.tensor(-30.0)).item(),
                                                             torch.exp(torch.tensor(-1.0)).item(), 1.0, 3.0]))
    assert (feature_map(torch.randn(1000) * 3) > 0).all()
    assert (feature_map(torch.randn(1000) * 100) >= 0).all()  # exp(x) rounds to 0 in fp32 far below zero


def test_the_quadratic_form_is_the_normalised_kernel_matrix() -> None:
    q, k, v = _qkv()
    a = feature_map(q) @ feature_map(k).transpose(-2, -1) * M.causal_mask(T)
    torch.testing.assert_close(quadratic_linear_attention(q, k, v, is_causal=True), (a / a.sum(-1, keepdim=True)) @ v)


@pytest.mark.parametrize("chunk", [1, 5, 64], ids=["recurrence", "chunks-of-5", "one-chunk"])
@pytest.mark.parametrize("heads_kv", [H, 2, 1], ids=["mha", "gqa", "mqa"])
def test_causal_forms_equal_the_quadratic_form(chunk: int, heads_kv: int) -> None:
    q, k, v = _qkv(heads_kv)
    is_token = torch.ones(B, T, dtype=torch.bool)
    is_token[1, :6] = False
    ref = quadratic_linear_attention(q, k, v, mask=M.padding_mask(is_token), is_causal=True)
    out, _ = causal_linear_attention(q, k, v, key_mask=is_token, chunk=chunk)
    torch.testing.assert_close(out, ref, **TOL)
    assert (out[1, :, :6] == 0).all()  # rows with no allowed key (padding before the first token): zeros


def test_the_non_causal_form_equals_the_quadratic_form() -> None:
    q, k, v = _qkv(2)
    is_token = torch.rand(B, T) > 0.3
    ref = quadratic_linear_attention(q, k, v, mask=M.padding_mask(is_token))
    torch.testing.assert_close(linear_attention(q, k, v, key_mask=is_token), ref, **TOL)


def test_decoding_as_a_recurrence_keeps_a_constant_state_and_equals_the_quadratic_form() -> None:
    q, k, v = _qkv()
    ref = quadratic_linear_attention(q, k, v, is_causal=True)
    state = LinearAttnState()
    outs = [state.attend(q[:, :, :7], k[:, :, :7], v[:, :, :7])]  # a prompt of 7
    sizes = set()
    for i in range(7, T):
        outs.append(state.attend(q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1]))
        sizes.add(tuple(x.shape for x in state.state))
    torch.testing.assert_close(torch.cat(outs, 2), ref, **TOL)
    assert sizes == {((B, H, DH, DH), (B, H, DH))}


def test_gradients_of_the_chunked_form_equal_the_quadratic_form() -> None:
    q, k, v = (x.requires_grad_() for x in _qkv())
    grads = []
    for fn in (lambda: quadratic_linear_attention(q, k, v, is_causal=True),
               lambda: causal_linear_attention(q, k, v, chunk=5)[0]):
        grads.append(torch.autograd.grad((fn() ** 2).sum(), [q, k, v]))
    for g, r in zip(*grads):
        torch.testing.assert_close(g, r, **TOL)


def test_a_general_mask_takes_the_quadratic_form_and_weights_are_returned() -> None:
    q, k, v = _qkv()
    prefix = M.prefix_lm_mask(T, torch.tensor([5, 9]))
    out, w = attend_linear(q, k, v, mask=prefix, is_causal=False, return_weights=True)
    torch.testing.assert_close(out, quadratic_linear_attention(q, k, v, mask=prefix))
    torch.testing.assert_close(w.sum(-1), torch.ones(B, H, T))
    with pytest.raises(ValueError, match="key padding"):
        attend_linear(q, k, v, mask=prefix, is_causal=False, state=LinearAttnState())


def _model(arch: str, **kw: object) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(ModelConfig.preset("tiny", arch=arch, attention="linear", **kw)).eval()


@pytest.mark.parametrize("kw", [dict(position="rope"), dict(position="learned", n_kv_heads=2, qk_norm=True)],
                         ids=["rope", "learned-gqa-qknorm"])
def test_a_linear_decoder_decodes_with_its_state_and_equals_the_full_forward(kw: dict) -> None:
    model = _model("decoder", **kw)
    ids = torch.randint(3, 64, (2, 12))
    with torch.inference_mode():
        full = model(ids).logits
        cache = model.new_cache(4)
        assert isinstance(cache, LinearDecoderCache)
        chunks = [model(ids[:, :5], cache=cache).logits]
        for t in range(5, ids.shape[1]):
            chunks.append(model(ids[:, t:t + 1], cache=cache).logits)
    torch.testing.assert_close(torch.cat(chunks, 1), full, **TOL)
    assert cache.store.data is None  # no keys or values kept
    assert cache.self_attn[0].state[0].shape == (2, 4, 8, 8)  # (B, H, Dh, Dh) whatever the length


def test_a_left_padded_batch_decodes_as_each_sequence_alone() -> None:
    model = _model("decoder", position="rope")
    seqs = [[1, 5, 6, 7, 8, 9, 10], [1, 12, 13], [1, 20, 21, 22, 23]]
    ids, is_token = left_pad(seqs)
    positions = (is_token.long().cumsum(1) - 1).clamp(min=0)
    with torch.inference_mode():
        cache = model.new_cache(ids.shape[1])
        chunks = [model(ids[:, :4], is_token=is_token[:, :4], positions=positions[:, :4], cache=cache).logits]
        for t in range(4, ids.shape[1]):
            s = slice(t, t + 1)
            chunks.append(model(ids[:, s], is_token=is_token[:, s], positions=positions[:, s], cache=cache).logits)
        cached = torch.cat(chunks, 1)
        for i, seq in enumerate(seqs):
            torch.testing.assert_close(cached[i][is_token[i]], model(torch.tensor([seq])).logits[0], **TOL)


def test_beams_reorder_the_state() -> None:
    model = _model("decoder", position="rope")
    ids = torch.randint(3, 64, (3, 6))
    order = torch.tensor([2, 0, 0])
    with torch.inference_mode():
        cache = model.new_cache(8)
        model(ids[:, :5], cache=cache)
        cache.reorder(order)
        step = model(ids[order, 5:6], cache=cache).logits[:, 0]
        full = model(ids[order]).logits[:, 5]
    torch.testing.assert_close(step, full, **TOL)


def test_a_linear_encoder_decoder_decodes_as_its_full_forward() -> None:
    model = _model("encoder-decoder", position="sinusoidal")
    src = torch.tensor([[5, 6, 7, 8, 9], [10, 11, 12, 0, 0]])
    tgt = torch.randint(3, 64, (2, 7))
    with torch.inference_mode():
        memory, src_is_token, _ = model.encode(src)
        full = model.decode(tgt, memory, src_is_token).logits
        cache = model.new_cache(8)
        chunks = [model.decode(tgt[:, t:t + 1], memory, src_is_token, cache=cache).logits for t in range(7)]
    torch.testing.assert_close(torch.cat(chunks, 1), full, **TOL)
