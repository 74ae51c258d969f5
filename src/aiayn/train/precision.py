"""The numeric precision of training (``train.dtype``): the autocast context of the forward pass, and float16's
loss scaling.

- ``float32``: no autocast, no scaling.
- ``bfloat16``: forward passes under ``torch.autocast(dtype=torch.bfloat16)``. bfloat16 has float32's range, so
  gradients need no scaling.
- ``float16``: forward passes under float16 autocast, and a dynamic :class:`torch.amp.GradScaler`: each loss is
  multiplied by the scale before backward, so that small gradients do not underflow; gradients are unscaled before
  clipping; a step whose gradients overflowed is skipped by the scaler, which then halves the scale. The scale is
  saved with the training state, so a resumed run continues with it.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch


class Precision:
    """Autocast and loss scaling for one run.

    Args:
        dtype: ``train.dtype``: ``"float32"``, ``"bfloat16"`` or ``"float16"``.
        device_type: where the parameters are (``"cpu"``, ``"cuda"``, ...), for autocast and the scaler.
    """

    def __init__(self, dtype: str, device_type: str) -> None:
        self.dtype = dtype
        self.device_type = device_type
        self.scaler = torch.amp.GradScaler(device_type, enabled=dtype == "float16")

    @property
    def scaling(self) -> bool:
        """True when losses are scaled (float16)."""
        return self.scaler.is_enabled()

    def autocast(self) -> contextlib.AbstractContextManager:
        """The context of a forward pass: autocast to ``dtype``, or nothing for float32."""
        if self.dtype == "float32":
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=getattr(torch, self.dtype))

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` () times the current scale (unchanged without scaling), ready for ``backward``."""
        return self.scaler.scale(loss)

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the gradients of ``optimizer``'s parameters by the scale (in place; a no-op without scaling)."""
        self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer.step()``, skipped by the scaler when the scaled gradients overflowed; then adjust the
        scale."""
        self.scaler.step(optimizer)
        self.scaler.update()

    def loss_scale(self) -> float | None:
        """The current scale, or None without scaling."""
        return self.scaler.get_scale() if self.scaling else None

    def state_dict(self) -> dict[str, Any] | None:
        """The scaler's state for the training state, or None without scaling."""
        return self.scaler.state_dict() if self.scaling else None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Continue from a saved :meth:`state_dict` (ignored without scaling, or when ``state`` is None)."""
        if self.scaling and state is not None:
            self.scaler.load_state_dict(state)
