"""The CUDA accelerator's substitute for :class:`~aiayn.models.stack.TransformerStack`: its decoding steps take the
static, compiled step (:mod:`aiayn.accel.cuda.decode_step`) where it applies, and the reference everywhere else."""

from __future__ import annotations

import torch
from torch import Tensor

from aiayn.accel.cuda.decode_step import StaticDecodeStep
from aiayn.accel.cuda.static_cache import StaticDecoderCache
from aiayn.accel.cuda.support import step_supports
from aiayn.models.stack import TransformerStack
from aiayn.nn.cache import DecoderCache


class StaticDecodingStack(TransformerStack):
    """:class:`~aiayn.models.stack.TransformerStack` whose caches are :class:`StaticDecoderCache` s and whose decoding
    steps (one new token per row, under ``torch.inference_mode``, no weights requested) run as
    :class:`~aiayn.accel.cuda.decode_step.StaticDecodeStep` where it applies
    (:func:`~aiayn.accel.cuda.support.step_supports`). Anything else first moves the cache back into the core's form
    and runs the reference. The compilation mode is the instance's ``static_compile`` (set by
    :func:`aiayn.accel.cuda.for_decoding`)."""

    def new_cache(self, capacity: int) -> DecoderCache:  # noqa: D102
        cache = super().new_cache(capacity)
        if type(cache) is DecoderCache and self.static_step() is not None:
            StaticDecoderCache.convert(cache)
        return cache

    def static_step(self) -> StaticDecodeStep | None:
        """The stack's static step, made on first use; None where the stack is not supported."""
        if "_static_step" not in self.__dict__:
            mode = self.__dict__.get("static_compile", "auto")
            self.__dict__["_static_step"] = StaticDecodeStep(self, mode) if step_supports(self) else None
        return self.__dict__["_static_step"]

    def forward(self, ids: Tensor | None, *, is_token: Tensor | None = None, positions: Tensor | None = None,
                attn_mask: Tensor | None = None, memory: Tensor | None = None,
                memory_is_token: Tensor | None = None, cache: DecoderCache | None = None,
                return_weights: bool = False, token_type_ids: Tensor | None = None,
                embeds: Tensor | None = None) -> tuple[Tensor, dict[str, list[Tensor]] | None]:  # noqa: D102
        if isinstance(cache, StaticDecoderCache):
            if (ids.shape[1] == 1 and is_token is None and attn_mask is None and token_type_ids is None
                    and not return_weights and torch.is_inference_mode_enabled()):
                step = self.static_step()
                out = step(cache, ids, positions, memory_is_token) if step is not None else None
                if out is not None:
                    return out, None
            cache.release()
        return super().forward(ids, is_token=is_token, positions=positions, attn_mask=attn_mask, memory=memory,
                               memory_is_token=memory_is_token, cache=cache, return_weights=return_weights,
                               token_type_ids=token_type_ids, embeds=embeds)

    def __getstate__(self) -> dict:
        """Copies and pickles leave the static step (its compiled function and buffers) behind."""
        state = super().__getstate__()
        state.pop("_static_step", None)
        return state
