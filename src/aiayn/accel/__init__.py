"""Optional acceleration, applied by one explicit call where it is wanted; the reference core never imports it.

    model = build_model(config)                  # the reference: nn.Linear, nn.Dropout, torch attention
    accelerate(model, "train")                   # the trainer, before its first step
    accelerate(model, "decode")                  # load_pretrained / the CLI, before decoding

:func:`accelerate` puts kernels into the core modules' named seams and packs linear layers, in place (same
parameters, same ``state_dict``); the core's own code still runs every layer, stack and decoding step, and
``print(model)`` and :func:`describe` name what is in use. One switch chooses: the ``accel`` argument, else the
``AIAYN_ACCEL`` environment variable, else ``"auto"``:

- ``"none"``: the reference core only;
- ``"auto"``: the accelerator for the model's device: the CPU's (:mod:`aiayn.accel.cpu`); on CUDA the core's torch
  kernels, and for decoding the core's step compiled with CUDA graphs (:mod:`aiayn.accel.compiled`).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

from torch import nn

from aiayn.errors import AiaynError

ENV_VAR = "AIAYN_ACCEL"
CHOICES = ("none", "auto")
PURPOSES = ("train", "decode")


def resolve(accel: str | None = None) -> str:
    """The acceleration setting in force: ``accel`` if given, else ``$AIAYN_ACCEL``, else "auto".

    Raises:
        AiaynError: a value that is not one of :data:`CHOICES`.
    """
    source = "--accel" if accel is not None else ENV_VAR
    value = (accel if accel is not None else os.environ.get(ENV_VAR, "auto")).strip().lower() or "auto"
    if value not in CHOICES:
        raise AiaynError(f"{source}={value!r}: choose one of {', '.join(CHOICES)}")
    return value


def accelerate(model: nn.Module, purpose: str, accel: str | None = None) -> nn.Module:
    """Apply the accelerator for ``model``'s device, in place, for ``purpose``; returns ``model``.

    Args:
        model: an aiayn model (:func:`aiayn.build_model`), on its final device and dtype.
        purpose: "train" (kernels that speed up training steps and keep their results up to float rounding) or
            "decode" (also the weight layouts and choosers of decoding; call it after the model is in eval mode).
        accel: "none" or "auto" (see :func:`resolve`).
    """
    if purpose not in PURPOSES:
        raise ValueError(f"purpose={purpose!r}: choose one of {PURPOSES}")
    if resolve(accel) == "none":
        return model
    param = next(model.parameters(), None)
    if param is None:
        return model
    if param.device.type == "cuda":  # the core's torch kernels, and a decoding step replayed as a CUDA graph
        from aiayn.accel.compiled import compile_decoding, unsupported  # lazy: entry point loads no accel submodule

        if purpose == "decode" and unsupported(model) is None:
            compile_decoding(model)
        return model
    if param.device.type != "cpu":
        return model
    from aiayn.accel import cpu  # lazy: entry point loads no accel submodule

    return cpu.for_training(model) if purpose == "train" else cpu.for_decoding(model)


def describe(model: nn.Module) -> dict[str, int]:
    """What of the accelerator runs in ``model``: the kernel in each seam (``"MultiHeadAttention.attention_kernel=
    cpu_attention_kernel"``) and each accelerator module (``"PackedLinear"``), with how many modules have it, the
    model's own ``decoding_scope`` last; empty for the reference core."""
    counts: dict[str, int] = {}

    def count(key: str) -> None:
        counts[key] = counts.get(key, 0) + 1

    compiler = getattr(model, "step_compiler", None)
    if compiler is not None:
        count(f"decoding step={compiler!r}")
    for m in [*model.modules()][1:] + [model]:  # the model's own seam (the scope around a step) last
        if type(m).__module__.startswith("aiayn.accel."):
            count(type(m).__name__)
        for seam in SEAMS.get(type(m).__name__, ()):
            kernel = getattr(m, seam, None)
            if kernel is not None:
                count(f"{type(m).__name__}.{seam}={getattr(kernel, '__name__', type(kernel).__name__)}")
    return counts


#: the kernel seams of the core, by module class name (attributes that are None in the reference)
SEAMS = {"MultiHeadAttention": ("attention_kernel",),
         "LMHead": ("loss_kernel", "greedy_kernel", "row_top_kernel"),
         **{model: ("decoding_scope",) for model in ("EncoderDecoderModel", "DecoderModel", "EncoderModel")}}


def setup_process(accel: str | None = None) -> bool:
    """Process-wide settings for a process that aiayn owns (the ``aiayn`` command, its training workers): with
    acceleration on, freed memory is kept for reuse (:mod:`aiayn.accel.cpu.allocator`). Returns whether it applied."""
    if resolve(accel) == "none":
        return False
    from aiayn.accel.cpu import allocator  # lazy: entry point loads no accel submodule

    return allocator.keep_freed_memory()


def release_workspace() -> None:
    """Free the accelerator's per-thread training buffers (the fused loss's), e.g. when training ends; they are made
    again on next use."""
    fused_loss = sys.modules.get("aiayn.accel.cpu.fused_loss")
    if fused_loss is not None:
        fused_loss.release_workspace()


def compile_decoding(model: nn.Module, mode: str | None = None, backend: str = "inductor") -> nn.Module:
    """Decode with ``torch.compile`` of the core's step over a static cache
    (:func:`aiayn.accel.compiled.compile_decoding`)."""
    from aiayn.accel.compiled import compile_decoding as compile_step  # lazy: entry point loads no accel submodule

    return compile_step(model, mode, backend)


def quantize_int8(model: nn.Module) -> nn.Module:
    """An int8 copy of ``model`` for CPU inference (:func:`aiayn.accel.cpu.quantize.quantize_int8`)."""
    from aiayn.accel.cpu.quantize import quantize_int8 as quantize  # lazy: entry point loads no accel submodule

    return quantize(model)


def native_kernels_available() -> bool:
    """Whether the CPU accelerator's compiled kernels are built and on here (a C compiler was found)."""
    from aiayn.accel.cpu import native  # lazy: entry point loads no accel submodule

    return native.library() is not None


@contextlib.contextmanager
def native_kernels(on: bool) -> Iterator[None]:
    """The CPU accelerator's compiled kernels on or off for the block (off: its torch paths, the same numerics)."""
    from aiayn.accel.cpu.settings import overridden  # lazy: entry point loads no accel submodule

    with overridden(native=on):
        yield
