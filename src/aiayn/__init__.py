"""aiayn: the Transformer of *Attention Is All You Need* and its modern family, on PyTorch.

    from aiayn import ModelConfig, build_model, embed
    model = build_model(ModelConfig.preset("paper-base"))
    vectors = embed("runs/minilm", ["A man is eating food."])  # (1, 384): a converted sentence-transformers model
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: public name -> the module that defines it; imported on first use, so that ``import aiayn.errors`` or
#: ``aiayn --version`` does not load torch
_EXPORTS = {
    "ModelConfig": "aiayn.config", "PRESETS": "aiayn.config", "AiaynError": "aiayn.errors",
    "build_model": "aiayn.models", "DecoderModel": "aiayn.models", "EncoderModel": "aiayn.models",
    "EncoderDecoderModel": "aiayn.models", "ModelOutput": "aiayn.models", "count_parameters": "aiayn.models",
    "forward_flops_per_token": "aiayn.models", "embed": "aiayn.tasks.embedding",
}
__all__ = ["ModelConfig", "PRESETS", "AiaynError", "build_model", "DecoderModel", "EncoderModel",
           "EncoderDecoderModel", "ModelOutput", "count_parameters", "forward_flops_per_token", "embed"]

if TYPE_CHECKING:  # what static tools see
    from aiayn.config import PRESETS, ModelConfig
    from aiayn.errors import AiaynError
    from aiayn.models import (
        DecoderModel,
        EncoderDecoderModel,
        EncoderModel,
        ModelOutput,
        build_model,
        count_parameters,
        forward_flops_per_token,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'aiayn' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
