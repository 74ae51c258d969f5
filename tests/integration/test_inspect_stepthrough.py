"""The step-through and neuron views hold the model's own numbers: every stage equals, at 1e-6, what hooks on the
real forward recorded (layer inputs and outputs, projections, RoPE, the softmax's logits, the attention weights,
the heads' concatenation, W_O, norms, the feed-forward), for encoder-decoder, decoder-only and encoder models,
pre- and post-norm, over every attention kind; and the server's ``/api/steps`` answers them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from aiayn import ModelConfig, build_model
from aiayn.inspect import capture_attention, inspect_text
from aiayn.inspect.stepthrough import kinds_of, step_record, step_through
from aiayn.pretrained import load_pretrained

ATOL = 1e-6
BASE = dict(vocab_size=23, d_model=24, n_heads=4, d_ff=40, n_layers=2, max_len=32, dropout=0.0)
CONFIGS = {
    "encoder-decoder, post-norm, sinusoidal (the paper)": dict(arch="encoder-decoder"),
    "encoder-decoder, pre-norm, T5 biases, RMSNorm, GELU": dict(arch="encoder-decoder", norm_position="pre",
                                                                position="t5", norm="rmsnorm", activation="gelu"),
    "decoder, pre-norm, RoPE, GQA, SwiGLU, window": dict(arch="decoder", norm_position="pre", position="rope",
                                                         n_kv_heads=2, activation="swiglu", sliding_window=3,
                                                         norm="rmsnorm"),
    "decoder, post-norm, learned positions": dict(arch="decoder", position="learned"),
    "encoder, post-norm, sinusoidal": dict(arch="encoder", n_encoder_layers=2),
    "encoder, pre-norm, ALiBi, QK-norm, soft-capped": dict(arch="encoder", n_encoder_layers=2, norm_position="pre",
                                                          position="alibi", qk_norm=True, attn_logit_softcap=5.0),
}
SRC, TGT = [3, 7, 11, 4, 9, 15, 2], [1, 8, 5, 12, 6]


def _model(fields: dict[str, Any]) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(ModelConfig(**{**BASE, **fields})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))  # away from the initial values (norm weights 1, biases 0)
    return model


def _ids(model: torch.nn.Module) -> dict[str, list[int]]:
    names = [n for n in ("encoder", "decoder") if hasattr(model, n)]
    return {"encoder": SRC, "decoder": TGT} if len(names) == 2 else {names[0]: SRC if names[0] == "encoder" else TGT}


def _forward_record(model: torch.nn.Module, ids: dict[str, list[int]], kind: str, layer: int,
                    monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What the real forward computed at one layer, recorded by hooks (nothing recomputed)."""
    import aiayn.nn.attention as attention_module

    stack = getattr(model, "encoder" if kind == "encoder" else "decoder")
    lay = stack.layers[layer]
    chosen = lay.cross_attn if kind == "cross" else lay.self_attn
    rec: dict[str, Any] = {"rotary": [], "logits": []}
    active = {"on": False}
    handles = []

    def keep(name: str, what: str = "out"):
        def hook(module, args, output=None):
            rec[name] = (args[0] if what == "in" else output[0] if isinstance(output, tuple) else output).detach()
        return hook

    handles.append(stack.layers[0].register_forward_pre_hook(keep("x0", "in")))
    handles.append(lay.register_forward_pre_hook(keep("x", "in")))
    handles.append(lay.register_forward_hook(keep("layer_out")))
    handles.append(stack.final_norm.register_forward_hook(keep("stack_out")))
    if hasattr(model, "encoder"):
        handles.append(model.encoder.final_norm.register_forward_hook(keep("memory")))
    for name, attn in (("self", lay.self_attn), ("cross", lay.cross_attn)):
        if attn is None:
            continue
        if attn.cross:
            handles.append(attn.q_proj.register_forward_hook(keep("cross_q")))
            handles.append(attn.kv_proj.register_forward_hook(keep("cross_kv")))
        else:
            handles.append(attn.qkv_proj.register_forward_hook(keep("self_qkv")))
        handles.append(attn.out_proj.register_forward_pre_hook(keep(f"{name}_concat", "in")))
        handles.append(attn.out_proj.register_forward_hook(keep(f"{name}_out")))
    for name, res in (("self", lay.self_res), ("cross", lay.cross_res), ("ffn", lay.ffn_res)):
        if res is not None:
            handles.append(res.norm.register_forward_pre_hook(keep(f"{name}_norm_in", "in")))
            handles.append(res.norm.register_forward_hook(keep(f"{name}_norm_out")))
    handles.append(lay.ffn.w_in.register_forward_hook(keep("ffn_w_in")))
    handles.append(lay.ffn.w_out.register_forward_pre_hook(keep("ffn_hidden", "in")))
    handles.append(lay.ffn.register_forward_hook(keep("ffn_out")))
    handles.append(chosen.register_forward_pre_hook(lambda m, a: active.update(on=True)))
    handles.append(chosen.register_forward_hook(lambda m, a, o: active.update(on=False)))

    real_rotary, real_softmax = attention_module.apply_rotary, torch.softmax

    def rotary(x, cos, sin):
        out = real_rotary(x, cos, sin)
        if active["on"]:
            rec["rotary"].append(out.detach())
        return out

    def softmax(scores, *args, **kwargs):
        if active["on"]:
            rec["logits"].append(scores.detach())
        return real_softmax(scores, *args, **kwargs)

    monkeypatch.setattr(attention_module, "apply_rotary", rotary)
    monkeypatch.setattr(torch, "softmax", softmax)
    tensors = {k: torch.tensor([v]) for k, v in ids.items()}
    try:
        with torch.no_grad(), capture_attention(model, layers=[layer], kinds=[kind]) as capture:
            if "encoder" in tensors and "decoder" in tensors:
                out = model(tensors["encoder"], tensors["decoder"], compute_logits=False)
            elif "decoder" in tensors:
                out = model(tensors["decoder"], compute_logits=False)
            else:
                out = model(tensors["encoder"], torch.ones_like(tensors["encoder"], dtype=torch.bool), task="hidden")
    finally:
        monkeypatch.undo()
        for h in handles:
            h.remove()
    ((call,),) = capture.kind(kind)  # the one layer recorded
    rec["weights"], rec["allowed"], rec["hidden"] = call.weights, call.allowed, out.hidden
    rec["logits"] = rec["logits"][-1]  # the recorder's softmax (a reference backend ran one before it)
    return rec


def _close(got: Any, want: torch.Tensor, what: str) -> None:
    got, want = torch.tensor(got, dtype=torch.float64), want.detach()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}, not {tuple(want.shape)}"
    diff = float((got - want.double()).abs().max()) if got.numel() else 0.0
    assert diff <= ATOL, f"{what}: off by {diff:.3g} (values up to {float(want.abs().max()):.3g})"


def _near(got: Any, want: torch.Tensor, what: str) -> None:
    """A stage against the stages it is made of (float32 sums in another order: relative 1e-5)."""
    torch.testing.assert_close(torch.tensor(got, dtype=torch.float64), want.double(), atol=1e-5, rtol=1e-5, msg=what)


def _check(steps: dict[str, Any], rec: dict[str, Any], model: torch.nn.Module, ids: dict[str, list[int]]) -> None:
    kind, layer, head, i = steps["kind"], steps["layer"], steps["head"], steps["query"]
    stack_name = "encoder" if kind == "encoder" else "decoder"
    stack = getattr(model, stack_name)
    lay = stack.layers[layer]
    attn = lay.cross_attn if kind == "cross" else lay.self_attn
    hq, hkv, dh = attn.n_heads, attn.n_kv_heads, attn.head_dim
    kvh = head // (hq // hkv)
    stages = {s["id"]: s["values"] for s in steps["stages"]}
    checked: set[str] = set()

    def check(name: str, want: torch.Tensor) -> None:
        _close(stages[name], want, f"{kind} layer {layer} head {head} query {i}: {name}")
        checked.add(name)

    check("x", rec["x"][0, i])
    if layer == 0:
        tok_ids = torch.tensor(ids[stack_name])
        check("embedding", stack.embed.weight[tok_ids[i]] * stack.embed_scale)
        total = torch.tensor(stages["embedding"])
        if "position" in stages:
            check("position", stack.abs_pos.span(0, len(tok_ids))[0, i])
            total = total + torch.tensor(stages["position"])
        _near(total.tolist(), rec["x0"][0, i], "x = embedding + position")
        checked.add("position_note")
    if attn.cross:
        q_all = rec["cross_q"].view(1, -1, hq, dh)[0, :, head]  # (T, Dh)
        k_all, v_all = rec["cross_kv"][0].split(hkv * dh, dim=-1)  # (S, Hkv*Dh)
        check("memory", rec["memory"][0])
    else:
        q_all, k_all, v_all = rec["self_qkv"][0].split([hq * dh, hkv * dh, hkv * dh], dim=-1)
        q_all = q_all.view(-1, hq, dh)[:, head]
    check("q_proj", q_all[i])
    check("k_proj", k_all.view(-1, hkv, dh)[:, kvh])
    check("v", v_all.view(-1, hkv, dh)[:, kvh])
    q_final, k_final = torch.tensor(stages["q_proj"]), torch.tensor(stages["k_proj"])
    if "q_norm" in stages:  # QK-norm: checked through the logits below, which read the normalized q and k
        checked |= {"q_norm", "k_norm"}
        q_final, k_final = torch.tensor(stages["q_norm"]), torch.tensor(stages["k_norm"])
    if rec["rotary"]:
        q_rot, k_rot = rec["rotary"]
        check("q_rope", q_rot[0, head, i])
        check("k_rope", k_rot[0, kvh])
        q_final, k_final = torch.tensor(stages["q_rope"]), torch.tensor(stages["k_rope"])
    logits = rec["logits"][0, head, i]  # (S,): masked keys hold the dtype's minimum
    allowed = torch.tensor(stages["allowed"])
    want_allowed = (torch.ones_like(allowed) if rec["allowed"] is None
                    else rec["allowed"].expand(1, hq, *rec["logits"].shape[-2:])[0, head, i])
    assert torch.equal(allowed, want_allowed)
    checked.add("allowed")
    scores = torch.tensor(stages["scores"], dtype=torch.float64)
    _close(scores[allowed].tolist(), logits[allowed], "scores == the softmax's logits")
    checked.add("scores")
    assert [v is None for v in stages["masked"]] == (~allowed).tolist()
    _close([v for v in stages["masked"] if v is not None], logits[allowed], "masked scores")
    checked.add("masked")
    check("weights", rec["weights"][0, head, i])
    # the stages between, each from the one before it
    qk = torch.tensor(stages["qk"], dtype=torch.float64)
    _near(qk.tolist(), q_final.double()[None] * k_final.double(), "q * k_j")
    _near(stages["dots"], qk.sum(-1), "sum of q * k_j")
    _near(stages["scaled"], torch.tensor(stages["dots"]) * steps["scale"], "scaled")
    checked |= {"qk", "dots", "scaled", "bias", "capped"}
    biased = torch.tensor(stages["scaled"]) + (torch.tensor(stages["bias"]) if "bias" in stages else 0)
    if "capped" in stages:
        _near(stages["capped"], attn.softcap * torch.tanh(biased / attn.softcap), "capped")
    else:
        _near(stages["scores"], biased, "scaled + bias")
    concat = rec[f"{'cross' if attn.cross else 'self'}_concat"][0, i]
    check("concat", concat)
    check("head_out", concat[head * dh:(head + 1) * dh])
    _near(torch.tensor(stages["weighted_v"]).sum(0).tolist(), concat[head * dh:(head + 1) * dh], "sum of a_j V_j")
    checked.add("weighted_v")
    for name in ("self", "cross"):
        if f"{name}_out" in stages:
            check(f"{name}_out", rec[f"{name}_out"][0, i])
    pre = stack.config.norm_position == "pre"
    after = {"self": "cross" if lay.cross_attn is not None else "ffn", "cross": "ffn", "ffn": None}
    for name in ("self", "cross", "ffn"):
        if getattr(lay, f"{name}_res") is None:
            continue
        if pre:
            if f"{name}_prenorm" in stages:
                check(f"{name}_prenorm", rec[f"{name}_norm_out"][0, i])
            nxt = after[name]
            check(f"{name}_residual", rec[f"{nxt}_norm_in"][0, i] if nxt else rec["layer_out"][0, i])
        else:
            check(f"{name}_sum", rec[f"{name}_norm_in"][0, i])
            check(f"{name}_norm", rec[f"{name}_norm_out"][0, i])
    if "ffn_gate" in stages:
        gate, up = rec["ffn_w_in"][0, i].chunk(2)
        check("ffn_gate", gate)
        check("ffn_up", up)
    elif lay.ffn.fusable in getattr(lay.ffn.w_in, "fused_activations", ()):  # the kernel applies the activation
        _close(stages["ffn_hidden"], rec["ffn_w_in"][0, i], "the fused first linear's output")
        _near(stages["ffn_hidden"], lay.ffn.act(torch.tensor(stages["ffn_w1"])), "act(first linear)")
        checked.add("ffn_w1")
    else:
        check("ffn_w1", rec["ffn_w_in"][0, i])
    check("ffn_hidden", rec["ffn_hidden"][0, i])
    check("ffn_out", rec["ffn_out"][0, i])
    check("layer_out", rec["layer_out"][0, i])
    if "final_norm" in stages:
        check("final_norm", rec["stack_out"][0, i])
        if stack_name == "decoder" or not hasattr(model, "decoder"):
            _close(stages["final_norm"], rec["hidden"][0, i], "the model's hidden state")
    unchecked = set(stages) - checked
    assert not unchecked, f"stages not held against the forward: {unchecked}"
    # the neuron view: the same q, k, product and scores
    n = steps["neurons"]
    _close(n["q"], q_final, "neuron q")
    _close(n["k"], k_final.repeat_interleave(1, 0), "neuron k")
    _close(n["qk"], qk, "neuron q * k")
    _close([s for s, ok in zip(n["scores"], n["allowed"]) if ok], logits[allowed], "neuron scores == logits")
    _close(n["weights"], rec["weights"][0, head, i], "neuron weights")


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_stage_equals_the_models_forward(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model(CONFIGS[name])
    ids = _ids(model)
    for kind in kinds_of(model):
        t = len(ids["encoder" if kind == "encoder" else "decoder"])
        for layer, head, query in ((0, 0, 0), (1, 3, t - 1), (1, 1, t // 2)):
            steps = step_through(model, ids, kind, layer, head, query, digits=None)
            _check(steps, _forward_record(model, ids, kind, layer, monkeypatch), model, ids)
            rounded = step_through(model, ids, kind, layer, head, query)  # 6 decimals, as the API answers
            for a, b in zip(rounded["stages"], steps["stages"]):
                if a["id"] not in ("allowed", "masked"):
                    _close(a["values"], torch.tensor(b["values"]), f"{a['id']} rounded")


def test_the_stages_read_in_order(inspect_checkpoints: dict[str, Path]) -> None:
    pre = load_pretrained(inspect_checkpoints["translation"])
    record = inspect_text(pre, "the small dog runs .")
    steps = step_record(pre, record["ids"], "cross", 1, 2, 3)
    order = [s["id"] for s in steps["stages"]]
    assert order[:2] == ["x", "self_out"] and order[-1] == "layer_out"  # post-norm: no final norm
    assert order.index("q_proj") < order.index("scores") < order.index("weights") < order.index("concat") < \
        order.index("cross_out") < order.index("ffn_out")
    assert steps["query_token"] == record["tokens"]["decoder"][3]
    assert steps["key_tokens"] == record["tokens"]["encoder"]
    assert next(s for s in steps["stages"] if s["id"] == "k_proj")["rows"] == record["tokens"]["encoder"]
    weights = next(s for s in steps["stages"] if s["id"] == "weights")["values"]
    assert weights == pytest.approx(record["attention"]["cross"][1][2][3], abs=1e-5)  # the record's, 5 decimals


def test_the_server_answers_steps_and_refuses_bad_selections(inspect_checkpoints: dict[str, Path], serve) -> None:
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    from aiayn.inspect.server import build_app

    pre = load_pretrained(inspect_checkpoints["translation"])
    record = inspect_text(pre, "the small dog runs .")
    good = {"ids": record["ids"], "kind": "decoder", "layer": 1, "head": 0, "query": 2}
    with serve(build_app(pre, record)) as url, httpx.Client(base_url=url, timeout=30) as client:
        answer = client.post("/api/steps", json=good)
        assert answer.status_code == 200
        assert answer.json() == step_record(pre, record["ids"], "decoder", 1, 0, 2)
        n = len(record["ids"]["decoder"])
        for change, word in (({"kind": "sideways"}, "kind"), ({"layer": 2}, "layer"), ({"head": -1}, "head"),
                             ({"query": n}, f"0 to {n - 1}"), ({"layer": True}, "layer"),
                             ({"ids": {"decoder": [1]}}, "ids"), ({"ids": {**record["ids"], "encoder": []}}, "ids"),
                             ({"ids": {**record["ids"], "encoder": [10**6]}}, "token ids"),
                             ({"ids": {**record["ids"], "encoder": ["a"]}}, "token ids"),
                             ({"extra": 1}, "unknown")):
            bad = client.post("/api/steps", json={**good, **change})
            assert bad.status_code == 422 and word in bad.json()["error"], (change, bad.text)
        assert client.post("/api/steps", json={"kind": "cross"}).status_code == 422
        deep = client.post("/api/steps", content=b"[" * 5000, headers={"content-type": "application/json"})
        assert deep.status_code == 422


@pytest.mark.parametrize("task", ["translation", "lm", "classification"])
def test_the_stages_of_an_accelerated_checkpoint(task: str, inspect_checkpoints: dict[str, Path],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint as the explorer loads it (its accelerator's kernels in place, where this machine has them)."""
    pre = load_pretrained(inspect_checkpoints[task])
    ids = inspect_text(pre, "the small dog runs near the river .")["ids"]
    model = pre.model
    for kind in kinds_of(model):
        t = len(ids["encoder" if kind == "encoder" else "decoder"])
        steps = step_through(model, ids, kind, 1, 2, t - 1, digits=None)
        _check(steps, _forward_record(model, ids, kind, 1, monkeypatch), model, ids)
