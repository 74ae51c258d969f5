"""The Vision Transformer's front end: patches equal a hand computation and a strided convolution, the stack reads
input embeddings in the place of its token embeddings, an image encoder is batched == single and blind to patch
order without positions, the accelerator declines the input and still equals the reference, and the config checks
the new fields."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from aiayn import accel
from aiayn.config import ModelConfig
from aiayn.errors import AiaynError
from aiayn.models.build import build_model
from aiayn.nn.patches import PatchEmbedding, patchify


def vit_config(**changes: object) -> ModelConfig:
    base = dict(arch="encoder", input="patches", image_size=4, patch_size=2, channels=2, n_classes=3, d_model=16,
                n_heads=2, n_layers=2, d_ff=32, max_len=5, dropout=0.0, position="learned", norm_position="pre")
    return ModelConfig(**{**base, **changes})


def test_patches_equal_a_hand_computation() -> None:
    images = torch.arange(2 * 2 * 4 * 4, dtype=torch.float32).reshape(2, 2, 4, 4)  # (B, C, H, W)
    emb = PatchEmbedding(2, 4, 2, 3, cls_token=False)
    out = emb(images)  # (B, N, D)
    assert out.shape == (2, 4, 3)
    for b in range(2):
        for n, (r, c) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):  # row by row
            patch = images[b, :, 2 * r:2 * r + 2, 2 * c:2 * c + 2].reshape(-1)  # channel, row, column
            assert torch.equal(patchify(images, 2)[b, n], patch)
            torch.testing.assert_close(out[b, n], emb.proj.weight @ patch + emb.proj.bias)


def test_patch_embedding_equals_a_strided_convolution() -> None:
    """The Linear over flattened patches is the Conv2d(kernel = stride = P) that ViT checkpoints store."""
    emb = PatchEmbedding(3, 8, 4, 5, cls_token=False)
    conv = nn.Conv2d(3, 5, kernel_size=4, stride=4)
    with torch.no_grad():
        conv.weight.copy_(emb.proj.weight.reshape(5, 3, 4, 4))
        conv.bias.copy_(emb.proj.bias)
    images = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(emb(images), conv(images).flatten(2).transpose(1, 2))


def test_the_cls_token_comes_first_and_a_wrong_shape_is_named() -> None:
    emb = PatchEmbedding(1, 4, 2, 6)
    out = emb(torch.rand(3, 1, 4, 4))
    assert out.shape == (3, 5, 6)
    assert torch.equal(out[:, 0], emb.cls_token.expand(3, 6))
    with pytest.raises(ValueError, match=r"\(3, 1, 8, 8\).*\(B, 1, 4, 4\)"):
        emb(torch.rand(3, 1, 8, 8))


def test_the_stack_reads_input_embeddings_in_place_of_its_token_embeddings() -> None:
    """``embeds = embed(ids) * embed_scale`` gives the stack's own output: positions, norms and masks are made in
    one place whatever the input."""
    model = build_model(ModelConfig(arch="encoder", vocab_size=20, d_model=16, n_heads=2, n_layers=2, d_ff=32,
                                    max_len=16, dropout=0.0, embedding_norm=True)).eval()
    ids = torch.randint(5, 20, (2, 7))
    stack = model.encoder
    want, _ = stack(ids, is_token=torch.ones_like(ids, dtype=torch.bool))
    got, _ = stack(None, embeds=stack.embed(ids) * stack.embed_scale)
    torch.testing.assert_close(got, want)


def test_an_image_encoder_is_batched_equal_single() -> None:
    model = build_model(vit_config()).eval()
    images = torch.rand(4, 2, 4, 4)
    with torch.no_grad():
        batched = model(images, task="classify").logits  # (B, n_classes)
        single = torch.cat([model(images[i:i + 1], task="classify").logits for i in range(4)])
    torch.testing.assert_close(batched, single, rtol=1e-5, atol=1e-6)
    assert model.embed is None and model.mlm_head is None and model.patch_embed.cls_token is not None
    with pytest.raises(ValueError, match="no masked-LM head"):
        model(images)


def test_without_positions_mean_pooling_ignores_the_order_of_patches() -> None:
    """Attention is permutation equivariant: with no positions, moving whole patches around leaves a mean-pooled
    classifier's output unchanged (the theorem that makes positions necessary for images too)."""
    model = build_model(vit_config(position="none", pooling="mean", max_len=4)).eval()
    images = torch.rand(2, 2, 4, 4)
    swapped = images.clone()
    swapped[..., :2, :2], swapped[..., 2:, 2:] = images[..., 2:, 2:], images[..., :2, :2]  # patches 0 and 3
    with torch.no_grad():
        torch.testing.assert_close(model(swapped, task="classify").logits, model(images, task="classify").logits)
    learned = build_model(vit_config(pooling="mean", max_len=4)).eval()
    with torch.no_grad():
        assert not torch.allclose(learned(swapped, task="classify").logits, learned(images, task="classify").logits)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_the_accelerated_vision_model_equals_the_reference(pooling: str) -> None:
    config = vit_config(pooling=pooling, max_len=5 if pooling == "cls" else 4)
    reference = build_model(config)
    images, labels = torch.rand(3, 2, 4, 4), torch.tensor([0, 2, 1])

    def loss_and_grads(model: nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(images, task="classify").logits, labels)
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    trained = accel.accelerate(copy.deepcopy(reference), "train", "auto")
    ref_loss, ref_grads = loss_and_grads(reference)
    loss, grads = loss_and_grads(trained)
    torch.testing.assert_close(loss, ref_loss)
    assert grads.keys() == ref_grads.keys()
    for name, g in ref_grads.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-4, atol=1e-5)
    decoding = accel.accelerate(copy.deepcopy(reference).eval(), "decode", "auto")
    assert "MultiHeadAttention.attention_kernel=cpu_attention_kernel" in accel.describe(decoding)  # the kernels run
    with torch.inference_mode():
        torch.testing.assert_close(decoding(images, task="classify").logits,
                                   reference.eval()(images, task="classify").logits, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("changes", "fragment"), [
    (dict(arch="decoder"), "input='patches': images feed an encoder"),
    (dict(n_classes=None), "set n_classes"),
    (dict(patch_size=3), "patch_size=3: does not divide image_size=4; choose one of 1, 2, 4"),
    (dict(max_len=4), "max_len=4: an image takes 5 positions (4 patches + CLS); set max_len >= 5"),
    (dict(channels=0), "channels=0: must be a whole number >= 1"),
    (dict(n_token_types=2), "n_token_types=2: applies to token input"),
    (dict(input="pixels"), "input='pixels': unknown; choose one of tokens, patches"),
])
def test_each_image_rule(changes: dict, fragment: str) -> None:
    with pytest.raises(AiaynError) as e:
        vit_config(**changes)
    assert fragment in str(e.value)


def test_image_fields_round_trip_and_default_to_token_input(tmp_path: Path) -> None:
    config = vit_config()
    path = tmp_path / "config.json"
    config.to_json(path)
    assert ModelConfig.from_json(path) == config and config.n_patches == 4 and config.n_input_positions == 5
    old = {k: v for k, v in ModelConfig(arch="encoder").to_dict().items()
           if k not in ("input", "image_size", "patch_size", "channels")}
    path.write_text(json.dumps(old), encoding="utf-8")
    assert ModelConfig.from_json(path).input == "tokens"
    assert ModelConfig(arch="encoder", patch_size=5).input == "tokens"  # image sizes are read only with patches


def test_aiayn_check_names_what_it_cannot_feed_an_image_model() -> None:
    from aiayn.check import run_checks

    with pytest.raises(AiaynError, match="reads images"):
        run_checks(build_model(vit_config()), resume=False)


def test_an_image_encoder_on_each_device_equals_the_cpu(device: str) -> None:
    """On CUDA too (run where a GPU is present): the stack's accelerated substitute passes the patches through."""
    model = build_model(vit_config()).eval()
    images = torch.rand(3, 2, 4, 4)
    with torch.no_grad():
        want = model(images, task="classify").logits
        moved = accel.accelerate(copy.deepcopy(model).to(device), "decode", "auto")
        got = moved(images.to(device), task="classify").logits.cpu()
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4)
