"""Models: encoder-only, decoder-only and encoder-decoder, built from one config by :func:`build_model`."""

from aiayn.models.build import build_model
from aiayn.models.decoder import DecoderModel
from aiayn.models.encoder import EncoderModel
from aiayn.models.output import ModelOutput
from aiayn.models.seq2seq import EncoderDecoderModel
from aiayn.models.stats import count_parameters, forward_flops_per_token

__all__ = ["build_model", "DecoderModel", "EncoderModel", "EncoderDecoderModel", "ModelOutput",
           "count_parameters", "forward_flops_per_token"]
