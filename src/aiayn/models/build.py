"""``build_model(config)``: the one place that turns a :class:`ModelConfig` into modules."""

from __future__ import annotations

from torch import nn

from aiayn.config import ModelConfig
from aiayn.models.decoder import DecoderModel
from aiayn.models.encoder import EncoderModel
from aiayn.models.init import deepnorm_constants, init_weights
from aiayn.models.seq2seq import EncoderDecoderModel


def build_model(config: ModelConfig, init: bool = True) -> nn.Module:
    """Build (and initialize) the model that ``config.arch`` names.

    The model is the reference: plain ``nn.Linear``, ``nn.Dropout`` and attention through torch. Speed-ups for a
    device are applied at the call site (:func:`aiayn.accel.accelerate`).

    Returns:
        :class:`EncoderModel`, :class:`DecoderModel` or :class:`EncoderDecoderModel`.
    """
    alphas = deepnorm_constants(config) if config.deepnorm else {"encoder": (1.0, 1.0), "decoder": (1.0, 1.0)}
    if config.arch == "encoder":
        model: nn.Module = EncoderModel(config, alpha=alphas["encoder"][0])
    elif config.arch == "decoder":
        model = DecoderModel(config, alpha=alphas["decoder"][0])
    else:
        model = EncoderDecoderModel(config, enc_alpha=alphas["encoder"][0], dec_alpha=alphas["decoder"][0])
    if init:
        init_weights(model, config)
    return model
