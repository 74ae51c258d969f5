"""Tied embeddings return sparse gradients (aiayn.nn.embedding_grads): the same gradients as dense embeddings, a
dense ``.grad`` always, and training steps, accumulation and copies that behave as before."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from aiayn import ModelConfig, build_model
from aiayn.nn.embedding_grads import sparse_tied_embedding_grads
from aiayn.train.fused_loss import linear_label_smoothed_nll


def _pair(arch: str, **kw: object) -> tuple[nn.Module, nn.Module]:
    """(model as built, the same model with every embedding dense again)."""
    torch.manual_seed(0)
    model = build_model(ModelConfig.preset("tiny", arch=arch, vocab_size=300, dropout=0.0, **kw)).train()
    dense = copy.deepcopy(model)
    for m in dense.modules():
        if isinstance(m, nn.Embedding):
            m.sparse = False
    return model, dense


def _loss(model: nn.Module, arch: str, ids: torch.Tensor, fused: bool) -> torch.Tensor:
    if arch == "encoder-decoder":
        out = model(ids, ids[:, :-1], compute_logits=not fused)
    elif arch == "decoder":
        out = model(ids[:, :-1], compute_logits=not fused)
    else:
        out = model(ids[:, :-1], task="hidden" if fused else "mlm")
    if fused:
        return linear_label_smoothed_nll(out.hidden if arch != "encoder" else out.logits,
                                         _head_weight(model), ids[:, 1:], 0.1)[0]
    return F.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]), ids[:, 1:].reshape(-1))


def _head_weight(model: nn.Module) -> torch.Tensor:
    return model.mlm_head.decoder.proj.weight if hasattr(model, "mlm_head") else model.lm_head.proj.weight


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("arch", ["encoder-decoder", "decoder"])
@pytest.mark.parametrize("fused", [True, False])
def test_tied_embeddings_give_the_dense_gradients(arch: str, fused: bool) -> None:
    model, dense = _pair(arch)
    tied = [m for m in model.modules() if isinstance(m, nn.Embedding) and m.weight is _head_weight(model)]
    assert tied and all(m.sparse for m in tied)
    ids = torch.randint(3, 300, (4, 12))
    ids[0, 8:] = 0  # padding rows are excluded from the embedding gradient either way
    _loss(model, arch, ids, fused).backward()
    _loss(dense, arch, ids, fused).backward()
    got, want = _grads(model), _grads(dense)
    assert got.keys() == want.keys()
    for name in want:
        assert not got[name].is_sparse and got[name].layout == torch.strided
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-7, msg=name)


def test_untied_embeddings_stay_dense_and_a_head_left_unused_still_gives_a_dense_grad() -> None:
    model, dense = _pair("encoder-decoder", share_src_tgt_embeddings=False, tgt_vocab_size=300)
    assert not model.src_embed.sparse and model.tgt_embed.sparse
    # a classifier fine-tuned on an encoder whose (tied) masked-LM head this loss does not use
    enc, enc_dense = _pair("encoder", n_classes=3)
    assert enc.embed.sparse
    ids = torch.randint(3, 300, (4, 10))
    for m in (enc, enc_dense):
        F.cross_entropy(m(ids, task="classify").logits, torch.tensor([0, 1, 2, 1])).backward()
    assert enc.embed.weight.grad.layout == torch.strided
    torch.testing.assert_close(enc.embed.weight.grad, enc_dense.embed.weight.grad)


def test_adam_steps_accumulation_and_copies_match_dense_training() -> None:
    model, dense = _pair("decoder")
    opts = [torch.optim.Adam(m.parameters(), lr=1e-3) for m in (model, dense)]
    batches = [torch.randint(3, 300, (3, 10)) for _ in range(4)]
    for step in range(2):  # two micro-batches accumulated into one step, twice
        for m, opt in zip((model, dense), opts):
            for ids in batches[2 * step:2 * step + 2]:
                _loss(m, "decoder", ids, fused=True).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    for a, b in zip(model.parameters(), dense.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # copies keep the behaviour, and calling it again adds no second hook
    twin = sparse_tied_embedding_grads(copy.deepcopy(model))
    _loss(twin, "decoder", batches[0], fused=False).backward()
    assert twin.embed.sparse and twin.embed.weight.grad.layout == torch.strided
