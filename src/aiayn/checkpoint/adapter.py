"""A LoRA run's checkpoint: the adapters (and whatever else trained) alone, and the base checkpoint they adapt,
named by its path and by the SHA-256 of its ``manifest.json``.

``config.json``'s ``adapter`` entry says which layers carry adapters and where the base is::

    "adapter": {"kind": "lora", "rank": 8, "alpha": 16.0, "layers": ["encoder.layers.0.self_attn.qkv_proj", ...],
                "base": {"checkpoint": "/abs/runs/all-minilm-l6-v2", "manifest_sha256": "9f2c..."}}

``model.safetensors`` then holds the trained tensors only: ``<layer>.lora_A.weight`` (r, in),
``<layer>.lora_B.weight`` (out, r) and the parameters trained beside them (a new classification head). The base's
manifest lists the size and hash of every file of the base, so one hash pins the whole base: a base retrained or
replaced since is refused, never silently adapted. An ``adapter`` entry without ``base`` is a checkpoint that holds
the whole adapted model (what a run without ``[model] init_from`` writes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from aiayn.checkpoint.layout import MANIFEST_FILE, MODEL_FILE, CheckpointRead, checkpoint_dir
from aiayn.checkpoint.load import read_state_dict
from aiayn.errors import AiaynError
from aiayn.files import sha256_of


def base_reference(directory: str | Path) -> dict[str, str]:
    """The ``base`` of an ``adapter`` entry: the checkpoint's absolute path and its manifest's SHA-256.

    Raises:
        AiaynError: the checkpoint has no manifest (a checkpoint written before manifests existed cannot be pinned).
    """
    path = Path(directory).resolve()
    manifest = checkpoint_dir(path) / MANIFEST_FILE
    if not manifest.is_file():
        raise AiaynError(f"{manifest.parent}: has no {MANIFEST_FILE}, so an adapter cannot name this base by its "
                         "hash; save it again (aiayn average --out DIR of the one checkpoint writes one)")
    return {"checkpoint": str(path), "manifest_sha256": sha256_of(manifest)}


def base_directory(where: Path, entry: dict[str, Any], base: str | Path | None = None) -> Path:
    """The base checkpoint of the adapter checkpoint ``where`` (its ``adapter`` entry ``entry``): ``base`` when
    given, else the path the entry names; its manifest must have the entry's hash.

    Raises:
        AiaynError: the base is missing (says how to point at a moved one), or it is another checkpoint than the
            one the adapters were trained on (the hashes differ).
    """
    ref = entry["base"]
    path = Path(base) if base is not None else Path(ref["checkpoint"])
    try:
        directory = checkpoint_dir(path)
    except AiaynError:
        raise AiaynError(f"{where}: its adapters adapt the base checkpoint {path}, which is not there; pass the base's "
                         "new place (--checkpoint BASE --adapter ADAPTER, or load_pretrained(BASE, adapter=ADAPTER))"
                         ) from None
    manifest = directory / MANIFEST_FILE
    found = sha256_of(manifest) if manifest.is_file() else "no manifest"
    if found != ref["manifest_sha256"]:
        raise AiaynError(f"{where}: its adapters were trained on a base whose {MANIFEST_FILE} has SHA-256 "
                         f"{ref['manifest_sha256'][:16]}..., but {directory} has {found[:16]}...: another model (or "
                         "one saved again since); give the base the adapters were trained on")
    return directory


def adapted_state(ck: CheckpointRead | Path, entry: dict[str, Any], base: str | Path | None = None
                  ) -> dict[str, torch.Tensor]:
    """The whole adapted model's state dict of an adapter checkpoint: the base's tensors, an adapted layer's
    ``<layer>.weight`` / ``.bias`` as ``<layer>.base.weight`` / ``.base.bias``, then the checkpoint's own tensors
    (adapters, a new head) over them. Tensors of the base that the adapted model may not have (another task's
    head) stay in; the caller keeps the names its model has. A checkpoint whose entry names no base holds the
    whole state already.

    Raises:
        AiaynError: what :func:`base_directory` and :func:`~aiayn.checkpoint.read_state_dict` raise.
    """
    own = read_state_dict(ck)
    if "base" not in entry:
        return own
    where = ck.directory if isinstance(ck, CheckpointRead) else Path(ck)
    state = read_state_dict(base_directory(where, entry, base))
    for layer in entry["layers"]:
        for p in ("weight", "bias"):
            if f"{layer}.{p}" in state:
                state[f"{layer}.base.{p}"] = state.pop(f"{layer}.{p}")
    state.update(own)
    return state


def load_adapted(ck: CheckpointRead, entry: dict[str, Any], model: nn.Module, base: str | Path | None = None) -> None:
    """Load an adapter checkpoint into ``model``, which carries its adapters already: the base's tensors and the
    checkpoint's (:func:`adapted_state`), every tensor of the model from one of them.

    Raises:
        AiaynError: the base is missing or another one; a tensor the model needs is in neither; shapes that differ.
    """
    state = adapted_state(ck, entry, base)
    wanted = model.state_dict()
    lacking = [k for k in wanted if k not in state]
    if lacking:
        raise AiaynError(f"{ck.directory}: {lacking[0]} is in neither the adapter checkpoint nor its base; the base "
                         "is not the model these adapters were trained on")
    try:
        model.load_state_dict({k: state[k] for k in wanted})
    except RuntimeError as e:
        raise AiaynError(f"{ck.file(MODEL_FILE)}: the adapters do not fit the base model ({e})") from e
