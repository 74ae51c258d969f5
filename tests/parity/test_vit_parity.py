"""Parity with Hugging Face transformers' ViT: our encoder with ``input="patches"`` (pre-LN, GELU, CLS token,
learned positions) equals ``ViTModel`` after copying weights, hidden states and pooled output alike.

The reference is built from a tiny random config (never downloaded). Its patch projection is a stride-P ``Conv2d``;
ours is the same weight as a ``Linear`` over flattened patches.
"""

from __future__ import annotations

import pytest
import torch

from aiayn import ModelConfig, build_model

transformers = pytest.importorskip("transformers")
from transformers import ViTConfig, ViTModel  # noqa: E402


def _layers(ref: ViTModel) -> torch.nn.ModuleList:
    """The reference's layers (``layers`` in transformers 5, ``encoder.layer`` before)."""
    return ref.layers if hasattr(ref, "layers") else ref.encoder.layer


def _parts(layer: torch.nn.Module) -> tuple[torch.nn.Linear, ...]:
    """A reference layer's query, key, value, output, FFN-in and FFN-out projections, in either naming."""
    a = layer.attention
    if hasattr(a, "q_proj"):  # transformers 5
        return a.q_proj, a.k_proj, a.v_proj, a.o_proj, layer.mlp.fc1, layer.mlp.fc2
    s = a.attention
    return s.query, s.key, s.value, a.output.dense, layer.intermediate.dense, layer.output.dense


def _copy_into(ours: torch.nn.Module, ref: ViTModel, c: ModelConfig) -> None:
    """The reference's weights, by our names: q, k, v fused into qkv_proj; the Conv2d flattened into a Linear."""
    d, n = c.d_model, c.n_input_positions
    emb = ref.embeddings
    with torch.no_grad():
        ours.patch_embed.cls_token.copy_(emb.cls_token.reshape(d))
        ours.patch_embed.proj.weight.copy_(emb.patch_embeddings.projection.weight.reshape(d, -1))  # (D, C*P*P)
        ours.patch_embed.proj.bias.copy_(emb.patch_embeddings.projection.bias)
        ours.encoder.abs_pos.weight.weight[:n].copy_(emb.position_embeddings[0])  # (N + 1, D)
        for layer, theirs in zip(ours.encoder.layers, _layers(ref), strict=True):
            q, k, v, o, fc1, fc2 = _parts(theirs)
            layer.self_attn.qkv_proj.weight.copy_(torch.cat([q.weight, k.weight, v.weight]))  # (3D, D)
            layer.self_attn.qkv_proj.bias.copy_(torch.cat([q.bias, k.bias, v.bias]))
            pairs = [(layer.self_attn.out_proj, o), (layer.self_res.norm, theirs.layernorm_before),
                     (layer.ffn.w_in, fc1), (layer.ffn.w_out, fc2), (layer.ffn_res.norm, theirs.layernorm_after)]
            for mine, other in pairs:
                mine.weight.copy_(other.weight)
                mine.bias.copy_(other.bias)
        ours.encoder.final_norm.weight.copy_(ref.layernorm.weight)
        ours.encoder.final_norm.bias.copy_(ref.layernorm.bias)
        ours.cls_head.dense.weight.copy_(ref.pooler.dense.weight)
        ours.cls_head.dense.bias.copy_(ref.pooler.dense.bias)


@pytest.mark.parametrize(("image_size", "patch_size", "channels"), [(8, 2, 1), (8, 4, 3)])
def test_vit_equals_hugging_face(image_size: int, patch_size: int, channels: int) -> None:
    torch.manual_seed(0)
    hf = ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                   hidden_act="gelu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, layer_norm_eps=1e-6,
                   image_size=image_size, patch_size=patch_size, num_channels=channels, qkv_bias=True)
    ref = ViTModel(hf, add_pooling_layer=True).eval()
    with torch.no_grad():  # a random, not zero, CLS token and position table
        ref.embeddings.cls_token.normal_()
        ref.embeddings.position_embeddings.normal_()
    c = ModelConfig(arch="encoder", input="patches", image_size=image_size, patch_size=patch_size, channels=channels,
                    n_classes=3, d_model=32, n_heads=4, n_layers=2, d_ff=64, activation="gelu", norm_eps=1e-6,
                    norm_position="pre", position="learned", dropout=0.0, max_len=32)
    ours = build_model(c).eval()
    _copy_into(ours, ref, c)
    images = torch.rand(3, channels, image_size, image_size)
    with torch.no_grad():
        want = ref(pixel_values=images)
        hidden = ours(images, task="hidden").logits  # (B, N + 1, D)
        logits = ours(images, task="classify").logits  # (B, 3)
    torch.testing.assert_close(hidden, want.last_hidden_state, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(logits, ours.cls_head.out(want.pooler_output), rtol=1e-4, atol=1e-5)
