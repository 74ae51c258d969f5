"""The CPU accelerator's substitutes for core modules: each is a subclass that changes how, never what, is computed.

They are put in place by assigning the class of an existing module (:func:`substitute`), so parameters, buffers,
ties and ``state_dict`` stay as they are, and ``print(model)`` names them. Each runs the core's code wherever its
fast path does not apply.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from aiayn.accel.cpu import native
from aiayn.accel.cpu.fast_step import FastDecoderStep, FastEncoder
from aiayn.accel.cpu.functional import cpu_attention_kernel, feed_forward
from aiayn.accel.cpu.packed import frozen_block
from aiayn.accel.cpu.support import attention_supports, cache_supports, step_supports
from aiayn.models.heads import LMHead, RowTop
from aiayn.models.stack import TransformerStack
from aiayn.nn.attention import MultiHeadAttention, scaled_dot_product_attention
from aiayn.nn.cache import DecoderCache
from aiayn.nn.feedforward import FeedForward


class CPUMultiHeadAttention(MultiHeadAttention):
    """:class:`~aiayn.nn.attention.MultiHeadAttention` whose fused backend uses :func:`cpu_attention_kernel`."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None, bias: Tensor | None, is_causal: bool,
               return_weights: bool) -> tuple[Tensor, Tensor | None]:  # noqa: D102 - as MultiHeadAttention.attend
        if not attention_supports(self):
            return super().attend(q, k, v, mask=mask, bias=bias, is_causal=is_causal, return_weights=return_weights)
        return scaled_dot_product_attention(
            q, k, v, mask=mask, bias=bias, dropout_p=self.dropout if self.training else 0.0, backend=self.backend,
            return_weights=return_weights, is_causal=is_causal, scale=self.scale, kernel=cpu_attention_kernel)


class CPUFeedForward(FeedForward):
    """:class:`~aiayn.nn.feedforward.FeedForward` whose activation is fused into a packed product at inference."""

    def forward(self, x: Tensor) -> Tensor:  # noqa: D102 - as FeedForward.forward
        if self.training:
            return super().forward(x)
        return feed_forward(self, x, self.w_in, self.w_out)


class CPUDecodingStack(TransformerStack):
    """:class:`~aiayn.models.stack.TransformerStack` whose decoding steps (one new token per row, with a cache, at
    inference) run as one flat program (:class:`~aiayn.accel.cpu.fast_step.FastDecoderStep`), and whose encoder pass
    at inference runs as native layers (:class:`~aiayn.accel.cpu.fast_step.FastEncoder`), where they apply
    (:func:`~aiayn.accel.cpu.support.step_supports`, a decoding scope, no hooks, no weights requested)."""

    def forward(self, ids: Tensor | None, *, is_token: Tensor | None = None, positions: Tensor | None = None,
                attn_mask: Tensor | None = None, memory: Tensor | None = None,
                memory_is_token: Tensor | None = None, cache: DecoderCache | None = None,
                return_weights: bool = False, token_type_ids: Tensor | None = None,
                embeds: Tensor | None = None) -> tuple[Tensor, dict[str, list[Tensor]] | None]:  # noqa: D102
        fast_ok = (not return_weights and attn_mask is None and token_type_ids is None and embeds is None
                   and not torch.is_grad_enabled() and not self.training)
        if fast_ok and cache is not None and ids.shape[1] == 1 and is_token is None and cache_supports(cache):
            step = self._for_block("_fast_step", FastDecoderStep.build)
            if step is not None:
                if memory is not None and cache.cross_attn and cache.cross_attn[0].k is None:
                    self.project_memory(memory, cache)
                if step.ready(cache):
                    return step(ids, cache, positions=positions, memory_is_token=memory_is_token)[:, None], None
        if fast_ok and cache is None and not self.causal and positions is None and memory is None:
            encoder = self._for_block("_fast_encoder", FastEncoder.build)
            if encoder is not None:
                if is_token is None:
                    is_token = ids != self.config.pad_id
                out = encoder(ids, is_token)
                if out is not None:
                    return out, None
        return super().forward(ids, is_token=is_token, positions=positions, attn_mask=attn_mask, memory=memory,
                               memory_is_token=memory_is_token, cache=cache, return_weights=return_weights,
                               token_type_ids=token_type_ids, embeds=embeds)

    def new_cache(self, capacity: int) -> DecoderCache:
        """The full KV cache where the core would roll a sliding window's (:meth:`TransformerStack.new_cache`): the
        flat decoding step takes it, and its outputs equal the rolling cache's (tests/consistency/
        test_rolling_cache.py). Memory then grows with the decoded length, not with the window."""
        c = self.config
        if c.attention != "linear" and c.sliding_window is not None and step_supports(self):
            return DecoderCache(len(self.layers), capacity, cross=self.cross)
        return super().new_cache(capacity)

    def _for_block(self, name: str, build: Callable[[TransformerStack], object]) -> object:
        """``build(self)``, made once per :func:`~aiayn.accel.cpu.packed.frozen_weights` block (a decoding scope) and
        kept under ``name``; None where the stack is not supported (:func:`~aiayn.accel.cpu.support.step_supports`)."""
        block = frozen_block()
        built = self.__dict__.get(name)  # (block, what was built, or None)
        if built is None or built[0] != block:
            built = self.__dict__[name] = (block, build(self) if step_supports(self) else None)
        return built[1]

    def __getstate__(self) -> dict:
        """Copies and pickles leave the decoding scope's step and encoder pass behind."""
        state = super().__getstate__()
        state.pop("_fast_step", None)
        state.pop("_fast_encoder", None)
        return state


class CPULMHead(LMHead):
    """:class:`~aiayn.models.heads.LMHead` with fused CPU forms of what is computed from its logits: the training loss
    projects and scores in chunks (:func:`~aiayn.accel.cpu.fused_loss.linear_label_smoothed_nll`), greedy decoding
    screens the output layer (:class:`~aiayn.accel.cpu.screened_argmax.GreedyHead`), and beam search takes each row's
    best tokens in two native passes (:func:`aiayn.accel.cpu.native.row_top`). The head's ``scale`` multiplies the
    hidden states before each, as in the reference; an output layer with a bias takes the reference loss, and greedy
    search computes its full logits (:func:`~aiayn.accel.cpu.screened_argmax.screen_for`)."""

    def loss(self, h: Tensor, labels: Tensor, label_smoothing: float = 0.0) -> tuple[Tensor, Tensor, Tensor]:  # noqa: D102
        from aiayn.accel.cpu.fused_loss import linear_label_smoothed_nll

        weight = self.proj.weight
        if not isinstance(weight, Tensor) or h.device.type != "cpu" or self.proj.bias is not None:
            return super().loss(h, labels, label_smoothing)
        return linear_label_smoothed_nll(h * self.scale if self.scale != 1.0 else h, weight, labels, label_smoothing)

    def greedy_chooser(self, banned_ids: Sequence[int] = ()) -> Callable[[Tensor], Tensor]:  # noqa: D102
        from aiayn.accel.cpu.screened_argmax import GreedyHead

        head = GreedyHead(self.proj, banned_ids)
        if self.scale == 1.0:
            return head
        scale, weight = self.scale, self.proj.weight

        def choose(h: Tensor) -> Tensor:  # h (N, D) -> (N,): in the weight's dtype, then scaled, as LMHead's own
            if isinstance(weight, Tensor) and weight.is_floating_point() and h.dtype != weight.dtype:
                h = h.to(weight.dtype)
            return head(h * scale)

        return choose

    def row_top(self, logits: Tensor, banned_ids: Sequence[int], n: int) -> RowTop:  # noqa: D102
        if native.library() is None or not native.cpu_fp32(logits):
            return super().row_top(logits, banned_ids, n)
        n = min(n, logits.shape[-1])
        banned_mask = None  # (V,) bool
        if banned_ids:
            banned_mask = torch.zeros(logits.shape[-1], dtype=torch.bool)
            banned_mask[list(banned_ids)] = True

        def top(logits: Tensor, eos_id: int | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
            top_lp, top_tok, lse = native.row_top(logits, n, banned_mask)
            return top_lp, top_tok, None if eos_id is None else logits[:, eos_id:eos_id + 1] - lse[:, None]

        return top


#: core class -> its substitute, for :func:`substitute`
SUBSTITUTES: dict[type[nn.Module], type[nn.Module]] = {
    MultiHeadAttention: CPUMultiHeadAttention,
    FeedForward: CPUFeedForward,
    TransformerStack: CPUDecodingStack,
    LMHead: CPULMHead,
}


def substitute(model: nn.Module, kinds: Sequence[type[nn.Module]]) -> nn.Module:
    """Give every module of ``model`` whose class is exactly one of ``kinds`` its substitute's class, in place.

    A module of a user's own subclass is left alone: its changes may be what the substitute would skip.
    """
    for m in model.modules():
        cls = type(m)
        if cls in kinds:
            m.__class__ = SUBSTITUTES[cls]
    return model
