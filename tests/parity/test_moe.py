"""Mixture-of-experts feed-forward layers: held equal to Hugging Face's Mixtral block and model, to the Switch
Transformer's capacity and load-balancing loss worked by hand, and to the model-wide guarantees (cached == full,
batched == single, accelerated == reference, a permutation of the tokens permutes the output)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from aiayn import ModelConfig, build_model
from aiayn.check import check_accelerated, check_batched, check_cached
from aiayn.nn.moe import MoEFeedForward, moe_load_stats, moe_loss

ATOL = 1e-5
V, D, H, FF, L, E = 50, 32, 4, 48, 2, 4  # vocabulary, width, heads, expert width, layers, experts


def _moe(top_k: int = 2, activation: str = "swiglu", capacity: float | None = None, n_experts: int = E,
         seed: int = 0) -> MoEFeedForward:
    torch.manual_seed(seed)
    moe = MoEFeedForward(D, FF, n_experts, top_k, capacity, activation, bias=activation != "swiglu")
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0.0, 0.3)
    return moe.eval()


def _by_loop(moe: MoEFeedForward, x: Tensor) -> Tensor:
    """The layer written token by token: sum over the top k of weight * expert(token)."""
    flat = x.reshape(-1, D)
    out = torch.zeros_like(flat)
    for t in range(flat.shape[0]):
        probs = torch.softmax(moe.router(flat[t]).float(), dim=-1)
        w, idx = probs.topk(moe.top_k)
        if moe.top_k > 1:
            w = w / w.sum()
        for j in range(moe.top_k):
            out[t] += w[j] * moe.experts[int(idx[j])](flat[t][None])[0]
    return out.reshape(x.shape)


# ---------------------------------------------------------------------------------------------- the layer itself
@pytest.mark.parametrize("top_k,activation", [(1, "relu"), (2, "swiglu"), (2, "geglu"), (3, "gelu")])
def test_dropless_dispatch_equals_the_layer_written_token_by_token(top_k: int, activation: str) -> None:
    moe = _moe(top_k, activation)
    x = torch.randn(3, 7, D)
    with torch.no_grad():
        torch.testing.assert_close(moe(x), _by_loop(moe, x), atol=ATOL, rtol=0)


def test_permuting_the_tokens_permutes_the_output() -> None:
    moe = _moe(2)
    x = torch.randn(1, 20, D)
    perm = torch.randperm(20)
    with torch.no_grad():
        y = moe(x)
        torch.testing.assert_close(moe(x[:, perm]), y[:, perm], atol=ATOL, rtol=0)
        torch.testing.assert_close(moe(x.reshape(4, 5, D)), y.reshape(4, 5, D), atol=ATOL, rtol=0)


def test_gradients_reach_the_router_and_the_chosen_experts_only() -> None:
    moe = _moe(1, "relu", n_experts=6).train()
    x = torch.randn(1, 3, D)
    moe(x).sum().backward()
    chosen = set(moe.router_logits.argmax(-1).tolist())
    assert moe.router.weight.grad is not None and moe.router.weight.grad.abs().sum() > 0
    for i, expert in enumerate(moe.experts):
        assert (expert.w_in.weight.grad is not None) == (i in chosen)


def test_switch_top1_capacity_drops_the_tokens_beyond_it_by_hand() -> None:
    """Two experts, six tokens, capacity factor 1: capacity ceil(1 * 1 * 6 / 2) = 3. Tokens 0-4 prefer expert 0 and
    token 5 expert 1, so expert 0 takes tokens 0, 1, 2 (the earliest), tokens 3 and 4 get zeros, token 5 goes through
    expert 1; each output is weighted by its softmax probability (Switch), not renormalised to 1."""
    moe = _moe(1, "relu", capacity=1.0, n_experts=2).train()
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[0, 0], moe.router.weight[1, 0] = 1.0, -1.0
    x = torch.randn(1, 6, D)
    x[0, :5, 0] = torch.tensor([0.5, 1.0, 1.5, 2.0, 2.5])
    x[0, 5, 0] = -1.0
    assert moe.capacity(6) == 3
    with torch.no_grad():
        y = moe(x)[0]
        p0 = torch.sigmoid(2 * x[0, :, 0])  # softmax([a, -a])[0]
        for t in (0, 1, 2):
            torch.testing.assert_close(y[t], p0[t] * moe.experts[0](x[0, t]), atol=ATOL, rtol=0)
        assert torch.equal(y[3], torch.zeros(D)) and torch.equal(y[4], torch.zeros(D))
        torch.testing.assert_close(y[5], (1 - p0[5]) * moe.experts[1](x[0, 5]), atol=ATOL, rtol=0)
    torch.testing.assert_close(moe.load, torch.tensor([5 / 6, 1 / 6]))  # the router's choice, before capacity
    with torch.no_grad():  # inference is dropless: every token gets its expert
        y = moe.eval()(x)[0]
        torch.testing.assert_close(y[3], p0[3] * moe.experts[0](x[0, 3]), atol=ATOL, rtol=0)
        moe.train().capacity_factor = 2.0  # capacity 6: nothing dropped in training either
        torch.testing.assert_close(moe(x)[0], y, atol=ATOL, rtol=0)


def test_top2_capacity_serves_first_choices_before_second_choices() -> None:
    """Four tokens, two experts, top 2, capacity ceil(0.5 * 2 * 4 / 2) = 2 each. Tokens 0 and 2 prefer expert 0,
    tokens 1 and 3 expert 1: the first choices fill both experts, so every second choice is dropped, whatever the
    token order."""
    moe = _moe(2, "relu", capacity=0.5, n_experts=2).train()
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[0, 0], moe.router.weight[1, 0] = 1.0, -1.0
    x = torch.randn(1, 4, D)
    x[0, :, 0] = torch.tensor([1.0, -1.0, 2.0, -2.0])
    assert moe.capacity(4) == 2
    with torch.no_grad():
        y = moe(x)[0]
        probs = torch.softmax(moe.router(x[0]).float(), dim=-1)  # renormalised top-2 of two experts: the probs
        for t, first in enumerate((0, 1, 0, 1)):
            torch.testing.assert_close(y[t], probs[t, first] * moe.experts[first](x[0, t]), atol=ATOL, rtol=0)


def test_the_load_balancing_loss_is_the_switch_formula_by_hand() -> None:
    """aux = N * sum_i f_i P_i: f_i the fraction of tokens sent to expert i, P_i the mean router probability."""
    moe = _moe(1, "relu", n_experts=E)
    x = torch.randn(2, 9, D)
    with torch.no_grad():
        moe(x)
    logits = moe.router_logits
    n = logits.shape[0]
    probs = torch.softmax(logits, dim=-1)
    choice = logits.argmax(-1).tolist()
    f = [sum(1 for c in choice if c == i) / n for i in range(E)]
    p = [float(probs[:, i].sum()) / n for i in range(E)]
    assert float(moe.aux_loss) == pytest.approx(E * sum(fi * pi for fi, pi in zip(f, p)), rel=1e-6)
    z = sum(math.log(sum(math.exp(v) for v in row)) ** 2 for row in logits.tolist()) / n
    assert float(moe.z_loss) == pytest.approx(z, rel=1e-6)
    assert moe.load.tolist() == pytest.approx(f)
    uniform = _moe(1, "relu", n_experts=E)
    with torch.no_grad():
        uniform.router.weight.zero_()
        uniform(x)
    assert float(uniform.aux_loss) == pytest.approx(1.0)  # balanced routing: the loss's minimum


# ---------------------------------------------------------------------------------------------- Mixtral
transformers = pytest.importorskip("transformers")
from transformers import MixtralConfig, MixtralForCausalLM  # noqa: E402
from transformers.models.mixtral.modeling_mixtral import (  # noqa: E402
    MixtralSparseMoeBlock,
    load_balancing_loss_func,
)


def _mixtral_config(**kw: Any) -> MixtralConfig:
    cfg = MixtralConfig(vocab_size=V, hidden_size=D, intermediate_size=FF, num_hidden_layers=L, num_attention_heads=H,
                        num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6,
                        tie_word_embeddings=False, num_local_experts=E, num_experts_per_tok=2,
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **kw)
    cfg._attn_implementation = "eager"
    return cfg


def _randomize(module: nn.Module, std: float = 0.2) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, std)


@torch.no_grad()
def _copy_block(ours: MoEFeedForward, ref: MixtralSparseMoeBlock) -> None:
    ours.router.weight.copy_(ref.gate.weight)
    for i, expert in enumerate(ours.experts):
        expert.w_in.weight.copy_(ref.experts.gate_up_proj[i])  # (2 FF, D): gate rows, then up rows
        expert.w_out.weight.copy_(ref.experts.down_proj[i])  # (D, FF)


def test_matches_mixtral_sparse_moe_block_with_router_logits_and_aux_loss() -> None:
    ref = MixtralSparseMoeBlock(_mixtral_config()).eval()
    _randomize(ref, 0.3)
    ours = MoEFeedForward(D, FF, E, 2, None, "swiglu", bias=False).eval()
    _copy_block(ours, ref)
    x = torch.randn(2, 11, D)
    with torch.no_grad():
        want = ref(x)
        want_logits = ref.gate(x.reshape(-1, D))[0]
        torch.testing.assert_close(ours(x), want, atol=ATOL, rtol=0)
    torch.testing.assert_close(ours.router_logits, want_logits, atol=ATOL, rtol=0)
    want_aux = load_balancing_loss_func((want_logits,), E, 2)
    torch.testing.assert_close(ours.aux_loss, want_aux, atol=1e-6, rtol=0)


def test_a_tiny_mixtral_model_matches() -> None:
    ref = MixtralForCausalLM(_mixtral_config()).eval()
    _randomize(ref)
    ours = build_model(ModelConfig.preset("llama", vocab_size=V, d_model=D, n_heads=H, n_layers=L, d_ff=FF, max_len=64,
                                          dropout=0.0, n_kv_heads=2, ffn="moe", n_experts=E, moe_top_k=2)).eval()
    with torch.no_grad():
        ours.embed.weight.copy_(ref.model.embed_tokens.weight)
        ours.lm_head.proj.weight.copy_(ref.lm_head.weight)
        ours.decoder.final_norm.weight.copy_(ref.model.norm.weight)
        for mine, lay in zip(ours.decoder.layers, ref.model.layers, strict=True):
            a = lay.self_attn
            mine.self_attn.qkv_proj.weight.copy_(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
            mine.self_attn.out_proj.weight.copy_(a.o_proj.weight)
            mine.self_res.norm.weight.copy_(lay.input_layernorm.weight)
            mine.ffn_res.norm.weight.copy_(lay.post_attention_layernorm.weight)
            _copy_block(mine.ffn, lay.mlp)
    ids = torch.randint(0, V, (2, 13))
    with torch.no_grad():
        out = ref(input_ids=ids, output_router_logits=True)
        torch.testing.assert_close(ours(ids).logits, out.logits, atol=ATOL, rtol=0)
    for mine, want in zip(ours.decoder.layers, out.router_logits, strict=True):
        torch.testing.assert_close(mine.ffn.router_logits, want, atol=ATOL, rtol=0)


# ---------------------------------------------------------------------------------------------- in a model
def _model(arch: str = "decoder", **kw: Any) -> nn.Module:
    torch.manual_seed(0)
    config = ModelConfig.preset("tiny", arch=arch, ffn="moe", n_experts=E, **kw)
    return build_model(config).eval()


@pytest.mark.parametrize("arch,kw", [("decoder", dict(moe_top_k=2, activation="swiglu", position="rope")),
                                     ("encoder-decoder", dict(moe_top_k=1, moe_capacity_factor=1.0))])
def test_cached_decoding_and_batches_equal_full_passes_and_rows_alone(arch: str, kw: dict) -> None:
    model = _model(arch, **kw)
    assert all(isinstance(layer.ffn, MoEFeedForward) for layer in model.decoder.layers)
    for row in (check_cached(model), check_batched(model)):
        assert row.passed, f"{row.compared}: {row.max_diff:.2e} > {row.tolerance:.0e}"


@pytest.mark.parametrize("arch", ["decoder", "encoder", "encoder-decoder"])
def test_the_accelerated_moe_model_equals_the_reference(arch: str) -> None:
    model = _model(arch, moe_top_k=2, dropout=0.1)
    failed = [f"{r.compared}: {r.max_diff:.2e} > {r.tolerance:.0e}"
              for r in check_accelerated(model) if not r.passed]
    assert not failed, "\n".join(failed)


def test_the_model_sums_its_layers_router_losses_with_their_weights() -> None:
    model = _model("encoder-decoder", moe_top_k=2)
    assert moe_loss(model, 0.01, 0.001) is None and moe_load_stats(model) == {}  # before any forward pass
    ids = torch.randint(3, 64, (2, 6))
    model(ids, ids)
    layers = [m for m in model.modules() if isinstance(m, MoEFeedForward)]
    assert len(layers) == 4
    want = sum(0.01 * m.aux_loss + 0.001 * m.z_loss for m in layers)
    torch.testing.assert_close(moe_loss(model, 0.01, 0.001), want)
    stats = moe_load_stats(model)
    assert 0 <= stats["moe_load_min"] <= 1 / E <= stats["moe_load_max"] <= 1
    dense = build_model(ModelConfig.preset("tiny"))
    assert moe_loss(dense, 0.01, 0.001) is None


# ---------------------------------------------------------------------------------------------- in training
LM_RECIPE = """
task = "lm"
[data]
path = "{path}"
block_size = 16
batch_size = 4
eval_max_blocks = 4
[tokenizer]
kind = "char"
[model]
d_model = 32
n_heads = 2
n_layers = 2
d_ff = 32
dropout = 0.1
position = "learned"
norm_position = "pre"
scale_embeddings = false
ffn = "moe"
n_experts = 4
moe_top_k = 1
moe_capacity_factor = 1.25
moe_aux_loss_weight = {aux}
moe_z_loss_weight = {z}
[train]
out_dir = "{out}"
max_steps = 6
accum = 2
optimizer = "adamw"
lr = 3e-3
schedule = "constant_warmup"
warmup = 2
label_smoothing = 0.0
eval_every = 6
log_every = 1
progress = false
threads = 1
"""


def _run(tmp_path: Path, name: str, overrides: list[str] | None = None, resume: bool = False, aux: float = 0.01,
         z: float = 0.001) -> list[dict]:
    from aiayn.tasks.registry import run_recipe

    corpus = tmp_path / "corpus.txt"
    if not corpus.exists():
        words = "the king and queen of a fair land walk to sea by night".split()
        corpus.write_text("".join(" ".join(words[(i * 7 + j) % len(words)] for j in range(i % 5 + 3)) + ".\n"
                                  for i in range(200)), encoding="utf-8")
    recipe = tmp_path / f"{name}.toml"
    recipe.write_text(LM_RECIPE.format(path=corpus.as_posix(), out=(tmp_path / name).as_posix(), aux=aux, z=z),
                      encoding="utf-8")
    before = torch.get_num_threads()
    try:
        run_recipe(recipe, overrides or [], resume=resume)
    finally:
        torch.set_num_threads(before)
    rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "train_loss" in r]


def test_training_adds_the_router_losses_logs_the_load_and_resumes_exactly(tmp_path: Path) -> None:
    full = _run(tmp_path, "full")
    assert [r["step"] for r in full] == list(range(1, 7))
    for r in full:
        assert r["moe_loss"] > 0 and 0 <= r["moe_load_min"] <= 1 / 4 <= r["moe_load_max"] <= 1
    stopped = _run(tmp_path, "parts", ["train.max_steps=3"])
    assert len(stopped) == 3
    parts = _run(tmp_path, "parts", resume=True)
    assert [r["step"] for r in parts] == list(range(1, 7))
    for a, b in zip(full, parts, strict=True):
        assert (b["train_loss"], b["moe_loss"]) == pytest.approx((a["train_loss"], a["moe_loss"]), abs=1e-6)
    # the router losses reach the gradients: without them the first update, and so the second loss, differ
    free = _run(tmp_path, "free", ["train.max_steps=2"], aux=0.0, z=0.0)
    assert free[0]["train_loss"] == pytest.approx(full[0]["train_loss"], abs=1e-6)
    assert free[0]["moe_loss"] == 0.0
    assert abs(free[1]["train_loss"] - full[1]["train_loss"]) > 1e-6


def test_flops_per_token_count_the_router_and_the_top_k_experts() -> None:
    from aiayn.models.stats import forward_flops_per_token

    dense = ModelConfig.preset("llama", vocab_size=V, d_model=D, n_heads=H, n_layers=L, d_ff=FF, n_kv_heads=2)
    for k in (1, 2):
        moe = dense.replace(ffn="moe", n_experts=E, moe_top_k=k)
        extra = forward_flops_per_token(moe, tgt_len=8) - forward_flops_per_token(dense, tgt_len=8)
        assert extra == 2 * L * (D * E + (k - 1) * 3 * D * FF)
