"""The device a command or a training run uses: ``auto`` is CUDA where there is one, else the CPU."""

from __future__ import annotations

import torch


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    """``auto`` -> CUDA when available, else CPU. A CUDA device without an index becomes ``cuda:local_rank``, so
    each rank of a data-parallel run on one machine gets its own GPU."""
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank)
    return device
