"""The CPU accelerator's internal switches, for tests and benchmarks that compare its paths.

Users have one switch, ``--accel none|auto`` (:mod:`aiayn.accel`); these choose among the accelerator's own paths
and are never read from the environment, so a run's numerics depend on the code and the host's C compiler only.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass
class Settings:
    """Attributes:
        native: use the compiled kernels (:mod:`aiayn.accel.cpu.native`) where they can be built.
        fp32_gemm: fp32 product library, "auto" (per CPU vendor), "onednn" or "torch" (:mod:`aiayn.accel.cpu.gemm`).
        screened_argmax: screen the output layer in greedy search (:mod:`aiayn.accel.cpu.screened_argmax`).
        decode_attention: a decoding step's attention kernel, "auto" (the native kernel where it is built, else by
            shape), "shape" (torch's kernels by shape), "flash" or "matmul" (:mod:`aiayn.accel.cpu.decode_attention`).
    """

    native: bool = True
    fp32_gemm: str = "auto"
    screened_argmax: bool = True
    decode_attention: str = "auto"


SETTINGS = Settings()


@contextlib.contextmanager
def overridden(**changes: object) -> Iterator[Settings]:
    """Change :data:`SETTINGS` fields for the block, then restore them (``with overridden(native=False): ...``)."""
    old = dataclasses.asdict(SETTINGS)
    unknown = set(changes) - set(old)
    if unknown:
        raise ValueError(f"unknown accelerator settings {sorted(unknown)}; known: {sorted(old)}")
    for k, v in changes.items():
        setattr(SETTINGS, k, v)
    try:
        yield SETTINGS
    finally:
        for k, v in old.items():
            setattr(SETTINGS, k, v)
