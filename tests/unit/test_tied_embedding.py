"""Row-sparse lookup gradients for a tied embedding (aiayn.nn.tied_embedding): the same gradients as dense lookups,
always a dense ``.grad``, and the sparse parts added into the projection's gradient in place."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from aiayn import ModelConfig, build_model
from aiayn.nn import tied_embedding
from aiayn.train.fused_loss import linear_label_smoothed_nll

V, PAD = 50, 0


def model_and_batch(arch: str = "encoder-decoder", **kw):
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch=arch, vocab_size=V, d_model=32, n_heads=4, d_ff=64, n_layers=2,
                                    dropout=0.1, pad_id=PAD, **kw)).train()
    g = torch.Generator().manual_seed(1)
    src = torch.randint(3, V, (3, 7), generator=g)
    src[0, 4:] = PAD  # padded source rows: the pad row's lookups give no gradient
    tgt = torch.randint(3, V, (3, 6), generator=g)
    labels = torch.randint(3, V, (3, 6), generator=g)
    labels[1, 4:] = -100
    inputs = (src, tgt) if arch == "encoder-decoder" else (tgt,)
    return model, inputs, labels


def loss_of(model, inputs, labels, path: str) -> torch.Tensor:
    """The loss by one of the ways callers project: the fused loss with the returned output weight (the trainer),
    the fused loss with the parameter itself, or the model's logits."""
    torch.manual_seed(2)  # the same dropout masks every call
    if path == "fused":
        out = model(*inputs, compute_logits=False, output_weight=True)
        return linear_label_smoothed_nll(out.hidden, out.output_weight, labels, 0.1)[0]
    if path == "fused-parameter":
        out = model(*inputs, compute_logits=False)
        return linear_label_smoothed_nll(out.hidden, model.lm_head.proj.weight, labels, 0.1)[0]
    logits = model(*inputs).logits
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, label_smoothing=0.1,
                           reduction="sum")


def grads(model) -> dict[str, torch.Tensor]:
    out = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def dense_reference(model, inputs, labels, path: str, monkeypatch) -> dict[str, torch.Tensor]:
    with monkeypatch.context() as m:
        m.setattr(tied_embedding, "applies", lambda weight: False)
        loss_of(model, inputs, labels, path).backward()
    return grads(model)


@pytest.mark.parametrize("path", ["fused", "fused-parameter", "logits"])
@pytest.mark.parametrize("arch,kw", [("encoder-decoder", {}), ("decoder", {}),
                                     ("encoder-decoder", {"share_src_tgt_embeddings": False}),
                                     ("encoder-decoder", {"tie_embeddings": False})])
def test_same_gradients_as_dense_lookups(arch, kw, path, monkeypatch) -> None:
    model, inputs, labels = model_and_batch(arch, **kw)
    ref = dense_reference(model, inputs, labels, path, monkeypatch)
    loss_of(model, inputs, labels, path).backward()
    for name, p in model.named_parameters():
        assert p.grad.layout == torch.strided, name
        torch.testing.assert_close(p.grad, ref[name], rtol=1e-5, atol=1e-6, msg=name)
    weight = model.lm_head.proj.weight
    if weight.grad is not None and model.config.tie_embeddings:
        assert weight.grad[PAD].abs().sum() > 0  # the projection still trains the pad row ...
    emb = model.src_embed if arch == "encoder-decoder" else model.embed
    assert emb.weight.grad.shape == (V, 32)


def test_sparse_lookups_are_added_into_the_projection_gradient_in_place() -> None:
    """No dense (V, D) zero-filled gradient per lookup and no out-of-place (V, D) sum: the engine runs the late
    identity after the lookups, so the dense gradient arrives last (this is what the speed rests on)."""
    model, inputs, labels = model_and_batch()
    loss = loss_of(model, inputs, labels, "fused")
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        loss.backward()
    ops = [(e.key, e.input_shapes) for e in prof.key_averages(group_by_input_shape=True)]
    names = {name for name, _ in ops}
    assert "aten::embedding_dense_backward" not in names
    assert "aten::embedding_sparse_backward" in names
    vd = [V, 32]
    assert any(name == "aten::add_" and shapes[:2] == [vd, vd] for name, shapes in ops)
    # the only out-of-place (V, D) add is the two sparse lookups' sum (and add_'s own out= call)
    dense_out_of_place = [shapes for name, shapes in ops if name == "aten::add" and shapes[:2] == [vd, vd]
                          and len(shapes) < 4]
    assert len(dense_out_of_place) <= 1
    assert model.lm_head.proj.weight.grad.layout == torch.strided
    assert not model.src_embed.sparse  # set for the lookups only


def test_an_unused_output_weight_still_leaves_a_dense_gradient(monkeypatch) -> None:
    """A caller that asks for the output weight and then does not project with it: only the lookups' sparse
    gradients reach the weight, and the hook makes ``.grad`` dense (also on a deep copy of the model)."""
    model, inputs, _ = model_and_batch()
    for m in (model, copy.deepcopy(model)):
        with monkeypatch.context() as patch:
            patch.setattr(tied_embedding, "applies", lambda weight: False)
            torch.manual_seed(2)
            m(*inputs, compute_logits=False).hidden.square().sum().backward()
        ref = m.src_embed.weight.grad.clone()
        m.zero_grad(set_to_none=True)
        torch.manual_seed(2)
        out = m(*inputs, compute_logits=False, output_weight=True)
        out.hidden.square().sum().backward()
        assert m.src_embed.weight.grad.layout == torch.strided
        torch.testing.assert_close(m.src_embed.weight.grad, ref, rtol=1e-5, atol=1e-6)
        m.zero_grad(set_to_none=True)


def test_gradient_accumulation_sums_micro_batches(monkeypatch) -> None:
    model, inputs, labels = model_and_batch()
    for _ in range(2):
        with monkeypatch.context() as m:
            m.setattr(tied_embedding, "applies", lambda weight: False)
            loss_of(model, inputs, labels, "fused").backward()
    ref = grads(model)
    for _ in range(2):
        loss_of(model, inputs, labels, "fused").backward()
    weight = model.lm_head.proj.weight
    assert weight.grad.layout == torch.strided
    torch.testing.assert_close(weight.grad, ref["src_embed.weight"], rtol=1e-5, atol=1e-6)


def test_dense_lookups_without_autograd_or_off_the_cpu() -> None:
    model, inputs, _ = model_and_batch()
    weight = model.lm_head.proj.weight
    with torch.no_grad():
        assert tied_embedding.plan(weight, (model.src_embed,)) == (None, [False])
        assert model(*inputs, compute_logits=False, output_weight=True).output_weight is weight
    assert tied_embedding.plan(weight, (model.src_embed,))[1] == [True]
    assert tied_embedding.plan(weight, (torch.nn.Embedding(V, 32),)) == (None, [False])
    assert not tied_embedding.applies(torch.zeros(2, 2, device="meta", requires_grad=True))
    assert model(*inputs).output_weight is None  # only when asked for


def test_mixed_precision_gradients_match(monkeypatch) -> None:
    model, inputs, labels = model_and_batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = dense_reference(model, inputs, labels, "fused", monkeypatch)
        loss_of(model, inputs, labels, "fused").backward()
    weight = model.lm_head.proj.weight
    assert weight.grad.dtype == torch.float32 and weight.grad.layout == torch.strided
    torch.testing.assert_close(weight.grad, ref["src_embed.weight"], rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("through", ["model", "task"])
def test_an_encoder_mlm_head_gets_the_same_gradients(through, monkeypatch) -> None:
    """BERT-style: the masked-LM head's projection tied to the embedding, applied by the model (task="mlm") or by
    the caller on the masked positions with the returned output weight (as the MLM task does)."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="encoder", vocab_size=V, d_model=32, n_heads=4, d_ff=64, n_layers=2,
                                    dropout=0.1, pad_id=PAD)).train()
    ids = torch.randint(3, V, (3, 7), generator=torch.Generator().manual_seed(1))
    ids[0, 5:] = PAD
    chosen = torch.zeros_like(ids, dtype=torch.bool)
    chosen[:, 2] = chosen[1, 4] = True

    def loss() -> torch.Tensor:
        torch.manual_seed(2)
        if through == "model":
            logits = model(ids).logits[chosen]
        else:
            out = model(ids, task="hidden", output_weight=True)
            logits = model.mlm_head(out.hidden[chosen], out.output_weight)
        return logits.log_softmax(-1)[:, 5].sum()

    with monkeypatch.context() as m:
        m.setattr(tied_embedding, "applies", lambda weight: False)
        loss().backward()
    ref = grads(model)
    loss().backward()
    assert model.embed.weight.grad.layout == torch.strided
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref[name], rtol=1e-5, atol=1e-6, msg=name)
