"""Load a trained checkpoint directory for inference: config, weights and tokenizers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from aiayn.accel import accelerate, quantize_int8
from aiayn.config import ModelConfig
from aiayn.errors import AiaynError
from aiayn.models.build import build_model
from aiayn.tokenize import Tokenizer, load_tokenizer
from aiayn.train.checkpoint import checkpoint_file, load_config, load_model_state


@dataclass
class Pretrained:
    """A loaded checkpoint.

    Attributes:
        model: the model in eval mode.
        config: its ModelConfig.
        tokenizers: by role ("src", "tgt" for translation; "text" for the others).
        meta: the rest of config.json (task, decode defaults, label names, ...).
    """

    model: nn.Module
    config: ModelConfig
    tokenizers: dict[str, Tokenizer]
    meta: dict[str, Any]

    @property
    def task(self) -> str:
        """The task the checkpoint was trained for."""
        return self.meta.get("task", "unknown")


def load_pretrained(directory: str | Path, device: str | torch.device = "cpu", int8: bool = False,
                    dtype: str | torch.dtype = "float32", accel: str | None = None) -> Pretrained:
    """Load ``config.json``, ``model.safetensors`` and tokenizer files from a checkpoint directory.

    With ``int8=True`` the model's linear layers are dynamically quantized for CPU inference
    (:func:`aiayn.accel.quantize_int8`: faster decoding, outputs close to but not equal to fp32).
    With ``dtype="bfloat16"`` (CPU or CUDA) or ``"float16"`` (CUDA) the whole model is cast for inference
    (:func:`aiayn.nn.precision.cast_for_inference`: faster where the hardware has fast bf16/fp16 matmuls,
    outputs close to but not equal to fp32). The model is then accelerated for decoding on its device
    (:func:`aiayn.accel.accelerate`; ``accel="none"`` keeps the reference modules, default ``$AIAYN_ACCEL`` or
    "auto").

    Raises:
        AiaynError: missing directory or files (names what is missing); int8 with a dtype other than float32;
            fp16 on the CPU.
    """
    from aiayn.nn.precision import inference_dtype

    dtype = inference_dtype(dtype)
    if int8 and dtype != torch.float32:
        raise AiaynError(f"int8 and dtype {str(dtype).removeprefix('torch.')} exclude each other: int8 inference "
                         "keeps float32 activations; pick one (--int8 or --dtype)")
    d = Path(directory)
    if not d.exists() and not Path(str(d) + ".old").exists():
        raise AiaynError(f"{d}: checkpoint directory not found; pass the folder that holds config.json "
                         "(e.g. runs/demo/best)")
    meta = load_config(d)
    if "model" not in meta:
        raise AiaynError(f"{d / 'config.json'}: no 'model' entry; this is not an aiayn model checkpoint")
    config = ModelConfig.from_dict(meta["model"], str(d / "config.json"))
    model = build_model(config, init=False)
    load_model_state(d, model)
    tokenizers: dict[str, Tokenizer] = {}
    cache: dict[str, Tokenizer] = {}
    for role, name in meta.get("tokenizers", {}).items():
        if name not in cache:
            cache[name] = load_tokenizer(checkpoint_file(d, name))
        tokenizers[role] = cache[name]
    model = model.to(device).eval()
    if int8:
        model = quantize_int8(model)
    elif dtype != torch.float32:
        from aiayn.nn.precision import cast_for_inference

        cast_for_inference(model, dtype)
    accelerate(model, "decode", accel)
    return Pretrained(model, config, tokenizers, meta)
