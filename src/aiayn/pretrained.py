"""Load a trained checkpoint directory for inference: config, weights and tokenizers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from aiayn.accel import accelerate, quantize_int8
from aiayn.checkpoint import MODEL_FILE, checkpoint_dir, load_config, load_model_state, save_checkpoint
from aiayn.checkpoint.adapter import load_adapted
from aiayn.checkpoint.layout import CheckpointRead, tokenizer_files
from aiayn.checkpoint.load import check_memory, memory_errors_said
from aiayn.config import ModelConfig
from aiayn.errors import AiaynError
from aiayn.models.build import build_model
from aiayn.models.stats import size_problem
from aiayn.nn.lora import merge_lora, restore_adapters
from aiayn.output_folder import CHECKPOINT, check_output_folder
from aiayn.tokenize import Tokenizer, checkpoint_tokenizer


class Tokenizers(dict):
    """A checkpoint's tokenizers by role; a role it lacks (converted with ``--no-tokenizer``) is one clear error."""

    def __init__(self, directory: Path, items: dict[str, Tokenizer]) -> None:
        super().__init__(items)
        self.directory = directory

    def __missing__(self, role: str) -> Tokenizer:
        raise AiaynError(f"{self.directory}: the checkpoint has no {role!r} tokenizer (it was converted with "
                         "--no-tokenizer); convert the model again from a folder that holds its tokenizer files")


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


#: how an ``embedding`` checkpoint pools its hidden states into one vector (:mod:`aiayn.tasks.embedding`)
EMBEDDING_POOLINGS = ("mean", "cls", "max", "last")


def _is_whole(v: Any, low: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


#: entries of a checkpoint's config.json besides "model" (its ModelConfig checks itself): what each must be
_META_RULES: dict[str, tuple[str, Any]] = {
    "task": ("a task name in quotes", lambda v: isinstance(v, str)),
    "adapter": ("a table with kind = \"lora\", a whole rank, a positive alpha, the adapted layers' names and "
                "optionally the base (its checkpoint path and manifest_sha256)",
                lambda v: isinstance(v, dict) and v.get("kind") == "lora" and _is_whole(v.get("rank"), 1)
                and isinstance(v.get("alpha"), (int, float)) and v["alpha"] > 0
                and isinstance(v.get("layers"), list) and all(isinstance(x, str) for x in v["layers"])
                and ("base" not in v or (isinstance(v["base"], dict) and all(
                    isinstance(v["base"].get(k), str) for k in ("checkpoint", "manifest_sha256"))))),
    "tokenizers": ("a table of role = file name", lambda v: isinstance(v, dict) and all(
        isinstance(k, str) and isinstance(f, str) and f and "/" not in f and "\\" not in f for k, f in v.items())),
    "decode": ("a table of decoding settings", lambda v: isinstance(v, dict)),
    "lowercase": ("true or false", lambda v: isinstance(v, bool)),
    "packing": ("true or false", lambda v: isinstance(v, bool)),
    "labels": ("a non-empty list of label strings", lambda v: isinstance(v, list) and bool(v) and all(
        isinstance(x, str) for x in v)),
    "label_names": ("null or a list of label names", lambda v: v is None or (isinstance(v, list) and all(
        isinstance(x, str) for x in v))),
    "block_size": ("null or a whole number >= 2", lambda v: v is None or _is_whole(v, 2)),
    "max_len": ("a whole number >= 3", lambda v: _is_whole(v, 3)),
    "newline_symbol": ("null or a string", lambda v: v is None or isinstance(v, str)),
    "embedding": (f"a table with pooling ({', '.join(EMBEDDING_POOLINGS)}) and normalize (true or false)",
                  lambda v: isinstance(v, dict) and v.get("pooling") in EMBEDDING_POOLINGS and all(
                      isinstance(v.get(k, False), bool) for k in ("normalize", "lowercase"))),
}


def meta_problems(meta: dict[str, Any]) -> list[str]:
    """What is wrong with the entries of a checkpoint's ``config.json`` that the commands read besides ``model``,
    each as ``key=value: must be ...`` (empty when nothing is)."""
    out = [f"{key}={meta[key]!r}: must be {what}" for key, (what, ok) in _META_RULES.items()
           if key in meta and not ok(meta[key])]
    if not isinstance(meta.get("model"), dict):
        out.insert(0, f"model={meta.get('model')!r}: must be a table of model settings")
    names, labels = meta.get("label_names"), meta.get("labels")
    if not out and isinstance(names, list) and isinstance(labels, list) and len(names) != len(labels):
        out.append(f"label_names: {len(names)} names for {len(labels)} labels; give one name per label")
    return out


def run_folder_checkpoints(directory: str | Path) -> list[Path]:
    """The checkpoints inside ``directory`` when it is a training run's folder (``train.out_dir``: ``best/``,
    ``last/``, ``averaged/``, ``step-N/``) rather than a checkpoint; empty for a checkpoint or anything else."""
    d = Path(directory)
    if not d.is_dir() or (d / "config.json").exists():
        return []
    found = [c for c in d.iterdir() if c.is_dir() and not c.name.startswith(".")
             and ((c / "config.json").is_file() or (Path(f"{c}.old") / "config.json").is_file())]
    order = {"best": 0, "last": 1, "averaged": 2}

    def key(c: Path) -> tuple[int, int, str]:
        step = c.name.removeprefix("step-")
        return order.get(c.name, 3), int(step) if step.isdigit() else 0, c.name
    return sorted(found, key=key)


def refuse_run_folder(directory: str | Path) -> None:
    """Raise when ``directory`` is a training run's folder rather than a checkpoint, naming its checkpoints.

    Raises:
        AiaynError: ``runs/demo: a training run's folder, not a checkpoint; pass one of its checkpoints: ...``.
    """
    inside = run_folder_checkpoints(directory)
    if inside:
        names = ", ".join(str(c) for c in inside[:4]) + (f" (and {len(inside) - 4} more)" if len(inside) > 4 else "")
        raise AiaynError(f"{directory}: a training run's folder, not a checkpoint; pass one of its checkpoints: "
                         f"{names}")


def load_pretrained(directory: str | Path, device: str | torch.device = "cpu", int8: bool = False,
                    dtype: str | torch.dtype = "float32", accel: str | None = None, *,
                    adapter: str | Path | None = None, merge: bool = True) -> Pretrained:
    """Load ``config.json``, ``model.safetensors`` and tokenizer files from a checkpoint directory.

    With ``int8=True`` the model's linear layers are dynamically quantized for CPU inference
    (:func:`aiayn.accel.quantize_int8`: faster decoding, outputs close to but not equal to fp32).
    With ``dtype="bfloat16"`` (CPU or CUDA) or ``"float16"`` (CUDA) the whole model is cast for inference
    (:func:`aiayn.nn.precision.cast_for_inference`: faster where the hardware has fast bf16/fp16 matmuls,
    outputs close to but not equal to fp32). The model is then accelerated for decoding on its device
    (:func:`aiayn.accel.accelerate`; ``accel="none"`` keeps the reference modules, default ``$AIAYN_ACCEL`` or
    "auto").

    Every file is read from one save (:class:`~aiayn.checkpoint.layout.CheckpointRead`), also while a training run
    saves the checkpoint again.

    A LoRA run's checkpoint (:mod:`aiayn.checkpoint.adapter`) loads its base from where its ``adapter`` entry says;
    ``adapter=ADAPTER`` with ``directory`` the base loads the adapter checkpoint ``ADAPTER`` on that base (one that
    moved, or to say which base is meant), checked against the base's manifest hash. The adapters are folded into
    their layers (``merge=True``: the base model's speed, kernels unchanged); ``merge=False`` keeps them apart, to
    check the merged model against.

    Raises:
        AiaynError: missing directory or files (names what is missing); a training run's folder instead of one of
            its checkpoints (names them); int8 with a dtype other than float32; fp16 on the CPU; a model that needs
            more memory than this process may use (said before it is read where the sizes are known).
    """
    from aiayn.nn.precision import inference_dtype  # lazy: aiayn --help loads pretrained, not precision

    dtype = inference_dtype(dtype)
    if int8 and dtype != torch.float32:
        raise AiaynError(f"int8 and dtype {str(dtype).removeprefix('torch.')} exclude each other: int8 inference "
                         "keeps float32 activations; pick one (--int8 or --dtype)")
    base = None
    if adapter is not None:  # the adapter checkpoint is the one loaded; ``directory`` is its base
        base, directory = directory, _adapter_checkpoint(adapter)
    d = Path(directory)
    if not d.exists() and not Path(str(d) + ".old").exists():
        raise AiaynError(f"{d}: checkpoint directory not found; pass the folder that holds config.json "
                         "(e.g. runs/demo/best)")
    refuse_run_folder(d)
    with CheckpointRead(d) as ck:  # every file from one save, even while training saves the checkpoint again
        meta = load_config(ck)
        if "model" not in meta:
            raise AiaynError(f"{d / 'config.json'}: no 'model' entry; this is not an aiayn model checkpoint")
        problems = meta_problems(meta)
        if problems:
            raise AiaynError(f"{d / 'config.json'}: {'; '.join(problems)}; the file was edited or is corrupt: restore "
                             "it or use another checkpoint")
        config = ModelConfig.from_dict(meta["model"], str(d / "config.json"))
        too_big = size_problem(config, 4, "hold in float32")
        if too_big is not None:
            raise AiaynError(f"{d / 'config.json'}: model {too_big}: the file was edited or is corrupt")
        check_memory(ck, copies=2)  # the weights, mapped from the file, and the model they are copied into
        with memory_errors_said(ck.file(MODEL_FILE)):
            model = _built_and_loaded(ck, meta, config, base, merge)
        tokenizers: dict[str, Tokenizer] = {}
        cache: dict[str, Tokenizer] = {}
        for role, name in meta.get("tokenizers", {}).items():
            if name not in cache:
                cache[name] = checkpoint_tokenizer(ck, name)
            tokenizers[role] = cache[name]
    with memory_errors_said(ck.file(MODEL_FILE)):
        model = model.to(device).eval()
        if int8:
            model = quantize_int8(model)
        elif dtype != torch.float32:
            from aiayn.nn.precision import cast_for_inference  # lazy: aiayn --help loads pretrained, not precision

            cast_for_inference(model, dtype)
    accelerate(model, "decode", accel)
    return Pretrained(model, config, Tokenizers(d, tokenizers), meta)


def _built_and_loaded(ck: CheckpointRead, meta: dict[str, Any], config: ModelConfig, base: str | Path | None,
                      merge: bool) -> nn.Module:
    """The checkpoint's model with its weights: a LoRA run's adapters on their base, folded in when ``merge``."""
    model = build_model(config, init=False)
    if meta.get("adapter"):  # LoRA adapters trained on a frozen base: loaded, then merged (base speed)
        restore_adapters(model, meta["adapter"])
        load_adapted(ck, meta["adapter"], model, base)
        if merge:
            merge_lora(model)
    else:
        if base is not None:
            raise AiaynError(f"{ck.path}: has no LoRA adapters (config.json has no 'adapter' entry); --adapter "
                             "takes the checkpoint of a run with [train] adapter = \"lora\"")
        load_model_state(ck, model)
    return model


def _adapter_checkpoint(path: str | Path) -> Path:
    """``--adapter``'s folder, refused in one line when it is a PEFT folder (convert names the way)."""
    p = Path(path)
    if (p / "adapter_config.json").is_file() and not (p / "config.json").is_file():
        raise AiaynError(f"{p}: a PEFT adapter folder; make it an aiayn adapter checkpoint first: aiayn convert "
                         f"--from-hf {p} --base BASE --out ADAPTER, then --adapter ADAPTER")
    return p


def adapted_model_state(checkpoint: str | Path, base: str | Path | None = None) -> tuple[dict[str, Any],
                                                                                        dict[str, torch.Tensor]]:
    """An adapter checkpoint's ``config.json`` and the state dict of its model with every adapter folded in (the
    plain model's names), read without accelerating anything.

    Raises:
        AiaynError: not an adapter checkpoint, or what :func:`load_pretrained` raises.
    """
    d = checkpoint_dir(checkpoint)
    meta = load_config(d)
    if not meta.get("adapter"):
        raise AiaynError(f"{d}: has no LoRA adapters (config.json has no 'adapter' entry); it is already a plain "
                         "checkpoint")
    pre = load_pretrained(base, accel="none", adapter=checkpoint) if base is not None else load_pretrained(
        checkpoint, accel="none")
    return pre.meta, pre.model.state_dict()


def merge_adapter(checkpoint: str | Path, out: str | Path, *, overwrite: bool = False,
                  base: str | Path | None = None) -> Path:
    """Write a checkpoint of a LoRA run (``[train] adapter = "lora"``) as a plain one: every adapter folded into its
    layer (``W + scaling * B A``), ``config.json`` without its ``adapter`` entry, the same tokenizer files, no
    training state; it loads and decodes as any checkpoint, in aiayn or (``convert --to-hf``) elsewhere.

    Raises:
        AiaynError: the checkpoint has no adapters, ``out`` is the checkpoint (or inside or around it), or a folder
            of something else and ``overwrite`` is false.
    """
    d = checkpoint_dir(checkpoint)
    into = check_output_folder(out, CHECKPOINT, overwrite=overwrite, sources=[Path(checkpoint), d])
    meta, state = adapted_model_state(checkpoint, base)
    plain = {k: v for k, v in meta.items() if k != "adapter"}
    return save_checkpoint(out, state, plain, tokenizer_writer=tokenizer_files(d), into=into)
