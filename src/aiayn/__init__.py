"""aiayn: the Transformer of *Attention Is All You Need* and its modern family, on PyTorch.

    from aiayn import ModelConfig, build_model
    model = build_model(ModelConfig.preset("paper-base"))
"""

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

__version__ = "0.1.0"
__all__ = ["ModelConfig", "PRESETS", "AiaynError", "build_model", "DecoderModel", "EncoderModel",
           "EncoderDecoderModel", "ModelOutput", "count_parameters", "forward_flops_per_token"]
