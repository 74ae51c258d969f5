"""The learner's own pieces in a whole aiayn encoder-decoder, trained on the copy task: their Transformer learning.

A small encoder-decoder (aiayn's embeddings, linear layers, norms and output layer) runs its attention, masks, heads,
positions, feed-forward networks and residual connections through the learner's functions wherever the learner gave
one, and aiayn's reference functions elsewhere; the learner's learning-rate schedule and loss train it when given.
It learns to copy random sequences of 8 symbols in a few hundred steps (seconds on a CPU); a broken piece shows as a
model that does not learn, or one that learns to read the answer while training and then fails to decode.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.errors import AiaynError
from aiayn.learn.checking import CheckResult, check_function, one_thread
from aiayn.learn.exercises import EXERCISES
from aiayn.models.build import build_model
from aiayn.nn.attention import MultiHeadAttention
from aiayn.nn.layers import TransformerLayer
from aiayn.nn.positions import sinusoidal_table

PAD, BOS, EOS, SPECIAL = 0, 1, 2, 5
N_SYMBOLS, LENGTH, BATCH, HELD_OUT = 8, 6, 64, 200
D_MODEL, WARMUP, LR_FACTOR = 32, 40, 0.1  # lr(step) = LR_FACTOR * noam_lr(step, D_MODEL, WARMUP)
LABEL_SMOOTHING = 0.1


# ---------------------------------------------------------------------------------------------- reference pieces
def _attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    w = torch.softmax(scores, dim=-1)
    if mask is not None:
        w = w.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)  # a row with no allowed key: zeros
    return w @ v


def _causal_mask(t: int, s: int | None = None) -> Tensor:
    s = t if s is None else s
    return torch.arange(s)[None, :] <= torch.arange(s - t, s)[:, None]  # (T, S)


def _split_heads(x: Tensor, n_heads: int) -> Tensor:
    b, t, d = x.shape
    return x.view(b, t, n_heads, d // n_heads).transpose(1, 2)  # (B, T, D) -> (B, H, T, Dh)


def _merge_heads(x: Tensor) -> Tensor:
    b, h, t, dh = x.shape
    return x.transpose(1, 2).reshape(b, t, h * dh)  # (B, H, T, Dh) -> (B, T, D)


def _feed_forward(x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor) -> Tensor:
    return F.linear(F.relu(F.linear(x, w1, b1)), w2, b2)


def _sublayer(x: Tensor, f: Callable[[Tensor], Tensor], norm: nn.Module, pre_norm: bool) -> Tensor:
    return x + f(norm(x)) if pre_norm else norm(x + f(x))


def _noam_lr(step: int, d_model: int, warmup: int) -> float:
    return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def _label_smoothed_loss(logits: Tensor, labels: Tensor, epsilon: float) -> Tensor:
    return F.cross_entropy(logits, labels, ignore_index=-100, label_smoothing=epsilon)


#: the pieces a learner may plug in (exercise names), with aiayn's versions (each equal to the exercise's
#: reference; held so by the tests) filling in the rest
REFERENCE_PIECES: dict[str, Callable[..., Any]] = {
    "masked_attention": _attention, "causal_mask": _causal_mask, "split_heads": _split_heads,
    "merge_heads": _merge_heads, "sinusoidal": sinusoidal_table, "feed_forward": _feed_forward,
    "sublayer": _sublayer, "noam_lr": _noam_lr, "label_smoothed_loss": _label_smoothed_loss,
}


class PieceError(AiaynError):
    """A learner's piece raised while the model was built, trained or decoded."""


def _guarded(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, with an exception it raises turned into a :class:`PieceError` that names the piece."""
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise PieceError(f"your {name} raised {type(e).__name__}: {e}; learn.check({name!r}, {name}) shows "
                             "where it differs from aiayn's") from e

    return call


# ---------------------------------------------------------------------------------------------- the model
class LearnerAttention(nn.Module):
    """Multi-head attention with aiayn's projections (an existing :class:`MultiHeadAttention`'s weights) and the
    learner's ``split_heads``, ``causal_mask``, ``masked_attention`` and ``merge_heads``. Same call as the module it
    wraps (no KV cache: decoding here recomputes the prefix)."""

    def __init__(self, mha: MultiHeadAttention, pieces: dict[str, Callable[..., Any]]) -> None:
        super().__init__()
        self.mha, self.pieces = mha, pieces

    def forward(self, x: Tensor, memory: Tensor | None = None, *, mask: Tensor | None = None, is_causal: bool = False,
                **_: Any) -> tuple[Tensor, None]:
        """x (B, T, D), memory (B, S, D) for cross-attention -> (B, T, D), None."""
        m, p = self.mha, self.pieces
        d, h = x.shape[-1], m.n_heads
        if m.cross:
            q = p["split_heads"](m.q_proj(x), h)
            k, v = m.kv_proj(memory).split(d, dim=-1)  # (B, S, D) each
        else:
            q, k, v = m.qkv_proj(x).split(d, dim=-1)  # (B, T, D) each
            q = p["split_heads"](q, h)  # (B, H, T, Dh)
        k, v = p["split_heads"](k, h), p["split_heads"](v, h)  # (B, H, S, Dh)
        if is_causal:
            causal = p["causal_mask"](q.shape[2], k.shape[2])
            mask = causal if mask is None else mask & causal
        out = p["masked_attention"](q, k, v, mask)  # (B, H, T, Dh)
        return m.out_proj(p["merge_heads"](out)), None


class LearnerLayer(nn.Module):
    """A :class:`TransformerLayer`'s weights run through the learner's ``sublayer`` and ``feed_forward``."""

    def __init__(self, layer: TransformerLayer, pieces: dict[str, Callable[..., Any]], pre_norm: bool) -> None:
        super().__init__()
        self.layer, self.pieces, self.pre_norm = layer, pieces, pre_norm
        layer.self_attn = LearnerAttention(layer.self_attn, pieces)
        if layer.cross_attn is not None:
            layer.cross_attn = LearnerAttention(layer.cross_attn, pieces)

    def forward(self, x: Tensor, *, mask: Tensor | None = None, is_causal: bool = False,
                memory: Tensor | None = None, memory_mask: Tensor | None = None, **_: Any) -> tuple[Tensor, None, None]:
        """x (B, T, D) -> (B, T, D), None, None (as :meth:`TransformerLayer.forward`)."""
        lay, sub, ffn = self.layer, self.pieces["sublayer"], self.layer.ffn
        x = sub(x, lambda h: lay.self_attn(h, mask=mask, is_causal=is_causal)[0], lay.self_res.norm, self.pre_norm)
        if lay.cross_attn is not None:
            x = sub(x, lambda h: lay.cross_attn(h, memory, mask=memory_mask)[0], lay.cross_res.norm, self.pre_norm)
        def feed_forward(h: Tensor) -> Tensor:
            return self.pieces["feed_forward"](h, ffn.w_in.weight, ffn.w_in.bias, ffn.w_out.weight, ffn.w_out.bias)

        return sub(x, feed_forward, lay.ffn_res.norm, self.pre_norm), None, None


def copy_config(norm_position: str = "post") -> ModelConfig:
    """The copy task's model: 1 + 1 layers, width 32, 2 heads, sinusoidal positions, no dropout."""
    return ModelConfig.preset("tiny", vocab_size=SPECIAL + N_SYMBOLS, d_model=D_MODEL, n_heads=2, d_ff=64,
                              n_layers=1, dropout=0.0, max_len=16, norm_position=norm_position, name="copy")


def build_learner_model(pieces: dict[str, Callable[..., Any]], seed: int = 0, norm_position: str = "post"
                        ) -> nn.Module:
    """An aiayn encoder-decoder for the copy task whose layers run ``pieces`` (every name of
    :data:`REFERENCE_PIECES` but the schedule and the loss)."""
    config = copy_config(norm_position)
    torch.manual_seed(seed)
    model = build_model(config)
    table = pieces["sinusoidal"](config.max_len, config.d_model)
    if not isinstance(table, Tensor) or tuple(table.shape) != (config.max_len, config.d_model):
        got = tuple(table.shape) if isinstance(table, Tensor) else type(table).__name__
        raise PieceError(f"your sinusoidal({config.max_len}, {config.d_model}) gave {got}; expected a tensor of "
                         f"shape ({config.max_len}, {config.d_model})")
    for stack in (model.encoder, model.decoder):
        stack.abs_pos.table = table.detach().float().clone()
        stack.layers = nn.ModuleList(LearnerLayer(layer, pieces, norm_position == "pre") for layer in stack.layers)
    return model


# ---------------------------------------------------------------------------------------------- data, training
def copy_batch(generator: torch.Generator, n: int) -> tuple[Tensor, Tensor, Tensor]:
    """n random sequences: src (n, L), the decoder's input [BOS] + src (n, L + 1), labels src + [EOS]."""
    src = torch.randint(SPECIAL, SPECIAL + N_SYMBOLS, (n, LENGTH), generator=generator)
    tgt_in = torch.cat([torch.full((n, 1), BOS), src], dim=1)
    labels = torch.cat([src, torch.full((n, 1), EOS)], dim=1)
    return src, tgt_in, labels


@torch.no_grad()
def greedy_copy(model: nn.Module, src: Tensor) -> Tensor:
    """Greedy decoding of LENGTH tokens, the whole prefix recomputed each step: src (B, L) -> (B, L)."""
    model.eval()
    tgt = torch.full((src.shape[0], 1), BOS)
    for _ in range(src.shape[1]):
        logits = model(src, tgt).logits[:, -1]  # (B, V)
        logits[:, [PAD, BOS]] = float("-inf")
        tgt = torch.cat([tgt, logits.argmax(-1, keepdim=True)], dim=1)
    model.train()
    return tgt[:, 1:]


def train_copy(model: nn.Module, pieces: dict[str, Callable[..., Any]], steps: int, seed: int = 0
               ) -> list[float]:
    """Train ``model`` on the copy task with Adam (0.9, 0.98, 1e-9), the learning rate ``LR_FACTOR * noam_lr(step,
    D_MODEL, WARMUP)`` and ``label_smoothed_loss`` (epsilon 0.1) from ``pieces``; returns each step's loss."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    generator = torch.Generator().manual_seed(seed)
    losses: list[float] = []
    model.train()
    for step in range(1, steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = LR_FACTOR * float(pieces["noam_lr"](step, D_MODEL, WARMUP))
        src, tgt_in, labels = copy_batch(generator, BATCH)
        logits = model(src, tgt_in).logits  # (B, L + 1, V)
        loss = pieces["label_smoothed_loss"](logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                             LABEL_SMOOTHING)
        losses.append(float(loss.detach()))
        if not math.isfinite(losses[-1]):
            break
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    return losses


def loss_floor() -> float:
    """The smallest label-smoothed loss there is: the entropy of the smoothed target (1 - eps) one-hot + eps / V."""
    v = SPECIAL + N_SYMBOLS
    p_true, p_other = 1 - LABEL_SMOOTHING + LABEL_SMOOTHING / v, LABEL_SMOOTHING / v
    return -(p_true * math.log(p_true) + (v - 1) * p_other * math.log(p_other))


def trained_copy_model(steps: int = 300, seed: int = 0) -> nn.Module:
    """aiayn's own copy-task model (its reference modules throughout), trained ``steps`` steps: a small trained
    model to look inside (the explorer records its attention)."""
    with one_thread(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_model(copy_config())
        train_copy(model, REFERENCE_PIECES, steps, seed)
    return model.eval()


# ---------------------------------------------------------------------------------------------- assemble
@dataclass
class Assembled:
    """A learner's Transformer after training on the copy task. ``repr`` is the report."""

    model: nn.Module
    yours: list[str]
    checks: dict[str, CheckResult] = field(default_factory=dict)
    losses: list[float] = field(default_factory=list)
    exact_match: float = 0.0
    seconds: float = 0.0
    examples: list[tuple[list[int], list[int]]] = field(default_factory=list)

    @property
    def learned(self) -> bool:
        """Whether it copies at least 90% of the held-out sequences exactly."""
        return self.exact_match >= 0.9

    def report(self) -> str:
        """What was plugged in, what the checks said, how training went, and what it means."""
        given = ", ".join(self.yours) if self.yours else "none (every piece is aiayn's)"
        lines = [f"your pieces: {given}"]
        for name, result in self.checks.items():
            verdict = "passes" if result.passed else "differs: " + ("; ".join(result.titles) or "see learn.check")
            lines.append(f"  {name}: {verdict}")
        first, last = (self.losses[0], self.losses[-1]) if self.losses else (float("nan"), float("nan"))
        lines.append(f"trained {len(self.losses)} steps in {self.seconds:.1f} s: loss {first:.2f} -> {last:.3f}; "
                     f"copies {self.exact_match:.0%} of {HELD_OUT} held-out sequences exactly")
        for src, out in self.examples[:3]:
            lines.append(f"  {' '.join(map(str, src))}  ->  {' '.join(map(str, out))}")
        if self.learned:
            lines.append("your Transformer learned to copy")
        elif not math.isfinite(last):
            lines.append("the loss became NaN or infinite: a piece produces NaN (a fully masked row?)")
        elif last < loss_floor() + 0.3:
            lines.append("the training loss is low but decoding fails: the model read the answer while training. A "
                         "decoder that sees the token it must predict (a causal mask off by one, or none) learns to "
                         "copy its input instead of predicting the next token")
        else:
            lines.append("it did not learn to copy: a piece differs from aiayn's (the checks above say which)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.report()

    def plot(self, ax: Any = None) -> Any:
        """The training loss per step (matplotlib); returns the axes."""
        import matplotlib.pyplot as plt  # optional: matplotlib

        if ax is None:
            _, ax = plt.subplots(figsize=(4.5, 2.8))
        ax.plot(range(1, len(self.losses) + 1), self.losses)
        ax.set_xlabel("step")
        ax.set_ylabel("training loss")
        ax.set_title(f"copy task: {self.exact_match:.0%} exact")
        return ax


def _collect(pieces: Mapping[str, Any] | ModuleType | None, named: dict[str, Any]) -> dict[str, Callable[..., Any]]:
    """The learner's pieces: from ``pieces`` (a namespace: only the names of :data:`REFERENCE_PIECES` are taken) and
    ``named`` (each must be one of those names)."""
    unknown = sorted(set(named) - set(REFERENCE_PIECES))
    if unknown:
        raise AiaynError(f"assemble() got {', '.join(unknown)}; the pieces it takes are "
                         f"{', '.join(REFERENCE_PIECES)}")
    space = vars(pieces) if isinstance(pieces, ModuleType) else dict(pieces or {})
    chosen = {name: space[name] for name in REFERENCE_PIECES if callable(space.get(name))}
    chosen.update(named)
    for name, fn in chosen.items():
        if not callable(fn):
            raise AiaynError(f"assemble({name}=...) needs a function, got {type(fn).__name__}")
    return chosen


def assemble(pieces: Mapping[str, Any] | ModuleType | None = None, /, *, steps: int = 300, seed: int = 0,
             check: bool = True, norm_position: str = "post", verbose: bool = False, **named: Any) -> Assembled:
    """Plug the learner's pieces into an aiayn encoder-decoder and train it on the copy task.

    Args:
        pieces: a namespace holding the learner's functions by exercise name (``globals()``, a module); only the
            names of :data:`REFERENCE_PIECES` are taken.
        steps: training steps (300 take a few seconds on one CPU core).
        seed: the model's initialization and the data's seed.
        check: run ``check`` on each piece first (not recorded in the progress file).
        norm_position: "post" (the paper's) or "pre": how ``sublayer`` is called.
        verbose: print the report when done.
        **named: pieces by name, e.g. ``masked_attention=my_attention``.
    Returns:
        :class:`Assembled`: the model, each piece's check, the losses, and the held-out exact match.
    Raises:
        PieceError: a piece raised while building, training or decoding (named, with its message).
    """
    if norm_position not in ("post", "pre"):
        raise AiaynError(f"norm_position={norm_position!r}: choose 'post' (the paper's) or 'pre'")
    chosen = _collect(pieces, named)
    t0 = time.perf_counter()
    with one_thread(), torch.random.fork_rng(devices=[]):
        checks = {name: check_function(EXERCISES[name], fn, seed) for name, fn in chosen.items()} if check else {}
        active = {**REFERENCE_PIECES, **{name: _guarded(name, fn) for name, fn in chosen.items()}}
        model = build_learner_model(active, seed, norm_position)
        losses = train_copy(model, active, steps, seed)
        held = copy_batch(torch.Generator().manual_seed(10_000 + seed), HELD_OUT)[0]
        out = greedy_copy(model, held)
    exact = float((out == held).all(dim=1).float().mean())
    examples = [([s - SPECIAL for s in a], [s - SPECIAL for s in b]) for a, b in zip(held[:3].tolist(),
                                                                                    out[:3].tolist())]
    result = Assembled(model, list(chosen), checks, losses, exact, time.perf_counter() - t0, examples)
    if verbose:
        print(result.report())
    return result
