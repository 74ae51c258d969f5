"""Attention weights from the forward pass that computes the output, whatever kernel computes it.

The reference attention can return its weights, but the fused kernels (torch's SDPA, the CPU accelerator's
decoding step) cannot. :func:`capture_attention` gives the chosen attention modules a *recorder*: each forward
pass then also evaluates ``softmax(q k^T * scale + bias, masked)`` from the queries and keys that pass used
(:func:`aiayn.nn.attention.attention_weights`, the reference's own formula) and hands it over with the mask it
applied. The output still comes from the fast kernel; only the recorded layers pay for the weights.

Names are the modules' paths: ``encoder.layers.0.self_attn``, ``decoder.layers.2.cross_attn``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from torch import Tensor, nn

from aiayn.nn.attention import MultiHeadAttention

#: the record kinds: a stack's self-attention, and a decoder's attention over the encoder's output
KINDS = {"encoder.self_attn": "encoder", "decoder.self_attn": "decoder", "decoder.cross_attn": "cross"}


@dataclass
class Call:
    """One forward pass of one attention module.

    Attributes:
        weights: (B, H, T, S) float32 attention weights (rows: queries; a masked key has weight exactly 0).
        allowed: bool (B|1, H|1, T, S), True where a query may attend: the mask the pass applied (padding,
            causal, window, pattern) with rows that had no allowed key left all False; None where every key was
            allowed.
        bias: the additive position bias (B|1, H, T, S) of ALiBi or T5, or None.
    """

    weights: Tensor
    allowed: Tensor | None
    bias: Tensor | None


@dataclass
class AttentionCapture:
    """What :func:`capture_attention` recorded: every call of every chosen module, in order, by module name."""

    calls: dict[str, list[Call]] = field(default_factory=dict)

    def kind(self, kind: str) -> list[list[Call]]:
        """The calls of one kind ("encoder", "decoder", "cross") by layer: ``[layer][call]``."""
        layers = sorted((_layer_of(name), calls) for name, calls in self.calls.items() if _kind_of(name) == kind)
        return [calls for _, calls in layers]



def attention_modules(model: nn.Module) -> dict[str, MultiHeadAttention]:
    """Every attention module of ``model`` by its path (``decoder.layers.0.self_attn``, ...)."""
    return {name: m for name, m in model.named_modules() if isinstance(m, MultiHeadAttention)}


def _kind_of(name: str) -> str | None:
    """A module path's record kind ("encoder", "decoder", "cross"; None for another attention module)."""
    return KINDS.get(f"{name.split('.')[0]}.{name.split('.')[-1]}")


def _layer_of(name: str) -> int | None:
    parts = name.split(".")
    return int(parts[2]) if len(parts) > 2 and parts[1] == "layers" and parts[2].isdigit() else None


@contextmanager
def capture_attention(model: nn.Module, layers: Iterable[int] | None = None,
                      kinds: Iterable[str] | None = None) -> Iterator[AttentionCapture]:
    """Record the attention weights of ``model``'s forward passes inside the ``with`` block.

    Args:
        model: any aiayn model (reference or accelerated).
        layers: the layer indices to record (default all); the others run as usual, without the extra cost.
        kinds: "encoder", "decoder" and/or "cross" (default all).
    Yields:
        an :class:`AttentionCapture` that fills as the model runs (decoding steps included: one call per step).
    """
    wanted_layers = None if layers is None else set(layers)
    wanted_kinds = set(KINDS.values()) if kinds is None else set(kinds)
    capture = AttentionCapture()
    chosen: list[MultiHeadAttention] = []
    for name, module in attention_modules(model).items():
        kind = _kind_of(name)
        layer = _layer_of(name)
        if kind not in wanted_kinds or (wanted_layers is not None and layer not in wanted_layers):
            continue
        if module.recorder is not None:
            raise RuntimeError(f"{name} is already recording attention: capture_attention blocks do not nest")
        calls: list[Call] = capture.calls.setdefault(name, [])
        module.recorder = lambda w, allowed, bias, calls=calls: calls.append(Call(w.detach().float(), allowed, bias))
        chosen.append(module)
    try:
        yield capture
    finally:
        for module in chosen:
            module.recorder = None
