"""Estimates of a training run before it starts: memory per rank, FLOPs and time on named GPUs.

Every figure here is an estimate from a formula, stated as such where it is printed:

- weights, gradients and Adam's two moments in float32 (4 + 4 + 8 bytes a parameter), divided by the ranks when
  FSDP shards them;
- activations kept for the backward pass, per layer and token, after Korthikanti et al. (2022, section 4.1):
  ``34 d + 5 h s`` bytes for an encoder layer at 16-bit activations, ``47 d + 5 h (t + s)`` for a decoder layer
  (a second attention block over the source), plus the output layer's scores (16-bit) and their float32
  log-softmax; float32 activations double the layers' share;
- training FLOPs: three times the forward pass (:func:`aiayn.models.stats.forward_flops_per_token`, the matrices'
  2 FLOPs per multiply-add and the attention scores) per target token;
- time on a GPU: those FLOPs at an assumed model-FLOPs utilization of its dense bf16 peak (for the paper's P100,
  which has no bf16, of the 9.5 TFLOP/s of fp32 its Table 2 takes).
"""

from __future__ import annotations

from dataclasses import dataclass

from aiayn.config import ModelConfig
from aiayn.models.stats import forward_flops_per_token

ADAM_BYTES = 16  # float32 weight, gradient and two moments per parameter


@dataclass(frozen=True)
class GPU:
    """A GPU's name and its dense peak in TFLOP/s for the precision a recipe trains in."""

    name: str
    peak_tflops: float


#: dense (no sparsity) peaks from the vendors' data sheets
GPUS = (GPU("H100 SXM (bf16)", 989.0), GPU("A100 SXM (bf16)", 312.0), GPU("P100 (fp32, as the paper's Table 2)", 9.5))
MFU = 0.4  # assumed model-FLOPs utilization: 40% of the peak


@dataclass(frozen=True)
class RankMemory:
    """Bytes one rank holds for training: weights, gradients, optimizer state and activations."""

    weights: float
    gradients: float
    optimizer: float
    activations: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations


def rank_memory(params: int, shards: int, activations: float) -> RankMemory:
    """The memory of one rank for ``params`` float32 parameters trained with Adam, sharded ``shards`` ways (1: DDP
    or one process), and ``activations`` bytes (:func:`activation_bytes`, or a measured figure)."""
    per = params / max(shards, 1)
    return RankMemory(4 * per, 4 * per, 8 * per, activations)


def activation_bytes(config: ModelConfig, sentences: float, src_len: float, tgt_len: float,
                     bf16: bool) -> float:
    """Estimated bytes of activations an encoder-decoder keeps for the backward pass of one micro-batch.

    Args:
        config: the model (d_model, heads, layers, target vocabulary).
        sentences: sentences in the micro-batch.
        src_len, tgt_len: their padded lengths (source; target with its end token).
        bf16: activations in 16-bit (autocast) rather than float32.
    """
    d, h = config.d_model, config.n_heads
    scale = 1.0 if bf16 else 2.0  # Korthikanti's figures are for 16-bit activations
    src_tokens, tgt_tokens = sentences * src_len, sentences * tgt_len
    encoder = config.encoder_layers * src_tokens * (34 * d + 5 * h * src_len) * scale
    decoder = config.n_layers * tgt_tokens * (47 * d + 5 * h * (tgt_len + src_len)) * scale
    scores = tgt_tokens * config.target_vocab_size * ((2 if bf16 else 4) + 4)
    return encoder + decoder + scores


def step_flops(config: ModelConfig, tgt_tokens: float, src_len: float, tgt_len: float) -> float:
    """Training FLOPs of one optimizer step over ``tgt_tokens`` target tokens (forward and backward passes)."""
    return 3 * forward_flops_per_token(config, int(src_len), int(tgt_len)) * tgt_tokens


def hours_on(gpu: GPU, n_gpus: int, total_flops: float, mfu: float = MFU) -> tuple[float, float]:
    """(wall-clock hours, GPU-hours) of ``total_flops`` on ``n_gpus`` of ``gpu`` at ``mfu`` of the peak each."""
    seconds = total_flops / (n_gpus * gpu.peak_tflops * 1e12 * mfu)
    return seconds / 3600, n_gpus * seconds / 3600
