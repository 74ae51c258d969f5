"""LoRA in the core's linear layers: an adapted model starts as its base, only the adapters (and named parameters)
train, merging gives the same model, and the accelerator leaves the adapted model's results as they are."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aiayn import ModelConfig, build_model
from aiayn.accel import accelerate
from aiayn.nn.lora import LoRALinear, add_lora, lora_layers, lora_state, merge_lora, target_names


def _model(arch: str = "decoder") -> nn.Module:
    torch.manual_seed(0)
    extra = dict(n_classes=3) if arch == "encoder" else {}
    return build_model(ModelConfig.preset("tiny", arch=arch, vocab_size=50, dropout=0.0, **extra)).eval()


def _ids() -> torch.Tensor:
    return torch.randint(3, 50, (2, 7), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("arch", ["decoder", "encoder", "encoder-decoder"])
def test_an_adapted_model_starts_as_its_base_and_trains_only_its_adapters(arch: str) -> None:
    model = _model(arch)
    ids = _ids()
    args = (ids, ids) if arch == "encoder-decoder" else (ids,)
    with torch.no_grad():
        before = model(*args).logits
    names = add_lora(model, rank=4, alpha=8, targets=["attention", "ffn"])
    assert names and all(isinstance(model.get_submodule(n), LoRALinear) for n in names)
    with torch.no_grad():
        assert torch.equal(model(*args).logits, before)  # B starts at zero
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == set(lora_state(model)) and trainable
    base = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model.train()
    for _ in range(2):
        opt.zero_grad()
        model(*args).logits.square().mean().backward()
        opt.step()
    assert all(torch.equal(p, base[n]) for n, p in model.named_parameters() if n in base)
    assert any(layer.lora_B.weight.abs().sum() > 0 for layer in lora_layers(model).values())


def test_merging_gives_the_same_logits_and_plain_layers() -> None:
    model = _model()
    add_lora(model, rank=2, alpha=4, targets=["attention", "ffn", "output"])
    with torch.no_grad():
        for layer in lora_layers(model).values():
            layer.lora_B.weight.normal_(0.0, 0.2)
        want = model(_ids()).logits
        merged = merge_lora(model)
        assert not lora_layers(merged)
        assert all(type(m) is not LoRALinear for m in merged.modules())
        torch.testing.assert_close(merged(_ids()).logits, want, atol=1e-5, rtol=1e-5)


def test_targets_by_group_name_or_pattern_and_a_task_head_that_trains() -> None:
    model = _model("encoder")
    assert target_names(model, ["qkv_proj"]) == [n for n in target_names(model, ["attention"]) if "qkv" in n]
    assert target_names(model, [r"encoder\.layers\.0\..*"]) and all(
        n.startswith("encoder.layers.0.") for n in target_names(model, [r"encoder\.layers\.0\..*"]))
    add_lora(model, targets=["attention"], trainable=["cls_head"])
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert any(n.startswith("cls_head") for n in trainable) and set(lora_state(model)) <= trainable
    with pytest.raises(ValueError, match="a LoRA rank must be at least 1"):
        LoRALinear(nn.Linear(4, 4), 0, 1.0)


def test_the_accelerated_adapted_model_equals_the_reference() -> None:
    reference = _model()
    add_lora(reference, rank=4, alpha=8, targets=["attention", "ffn"])
    with torch.no_grad():
        for layer in lora_layers(reference).values():
            layer.lora_B.weight.normal_(0.0, 0.2)
    fast = _model()
    add_lora(fast, rank=4, alpha=8, targets=["attention", "ffn"])
    fast.load_state_dict(reference.state_dict())
    fast = accelerate(fast, "train", accel="auto")
    ids = _ids()
    reference.train()
    fast.train()
    want = reference(ids).logits
    got = fast(ids).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    want.square().mean().backward()
    got.square().mean().backward()
    ra = dict(reference.named_parameters())
    for name, p in fast.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(p.grad, ra[name].grad, atol=1e-4, rtol=1e-4)
