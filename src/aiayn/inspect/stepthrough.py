"""One attention computation, step by step, with the model's own numbers; and the neuron view of its scores.

For a chosen stack kind (``encoder`` self-attention, ``decoder`` self-attention, ``cross``-attention), layer, head
and query token, :func:`step_through` runs the model's forward once on the given token ids, takes the chosen layer's
input from that pass (a forward pre-hook: the hidden states the layer really received, with its mask, position bias
and RoPE angles), and evaluates the layer again with the layer's own modules, keeping every intermediate value:

    x_i (token embedding + position at layer 0)     the layer's input row
    h = LN(x) (pre-norm) or x (post-norm)           what the sublayer reads
    q_i = h_i W_Q,h   K = h W_K,h   V = h W_V,h      (RoPE rotates q and K; cross-attention takes K, V from memory)
    s = K q_i         the dot products, then s / sqrt(d_k) (or the model's scale), + bias (ALiBi, T5), capped
    mask, softmax     a_i = softmax(s masked)        the weights the model's attention computed
    o_h = sum_j a_ij V_j                             this head's output; [o_1 .. o_H] the concatenation
    y = [o_1 .. o_H] W_O                             the sublayer's output
    x + y, then LN (post-norm)                       the residual
    (the other attention sublayer of a decoder layer, in short)
    FFN: act(h W_1) W_2, the residual, LN           the layer's output (and the stack's final norm after the last)

Every value is a row of the pass the model made (the projections, scores and weights are the formulas of
:mod:`aiayn.nn.attention` on that pass's tensors); the tests hold each equal to what
hooks on the real forward recorded, at 1e-6 (``tests/integration/test_inspect_stepthrough.py``).

The answer is JSON-ready: ``stages`` (in order, each ``{"id", "section", "title", "formula", "values"}``, a vector or a
matrix with its ``rows`` labels) and ``neurons`` (the neuron view: q, each key's k, their elementwise product and the
resulting score per key).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from aiayn.errors import AiaynError
from aiayn.nn.attention import MultiHeadAttention, attention_weights
from aiayn.nn.feedforward import FeedForward
from aiayn.nn.layers import TransformerLayer
from aiayn.nn.positions import apply_rotary

#: the attention kinds a step-through covers, and the stack each one lives in
KIND_STACK = {"encoder": "encoder", "decoder": "decoder", "cross": "decoder"}
SECTION = {"encoder": "encoder self-attention", "decoder": "decoder self-attention", "cross": "cross-attention"}


def _stacks(model: nn.Module) -> dict[str, nn.Module]:
    """The model's stacks by name ("encoder", "decoder")."""
    return {name: getattr(model, name) for name in ("encoder", "decoder") if hasattr(model, name)}


def kinds_of(model: nn.Module) -> list[str]:
    """The attention kinds a model has: encoder and/or decoder self-attention, and cross-attention."""
    stacks = _stacks(model)
    out = [k for k in ("encoder", "decoder") if k in stacks]
    if "decoder" in stacks and stacks["decoder"].cross:
        out.append("cross")
    return out


def _run(model: nn.Module, ids: dict[str, Tensor]) -> None:
    """The model's forward on (1, T) ids of each stack, as the explorer's record runs it."""
    stacks = _stacks(model)
    if "encoder" in stacks and "decoder" in stacks:
        model(ids["encoder"], ids["decoder"], compute_logits=False)
    elif "decoder" in stacks:
        model(ids["decoder"], compute_logits=False)
    else:
        x = ids["encoder"]
        model(x, torch.ones_like(x, dtype=torch.bool), task="hidden")


def _layer_calls(model: nn.Module, ids: dict[str, Tensor], stack: str, layers: set[int]) -> dict[int, tuple]:
    """``{layer: (x (1, T, D), kwargs)}``: what these layers of one stack received in the model's forward."""
    calls: dict[int, tuple] = {}
    handles = []
    for i in layers:
        def hook(module: nn.Module, args: tuple, kwargs: dict, i: int = i) -> None:
            calls[i] = (args[0] if args else kwargs["x"], dict(kwargs))
        handles.append(_stacks(model)[stack].layers[i].register_forward_pre_hook(hook, with_kwargs=True))
    try:
        _run(model, ids)
    finally:
        for h in handles:
            h.remove()
    return calls


class _Stages:
    """The ordered stages of a step-through, rounded for JSON (``digits`` decimals; None: full precision)."""

    def __init__(self, digits: int | None) -> None:
        self.digits, self.items = digits, []

    def value(self, x: Tensor | None) -> Any:
        if x is None:
            return None
        x = x.detach().double().cpu()
        if x.dtype == torch.bool:
            return x.tolist()
        return (torch.round(x, decimals=self.digits) if self.digits is not None else x).tolist()

    def add(self, id: str, section: str, title: str, formula: str, values: Tensor, **extra: Any) -> None:
        self.items.append({"id": id, "section": section, "title": title, "formula": formula,
                           "values": values.tolist() if values.dtype == torch.bool else self.value(values),
                           **{k: v for k, v in extra.items() if v is not None}})


def _heads(attn: MultiHeadAttention, x: Tensor, n: int) -> Tensor:
    """(1, T, n*Dh) -> (1, n, T, Dh), as the module splits its heads."""
    b, t, _ = x.shape
    return x.view(b, t, n, attn.head_dim).transpose(1, 2)


def _attention_detail(out: _Stages, attn: MultiHeadAttention, h: Tensor, memory: Tensor | None, kw: dict[str, Any],
                      head: int, query: int, section: str, key_labels: list[str] | None) -> dict[str, Any]:
    """The stages of one head's attention for one query row, with the module's own weights: ``h`` (1, T, D) the
    sublayer input, ``memory`` (1, S, D) cross-attention's key source. Returns the neuron view."""
    hq, hkv, dh = attn.n_heads, attn.n_kv_heads, attn.head_dim
    kvh = head // (hq // hkv)  # the key/value head this query head reads (GQA, MQA)
    rotary = None if attn.cross else kw.get("rotary")
    if attn.cross:
        q_raw = _heads(attn, attn.q_proj(h), hq)  # (1, H, T, Dh)
        k_raw, v = attn.kv_proj(memory).split(hkv * dh, dim=-1)  # (1, S, Hkv*Dh) each
        k_raw, v = _heads(attn, k_raw, hkv), _heads(attn, v, hkv)  # (1, Hkv, S, Dh)
        source = "memory (the encoder's output)"
    else:
        q_raw, k_raw, v = attn.qkv_proj(h).split([hq * dh, hkv * dh, hkv * dh], dim=-1)
        q_raw, k_raw, v = _heads(attn, q_raw, hq), _heads(attn, k_raw, hkv), _heads(attn, v, hkv)
        source = "h"
    q, k = q_raw, k_raw
    out.add("q_proj", section, f"q: query row {query} of head {head}",
            f"q = h_{query} W_Q (head {head}'s {dh} columns)", q_raw[0, head, query], shape=f"Dh = {dh}")
    out.add("k_proj", section, f"K: the key rows of head {head}", f"K = {source} W_K (key/value head {kvh})",
            k_raw[0, kvh], rows=key_labels, shape=f"S x Dh = {k_raw.shape[2]} x {dh}")
    out.add("v", section, f"V: the value rows of head {head}", f"V = {source} W_V (key/value head {kvh})",
            v[0, kvh], rows=key_labels, shape=f"S x Dh = {v.shape[2]} x {dh}")
    if attn.q_norm is not None:  # QK-norm: each head's queries and keys (the memory's keys for cross-attention)
        q, k = attn.q_norm(q), attn.k_norm(k)
        out.add("q_norm", section, "q after QK-norm", "q = RMSNorm(q)", q[0, head, query])
        out.add("k_norm", section, "K after QK-norm", "K = RMSNorm(K)", k[0, kvh], rows=key_labels)
    if rotary is not None:
        q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        out.add("q_rope", section, f"q rotated by RoPE to position {query}", "q = R(pos) q", q[0, head, query])
        out.add("k_rope", section, "K rotated by RoPE, each key to its position", "K_j = R(pos_j) K_j", k[0, kvh],
                rows=key_labels)
    t, s = q.shape[2], k.shape[2]
    k_all = k.repeat_interleave(hq // hkv, dim=1)  # (1, H, S, Dh): each query head's keys
    v_all = v.repeat_interleave(hq // hkv, dim=1)
    scale = attn.scale if attn.scale is not None else 1.0 / math.sqrt(dh)
    dots = torch.matmul(q, k_all.transpose(-2, -1))  # (1, H, T, S): QK^T
    scaled = dots * scale
    scores = scaled
    bias = kw.get("bias") if not attn.cross else None
    bias_row = None
    if bias is not None:
        bias_row = bias.expand(1, hq, t, s)[0, head, query]  # (S,)
        scores = scores + bias
    capped = None
    if attn.softcap is not None:
        capped = attn.softcap * torch.tanh(scores / attn.softcap)
        scores = capped
    mask = kw.get("memory_mask") if attn.cross else kw.get("mask")
    is_causal = bool(kw.get("is_causal")) and not attn.cross
    weights, allowed = attention_weights(q, k, mask, bias, is_causal=is_causal, scale=attn.scale,
                                         softcap=attn.softcap)  # (1, H, T, S): the pass's own formula
    allowed_row = (torch.ones(s, dtype=torch.bool) if allowed is None
                   else allowed.expand(1, hq, t, s)[0, head, query].cpu())
    scale_text = (f"1/sqrt(d_k) = 1/sqrt({dh}) = {scale:.6g}" if attn.scale is None
                  else f"{scale:g} (this model folds 1/sqrt(d_k) into its weights)" if scale == 1.0
                  else f"{scale:.6g}")
    per_key = dict(rows=key_labels, per_key=True)
    out.add("qk", section, "q * k_j, elementwise, for each key j", "q (.) K_j", q[0, head, query] * k_all[0, head],
            rows=key_labels)
    out.add("dots", section, "QK^T: q . k_j", "s_j = sum(q * k_j)", dots[0, head, query], **per_key)
    out.add("scaled", section, "scaled", f"s_j * {scale_text}", scaled[0, head, query], **per_key)
    if bias_row is not None:
        out.add("bias", section, "position bias", "b_j (ALiBi / T5 relative position)", bias_row, **per_key)
    if capped is not None:
        out.add("capped", section, "soft-capped", f"{attn.softcap:g} tanh(s_j / {attn.softcap:g})",
                capped[0, head, query], **per_key)
    out.add("scores", section, "scores", "the logits the softmax reads", scores[0, head, query], **per_key)
    out.add("allowed", section, "mask", "1: may attend (padding, causal, window, pattern)", allowed_row, **per_key)
    masked = [v if ok else None for v, ok in zip(out.value(scores[0, head, query]), allowed_row.tolist())]
    out.items.append({"id": "masked", "section": section, "title": "masked scores",
                      "formula": "s_j, or -inf (null) where masked", "values": masked, **per_key})
    out.add("weights", section, "softmax: the attention weights", "a_j = exp(s_j) / sum_k exp(s_k)",
            weights[0, head, query], **per_key)
    # every head's output as the module computes it (its backend: torch's fused kernel, an accelerator's, or the
    # reference), so that the concatenation is what W_O reads
    heads_out, _ = attn.attend(q, k, v, mask=mask, bias=bias, is_causal=is_causal, return_weights=False)
    out.add("weighted_v", section, "each value row times its weight", "a_j V_j",
            weights[0, head, query][:, None] * v_all[0, head], rows=key_labels)
    out.add("head_out", section, f"head {head}'s output", "o = sum_j a_j V_j", heads_out[0, head, query])
    concat = heads_out.transpose(1, 2).reshape(1, t, hq * dh)  # (1, H, T, Dh) -> (1, T, H*Dh)
    out.add("concat", section, "the heads concatenated", "[o_1 .. o_H]", concat[0, query],
            mark=[head * dh, (head + 1) * dh])
    return {"q": out.value(q[0, head, query]), "k": out.value(k_all[0, head]), "qk": out.value(
        q[0, head, query] * k_all[0, head]), "dots": out.value(dots[0, head, query]), "scale": scale,
        "bias": out.value(bias_row), "scores": out.value(scores[0, head, query]),
        "allowed": allowed_row.tolist(), "weights": out.value(weights[0, head, query])}


def _residual(out: _Stages, res: nn.Module, x: Tensor, y: Tensor, query: int, section: str, name: str) -> Tensor:
    """The residual (and post-norm) stages around a sublayer: x, y (1, T, D) -> the new x (1, T, D)."""
    new = res.exit(x, y)
    if res.pre:
        out.add(f"{name}_residual", section, "residual", "x + y", new[0, query])
    else:
        total = x + y if res.alpha == 1.0 else res.alpha * x + y
        out.add(f"{name}_sum", section, "residual", "x + y" if res.alpha == 1.0 else f"{res.alpha:g} x + y",
                total[0, query])
        out.add(f"{name}_norm", section, "norm (post-norm)", f"{type(res.norm).__name__}(x + y)", new[0, query])
    return new


def _ffn(out: _Stages, ffn: nn.Module, h: Tensor, query: int) -> Tensor:
    """The feed-forward stages of one row: h (1, T, D) -> the FFN's output (1, T, D)."""
    section = "feed-forward"
    y = ffn(h)
    if isinstance(ffn, FeedForward):
        pre = ffn.w_in(h)  # (1, T, d_ff) or (1, T, 2 d_ff) gated
        if ffn.gated:
            gate, up = pre.chunk(2, dim=-1)
            out.add("ffn_gate", section, "gate", "h W_gate", gate[0, query])
            out.add("ffn_up", section, "up", "h W_up", up[0, query])
            hidden = ffn.act(gate) * up
            formula = f"{'SiLU' if ffn.activation == 'swiglu' else 'GELU'}(gate) * up"
        else:
            out.add("ffn_w1", section, "first linear", "h W_1 + b_1", pre[0, query])
            hidden = ffn.act(pre)
            formula = f"{ffn.activation.upper()}(h W_1 + b_1)"
        out.add("ffn_hidden", section, "activation", formula, hidden[0, query])
        formula = "hidden W_2 + b_2"
    else:
        formula = f"{type(ffn).__name__}(h): a mixture of experts, its output only"
    out.add("ffn_out", section, "the FFN's output", formula, y[0, query])
    return y


@torch.no_grad()
def step_through(model: nn.Module, ids: dict[str, list[int]], kind: str, layer: int, head: int, query: int, *,
                 labels: dict[str, list[str]] | None = None, digits: int | None = 6) -> dict[str, Any]:
    """Every stage of one attention computation of ``model`` on ``ids`` (see the module docstring).

    Args:
        model: an aiayn encoder-decoder, decoder-only or encoder model (token input, softmax attention).
        ids: ``{"encoder": [...], "decoder": [...]}``, the token ids of the stacks the model has (one sequence each).
        kind: "encoder", "decoder" or "cross".
        layer, head, query: the layer of that kind's stack, the query head, the query position.
        labels: the token strings of ``ids`` (rows of the keys' stages); default the positions.
        digits: decimals kept of each value (None: full precision).
    Returns:
        ``{"kind", "layer", "head", "query", "scale", "stages": [...], "neurons": {...}}``.
    Raises:
        AiaynError: a kind, layer, head or query the model does not have, or a model the step-through cannot run.
    """
    stacks = _stacks(model)
    if kind not in kinds_of(model):
        raise AiaynError(f"kind {kind!r}: this model has {', '.join(kinds_of(model))} attention")
    stack = stacks[KIND_STACK[kind]]
    n_layers, n_heads = len(stack.layers), stack.config.n_heads
    if getattr(stack, "embed", None) is None:
        raise AiaynError("the step-through reads token ids; this model reads images")
    if stack.config.attention != "softmax":
        raise AiaynError(f"the step-through follows softmax attention; this model's is {stack.config.attention}")
    if not 0 <= layer < n_layers or not 0 <= head < n_heads:
        raise AiaynError(f"layer {layer}, head {head}: the {KIND_STACK[kind]} has layers 0-{n_layers - 1} and heads "
                         f"0-{n_heads - 1}")
    device = next(model.parameters()).device
    tensors = {name: torch.tensor([ids[name]], device=device) for name in stacks}
    t = tensors[KIND_STACK[kind]].shape[1]
    if not 0 <= query < t:
        raise AiaynError(f"query {query}: the {KIND_STACK[kind]} reads {t} tokens (0-{t - 1})")
    labels = labels or {name: [str(i) for i in range(tensors[name].shape[1])] for name in stacks}
    model.eval()
    calls = _layer_calls(model, tensors, KIND_STACK[kind], {0, layer})
    x, kw = calls[layer]
    lay: TransformerLayer = stack.layers[layer]
    out = _Stages(digits)
    rows = labels[KIND_STACK[kind]]
    _input_stages(out, stack, tensors[KIND_STACK[kind]], calls[0][0], x, layer, query, rows)

    memory = kw.get("memory")
    key_labels = labels["encoder"] if kind == "cross" else rows
    neurons = None
    section = SECTION["cross" if kind == "cross" else KIND_STACK[kind]]
    self_section = SECTION[KIND_STACK[kind]]
    h = lay.self_res.enter(x)
    if kind != "cross":
        _enter(out, lay.self_res, h, query, self_section, "self")
        neurons = _attention_detail(out, lay.self_attn, h, None, kw, head, query, self_section, key_labels)
    y, _ = lay.self_attn(h, mask=kw.get("mask"), bias=kw.get("bias"), rotary=kw.get("rotary"),
                         is_causal=bool(kw.get("is_causal")))
    out.add("self_out", self_section, "the sublayer's output" if kind != "cross" else "self-attention's output",
            "y = [o_1 .. o_H] W_O + b_O" if kind != "cross" else "y = SelfAttention(h) (choose decoder self-attention "
            "for its steps)", y[0, query])
    x = _residual(out, lay.self_res, x, y, query, self_section, "self")
    if lay.cross_attn is not None:
        h = lay.cross_res.enter(x)
        if kind == "cross":
            _enter(out, lay.cross_res, h, query, section, "cross")
            out.add("memory", section, "memory: the encoder's output rows (the keys' and values' source)",
                    "the encoder stack's hidden states", memory[0], rows=key_labels)
            neurons = _attention_detail(out, lay.cross_attn, h, memory, kw, head, query, section, key_labels)
        y, _ = lay.cross_attn(h, memory, mask=kw.get("memory_mask"))
        cross = SECTION["cross"]
        out.add("cross_out", cross, "the sublayer's output" if kind == "cross" else "cross-attention's output",
                "y = [o_1 .. o_H] W_O + b_O" if kind == "cross" else "y = CrossAttention(h, memory) (choose "
                "cross-attention for its steps)", y[0, query])
        x = _residual(out, lay.cross_res, x, y, query, cross, "cross")
    h = lay.ffn_res.enter(x)
    _enter(out, lay.ffn_res, h, query, "feed-forward", "ffn")
    x = _residual(out, lay.ffn_res, x, _ffn(out, lay.ffn, h, query), query, "feed-forward", "ffn")
    out.add("layer_out", "output", f"layer {layer}'s output", "the next layer's input" if layer < n_layers - 1 else
            "the last layer's output", x[0, query])
    if layer == n_layers - 1 and not isinstance(stack.final_norm, nn.Identity):
        out.add("final_norm", "output", "the stack's final norm (pre-norm)", f"{type(stack.final_norm).__name__}(x)",
                stack.final_norm(x)[0, query])
    attn = lay.cross_attn if kind == "cross" else lay.self_attn
    return {"kind": kind, "layer": layer, "head": head, "query": query, "query_token": rows[query],
            "key_tokens": key_labels, "scale": neurons["scale"], "head_dim": attn.head_dim, "n_heads": n_heads,
            "norm_position": stack.config.norm_position, "position": stack.config.position,
            "stages": out.items, "neurons": neurons}


def _enter(out: _Stages, res: nn.Module, h: Tensor, query: int, section: str, name: str) -> None:
    if res.pre:
        out.add(f"{name}_prenorm", section, "norm (pre-norm): what the sublayer reads",
                f"h = {type(res.norm).__name__}(x)", h[0, query])


def _input_stages(out: _Stages, stack: nn.Module, ids: Tensor, x0: Tensor, x: Tensor, layer: int, query: int,
                  rows: list[str]) -> None:
    """The layer's input row; at layer 0, how the stack made it: token embedding + position (+ norm)."""
    section = "input"
    if layer == 0:
        t = ids.shape[1]
        tok = stack.embed(ids) * stack.embed_scale  # (1, T, D)
        scale = f" * sqrt(d_model) = * {stack.embed_scale:.4g}" if stack.embed_scale != 1.0 else ""
        out.add("embedding", section, f"token embedding of {rows[query]!r}", f"E[id]{scale}", tok[0, query])
        total = tok
        if stack.token_type_embed is not None:
            tte = stack.token_type_embed.weight[0]
            total = total + tte
            out.add("token_type", section, "token type 0 embedding", "T[0]", tte)
        if stack.abs_pos is not None:
            pe = stack.abs_pos.span(0, t)  # (1, T, D)
            total = total + pe
            out.add("position", section, f"{stack.config.position} position encoding of position {query}", "P[pos]",
                    pe[0, query])
        elif stack.rotary is not None:
            out.add("position_note", section, "positions: RoPE", "rotates q and k inside attention (below)",
                    torch.zeros(0))
        elif stack.pos_bias is not None:
            out.add("position_note", section, f"positions: {stack.config.position}",
                    "a bias added to the scores (below)", torch.zeros(0))
        if stack.embed_norm is not None:
            total = stack.embed_norm(total)
            out.add("embedding_norm", section, "embedding norm", "Norm(E + P)", total[0, query])
        out.add("x", section, "x: the layer's input",
                "x = E[id] + P[pos]" if stack.abs_pos is not None else "x = E[id]", x0[0, query])
    else:
        out.add("x", section, "x: the layer's input", f"layer {layer - 1}'s output", x[0, query])


def step_record(pre: Any, ids: dict[str, list[int]], kind: str, layer: int, head: int, query: int,
                digits: int | None = 6) -> dict[str, Any]:
    """:func:`step_through` for a loaded checkpoint, its stages labelled with the checkpoint's token strings."""
    sides = {"translation": {"encoder": "src", "decoder": "tgt"}}.get(pre.task, {"encoder": "text", "decoder": "text"})
    labels = {name: [pre.tokenizers[sides[name]].id_to_token(i) for i in row] for name, row in ids.items()}
    return step_through(pre.model, ids, kind, layer, head, query, labels=labels, digits=digits)


def default_selection(record: dict[str, Any]) -> dict[str, Any]:
    """The step-through the explorer opens on for a record: cross-attention for a translation, else the first kind;
    layer 0, head 0, the last query."""
    kind = "cross" if "cross" in record["attention"] else next(iter(record["attention"]))
    queries = record["tokens"]["encoder" if kind == "encoder" else "decoder"]
    return {"kind": kind, "layer": 0, "head": 0, "query": len(queries) - 1}


def steps_request(body: Any, pre: Any, bad: type[Exception]) -> dict[str, Any]:
    """The selection of an ``/api/steps`` body (``ids``, ``kind``, ``layer``, ``head``, ``query``) for a checkpoint,
    checked; ``bad(422, message)`` is raised for anything wrong."""
    def fail(message: str) -> None:
        raise bad(422, message)

    if not isinstance(body, dict):
        fail('the body must be a JSON object such as {"ids": {"decoder": [5, 9]}, "kind": "decoder", "layer": 0, '
             '"head": 0, "query": 1}')
    fields = {"ids", "kind", "layer", "head", "query"}
    missing, unknown = sorted(fields - set(body)), sorted(set(body) - fields)
    if missing or unknown:
        fail(f"give exactly the fields ids, kind, layer, head, query; missing {missing or 'none'}, unknown "
             f"{[k.encode('utf-8', 'backslashreplace').decode()[:40] for k in unknown] or 'none'}")
    model, config = pre.model, pre.config
    stacks = _stacks(model)
    if config.input == "patches" or getattr(next(iter(stacks.values())), "embed", None) is None:
        fail("this checkpoint reads images: the step-through reads token ids")
    kinds = kinds_of(model)
    if body["kind"] not in kinds:
        fail(f'"kind" must be one of {", ".join(kinds)} for this model')
    ids = body["ids"]
    if not isinstance(ids, dict) or set(ids) != set(stacks):
        fail(f'"ids" must be an object with the token ids of {" and ".join(stacks)}, as the record gives them')
    vocab = {"encoder": config.vocab_size,
             "decoder": config.target_vocab_size if "encoder" in stacks else config.vocab_size}
    for name, row in ids.items():
        if not isinstance(row, list) or not 1 <= len(row) <= config.max_len:
            fail(f'"ids.{name}" must be a list of 1 to {config.max_len} token ids')
        if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab[name] for i in row):
            fail(f'"ids.{name}" must hold whole numbers from 0 to {vocab[name] - 1} (token ids)')
    stack = KIND_STACK[body["kind"]]
    limits = {"layer": len(stacks[stack].layers), "head": config.n_heads, "query": len(ids[stack])}
    for name, n in limits.items():
        value = body[name]
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < n:
            fail(f'"{name}" must be a whole number from 0 to {n - 1}')
    return {name: body[name] for name in fields}
