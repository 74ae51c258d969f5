"""A compiled decoding step: ``torch.compile`` of the core's own step over a static KV cache (gpt-fast's way).

:func:`compile_decoding` gives a model a ``step_compiler``; the steppers (:mod:`aiayn.generate.steppers`) then run
the compiled version of their one-token step (:func:`~aiayn.generate.steppers.lm_step`,
:func:`~aiayn.generate.steppers.seq2seq_step`) and make a cache addressed by slot, whose shapes and addresses do
not change from step to step (:class:`aiayn.nn.cache.DecoderCache` with ``static=True``). The prefill and the
encoder run eagerly. On CUDA, mode "reduce-overhead" replays the step as a CUDA graph. On CPU the compiled step is
slower than the eager one with the CPU kernels (docs/performance.md), so :func:`aiayn.accel.accelerate` compiles on
CUDA only; this function does it anywhere it is asked.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from aiayn.accel import describe

Step = Callable[..., torch.Tensor]


def unsupported(model: nn.Module) -> str | None:
    """Why ``model``'s decoding step cannot be compiled over a static cache, or None when it can."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "new_cache"):
        return f"{type(model).__name__} does not decode"
    if config.attention == "linear":
        return "linear attention keeps a running state, not a static KV cache"
    if config.attention_mask != "dense":
        return f"attention_mask={config.attention_mask!r} is made per length, not per slot"
    kernels = [name for name in describe(model) if not name.startswith("decoding step=")]
    if kernels:
        return (f"the CPU accelerator's kernels ({', '.join(kernels)}) do not trace; compile the reference core "
                "(accel 'none')")
    return None


class StepCompiler:
    """``model.step_compiler``: compiles each step function once per model (after a batch size or capacity changes
    once, dynamo makes them symbolic rather than compile every size); a step whose compilation fails runs eagerly
    from then on, after one warning."""

    def __init__(self, mode: str | None, backend: str) -> None:
        self.mode, self.backend = mode, backend
        self.__name__ = f"torch.compile(backend={backend!r}, mode={mode!r})"
        self._compiled: dict[Step, Step] = {}

    def __call__(self, step: Step) -> Step:
        if step not in self._compiled:
            compiled = torch.compile(step, fullgraph=True, mode=self.mode, backend=self.backend)
            self._compiled[step] = self._guarded(step, compiled)
        return self._compiled[step]

    def _guarded(self, step: Step, compiled: Step) -> Step:
        state = {"run": compiled}

        def run(*args: Any) -> torch.Tensor:
            try:
                return state["run"](*args)
            except Exception as e:  # noqa: BLE001  (a compiler bug must not stop decoding)
                if state["run"] is step:
                    raise
                warnings.warn(f"the compiled decoding step failed ({type(e).__name__}: {str(e)[:200]}); "
                              "decoding continues eagerly", RuntimeWarning, stacklevel=2)
                state["run"] = step
                return step(*args)

        run.__name__ = getattr(step, "__name__", "step")
        return run

    def __repr__(self) -> str:
        return self.__name__


def compile_decoding(model: nn.Module, mode: str | None = None, backend: str = "inductor") -> nn.Module:
    """Decode ``model`` with a compiled one-token step over a static cache, in place; returns ``model``.

    Args:
        model: a decoder-only or encoder-decoder aiayn model.
        mode: ``torch.compile``'s mode; None picks "reduce-overhead" (CUDA graphs) on CUDA, the default elsewhere.
        backend: ``torch.compile``'s backend ("inductor"; "aot_eager" traces without generating code).
    Raises:
        ValueError: a model whose step cannot be compiled (:func:`unsupported` says why).
    """
    reason = unsupported(model)
    if reason is not None:
        raise ValueError(f"cannot compile the decoding step: {reason}")
    if mode is None:
        param = next(model.parameters(), None)
        mode = "reduce-overhead" if param is not None and param.device.type == "cuda" else None
    model.step_compiler = StepCompiler(mode, backend)
    return model


def uncompiled(model: nn.Module) -> nn.Module:
    """Undo :func:`compile_decoding`: eager steps over the cache addressed by position again."""
    model.__dict__.pop("step_compiler", None)
    return model
