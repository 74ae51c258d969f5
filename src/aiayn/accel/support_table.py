"""What an accelerator implements, as a table over the model config's fields (shared by the CPU and CUDA ones)."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from typing import Any

from aiayn.config import ModelConfig


def unsupported_fields(config: ModelConfig, supported: Mapping[str, Collection[Any]],
                       neutral: Collection[str]) -> list[str]:
    """The config's choices outside ``supported`` (field -> the values implemented), as "field=value" strings.

    A field in ``neutral`` (sizes, rates, ids) takes any value; a field in neither must keep its default.
    Values are read as given (``vars``): ``head_dim`` is null unless set, whatever width it derives.
    """
    problems = []
    defaults = ModelConfig()
    for f in dataclasses.fields(ModelConfig):
        value = vars(config)[f.name]
        if f.name in neutral:
            continue
        if f.name in supported:
            if value not in supported[f.name]:
                problems.append(f"{f.name}={value!r}")
        elif value != vars(defaults)[f.name]:
            problems.append(f"{f.name}={value!r}")
    return problems
