"""Checkpoints as directories, written atomically, read without unpickling.

A checkpoint directory holds:

- ``config.json``: the caller's config dict (model config, tokenizer kind, ...).
- ``model.safetensors``: the model's state dict. Shared (tied) tensors are stored once; the other
  names are recorded in the file's metadata (``aiayn.aliases``) and restored on load.
- tokenizer files: copied from given paths, or written by a callback.
- ``training_state.pt`` (optional): optimizer and scheduler state, RNG states, and the caller's
  ``train_state`` (step, epoch, data position, anything JSON-like). Read only with
  ``torch.load(weights_only=True)``, so it holds tensors, numbers, strings, lists and dicts, never
  pickled objects.

Atomicity: everything is written into a temporary sibling directory and fsynced; then an existing
checkpoint is renamed to ``<dir>.old``, the new one renamed into place, and ``<dir>.old`` deleted.
A crash at any point leaves a loadable checkpoint: if ``<dir>`` is missing but ``<dir>.old`` exists,
the loaders use the latter.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import safetensors
import torch
from safetensors.torch import save_file
from torch import nn

from aiayn.errors import AiaynError

CONFIG_FILE = "config.json"
MODEL_FILE = "model.safetensors"
STATE_FILE = "training_state.pt"
ALIASES_KEY = "aiayn.aliases"
FORMAT_VERSION = 1
_RESERVED = ("optimizer", "scheduler", "format_version")

TokenizerWriter = Callable[[Path], None] | Iterable[str | os.PathLike]


# ----------------------------------------------------------------------------------------- RNG


def capture_rng() -> dict[str, Any]:
    """Capture Python, NumPy (global) and torch (CPU and CUDA) RNG states as loadable-safe values.

    Returns:
        A dict of tensors, numbers and lists that survives ``torch.save`` and
        ``torch.load(weights_only=True)``.
    """
    version, internal, gauss_next = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": {
            "version": int(version),
            "state": torch.tensor(internal, dtype=torch.int64),
            "gauss_next": gauss_next,
        },
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Restore RNG states captured by :func:`capture_rng`.

    CUDA states are restored only when CUDA is available with the same number of devices.

    Args:
        state: the dict :func:`capture_rng` returned (possibly after a save/load round trip).
    """
    py = state["python"]
    random.setstate((py["version"], tuple(int(x) for x in py["state"].tolist()), py["gauss_next"]))
    npst = state["numpy"]
    keys = npst["keys"].numpy().astype(np.uint32)
    np.random.set_state((npst["kind"], keys, npst["pos"], npst["has_gauss"], npst["cached_gaussian"]))
    torch.set_rng_state(state["torch"].cpu())
    cuda = state.get("cuda")
    if cuda and torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
        torch.cuda.set_rng_state_all([s.cpu() for s in cuda])


# ------------------------------------------------------------------------------ filesystem helpers


def _fsync_path(path: Path) -> None:
    """fsync a file or a directory (directories: best effort, not supported everywhere)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _old_path(path: Path) -> Path:
    return path.with_name(path.name + ".old")


def _looks_like_checkpoint(path: Path) -> bool:
    return (path / CONFIG_FILE).is_file() or (path / MODEL_FILE).is_file()


def _resolve(path: str | os.PathLike) -> Path:
    """The directory to read: ``path``, or ``path.old`` left by a save interrupted mid-rename."""
    target = Path(path)
    if target.is_dir():
        return target
    old = _old_path(target)
    if old.is_dir():
        return old
    raise AiaynError(
        f"{target}: no checkpoint directory here (nor {old.name}); check the path, or train first"
    )


# ------------------------------------------------------------------------------------- state dicts


def _dedupe(state_dict: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Store each shared tensor once: ``(tensors, aliases)`` with ``aliases[dropped] = kept``."""
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for name, t in state_dict.items():
        t = t.detach()
        key = (t.device, t.dtype, t.data_ptr(), tuple(t.shape), t.stride())
        if t.numel() > 0 and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        tensors[name] = t
    # Distinct tensors that still overlap in memory (views of one storage) are copied apart.
    owners: dict[tuple, int] = {}
    for t in tensors.values():
        if t.numel() > 0:
            sk = (t.device, t.untyped_storage().data_ptr())
            owners[sk] = owners.get(sk, 0) + 1
    for name, t in list(tensors.items()):
        shared = t.numel() > 0 and owners[(t.device, t.untyped_storage().data_ptr())] > 1
        tensors[name] = t.clone().contiguous() if shared else t.contiguous()
    return tensors, aliases


def read_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read a checkpoint's model state dict (on CPU) with tied names restored as the same tensor.

    Args:
        path: a checkpoint directory.

    Raises:
        AiaynError: the directory or ``model.safetensors`` is missing or unreadable.
    """
    tensors, aliases = _read_model_file(_resolve(path))
    for dropped, kept in aliases.items():
        tensors[dropped] = tensors[kept]
    return tensors


def _read_model_file(directory: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    file = directory / MODEL_FILE
    if not file.is_file():
        raise AiaynError(f"{file}: checkpoint has no {MODEL_FILE}; the checkpoint is incomplete")
    try:
        with safetensors.safe_open(str(file), framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        aliases = json.loads(metadata.get(ALIASES_KEY, "{}"))
    except (safetensors.SafetensorError, OSError, ValueError) as e:
        raise AiaynError(f"{file}: cannot read model weights ({e}); the file is corrupt") from e
    missing = sorted({k for k in aliases.values() if k not in tensors})
    if missing:
        raise AiaynError(f"{file}: aliases point at missing tensors {missing}; the file is corrupt")
    return tensors, aliases


def load_model_state(
    path: str | os.PathLike, model: nn.Module, strict: bool = True
) -> tuple[list[str], list[str]]:
    """Load a checkpoint's weights into ``model`` (tied parameters stay tied: values are copied in).

    Args:
        path: a checkpoint directory.
        model: a model built from the checkpoint's config.
        strict: require exactly matching keys.

    Returns:
        ``(missing_keys, unexpected_keys)`` as ``nn.Module.load_state_dict`` returns them (both
        empty when ``strict``).

    Raises:
        AiaynError: missing/corrupt files, or keys or shapes that do not match the model.
    """
    directory = _resolve(path)
    state = read_state_dict(directory)
    try:
        return model.load_state_dict(state, strict=strict)
    except RuntimeError as e:
        raise AiaynError(
            f"{directory / MODEL_FILE}: weights do not fit the model ({e}); build the model from this "
            f"checkpoint's {CONFIG_FILE}"
        ) from e


def load_config(path: str | os.PathLike) -> dict:
    """Read a checkpoint's ``config.json``.

    Raises:
        AiaynError: missing directory or file, or invalid JSON (with the line).
    """
    file = _resolve(path) / CONFIG_FILE
    if not file.is_file():
        raise AiaynError(f"{file}: checkpoint has no {CONFIG_FILE}; the checkpoint is incomplete")
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise AiaynError(f"{file}:{e.lineno}: invalid JSON ({e.msg}); the checkpoint is corrupt") from e
    except (OSError, UnicodeDecodeError) as e:
        raise AiaynError(f"{file}: cannot read ({e})") from e
    if not isinstance(config, dict):
        raise AiaynError(f"{file}: expected a JSON object, got {type(config).__name__}")
    return config


def load_training_state(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict | None:
    """Read ``training_state.pt`` safely (``weights_only=True``), or None if the checkpoint has none.

    Returns:
        ``{"format_version", "optimizer", "scheduler", "rng", **train_state}``: ``optimizer`` and
        ``scheduler`` are state dicts (or None), ``rng`` is for :func:`restore_rng`, and the rest is the
        ``train_state`` given to :func:`save_checkpoint`.

    Raises:
        AiaynError: the file is corrupt or holds objects that are not plain data.
    """
    file = _resolve(path) / STATE_FILE
    if not file.is_file():
        return None
    try:
        state = torch.load(file, map_location=map_location, weights_only=True)
    except Exception as e:  # torch raises several types (UnpicklingError, RuntimeError, EOFError)
        raise AiaynError(f"{file}: cannot read training state ({e}); the file is corrupt or unsafe") from e
    if not isinstance(state, dict) or "format_version" not in state:
        raise AiaynError(f"{file}: not an aiayn training state; the checkpoint is corrupt")
    return state


# ------------------------------------------------------------------------------------------ saving


_PLAIN = (str, int, float, bool, type(None), torch.Tensor)


def _check_plain(value: Any, where: str) -> None:
    """Refuse values that ``torch.load(weights_only=True)`` would not read back."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, (str, int)):
                raise AiaynError(f"train_state{where}: key {k!r} must be a str or int")
            _check_plain(v, f"{where}[{k!r}]")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_plain(v, f"{where}[{i}]")
    elif not isinstance(value, _PLAIN):
        raise AiaynError(
            f"train_state{where}: {type(value).__name__} cannot be stored safely; use numbers, strings, "
            "lists, dicts or tensors"
        )


def _write_tokenizer(directory: Path, tokenizer_writer: TokenizerWriter) -> None:
    if callable(tokenizer_writer):
        tokenizer_writer(directory)
        return
    for src in tokenizer_writer:
        src = Path(src)
        if not src.is_file():
            raise AiaynError(f"{src}: tokenizer file not found; pass existing tokenizer file paths")
        if src.name in (CONFIG_FILE, MODEL_FILE, STATE_FILE):
            raise AiaynError(f"{src}: a tokenizer file may not be named {src.name}; rename it")
        shutil.copy2(src, directory / src.name)


def _write_all(
    tmp: Path,
    model: nn.Module | Mapping[str, torch.Tensor],
    config: dict,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any | None,
    train_state: dict | None,
    tokenizer_writer: TokenizerWriter | None,
) -> None:
    try:
        text = json.dumps(config, indent=2, ensure_ascii=False)
    except (TypeError, ValueError) as e:
        raise AiaynError(f"checkpoint config is not JSON-serializable ({e}); pass plain values") from e
    (tmp / CONFIG_FILE).write_text(text + "\n", encoding="utf-8")
    tensors, aliases = _dedupe(model if isinstance(model, Mapping) else model.state_dict())
    tensors = {k: v.contiguous() for k, v in tensors.items()}  # e.g. column-major inference weights
    save_file(tensors, str(tmp / MODEL_FILE), metadata={ALIASES_KEY: json.dumps(aliases)})
    if tokenizer_writer is not None:
        _write_tokenizer(tmp, tokenizer_writer)
    if optimizer is not None or scheduler is not None or train_state is not None:
        extra = dict(train_state or {})
        clash = [k for k in _RESERVED if k in extra]
        if clash:
            raise AiaynError(f"train_state uses reserved key(s) {clash}; rename them")
        extra.setdefault("rng", capture_rng())
        _check_plain(extra, "")
        state = {
            "format_version": FORMAT_VERSION,
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            **extra,
        }
        torch.save(state, tmp / STATE_FILE)
    for file in tmp.rglob("*"):
        if file.is_file():
            _fsync_path(file)
    _fsync_path(tmp)


def save_checkpoint(
    path: str | os.PathLike,
    model: nn.Module | Mapping[str, torch.Tensor],
    config: dict,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    train_state: dict | None = None,
    tokenizer_writer: TokenizerWriter | None = None,
) -> Path:
    """Write a checkpoint directory atomically (see the module docstring).

    ``training_state.pt`` is written when any of ``optimizer``, ``scheduler`` or ``train_state`` is
    given; the RNG states are captured at this call unless ``train_state`` has an ``"rng"`` entry.

    Args:
        path: the checkpoint directory to create or replace.
        model: the model, or a state dict; the state dict goes to ``model.safetensors``.
        config: JSON-serializable dict for ``config.json``.
        optimizer: optimizer whose ``state_dict()`` is saved.
        scheduler: anything with ``state_dict()`` (e.g. ``LambdaLR``).
        train_state: step, epoch, data position and other plain data (numbers, strings, lists, dicts,
            tensors); the keys ``optimizer``, ``scheduler`` and ``format_version`` are reserved.
        tokenizer_writer: a callable ``f(directory)`` that writes tokenizer files into the directory,
            or an iterable of file paths to copy in.

    Returns:
        The checkpoint directory.

    Raises:
        AiaynError: unserializable config or state, missing tokenizer files, or ``path`` being an
            existing directory that is not a checkpoint (never overwritten).
    """
    target = Path(path)
    old = _old_path(target)
    for existing in (target, old):
        if existing.is_dir() and any(existing.iterdir()) and not _looks_like_checkpoint(existing):
            raise AiaynError(
                f"{existing}: exists and is not a checkpoint; refusing to overwrite it, choose another path"
            )
        if existing.exists() and not existing.is_dir():
            raise AiaynError(f"{existing}: exists and is a file; choose another checkpoint path")
    target.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{target.name}.tmp-"
    for stale in target.parent.glob(prefix + "*"):  # left by a crashed save
        shutil.rmtree(stale, ignore_errors=True)
    tmp = target.parent / f"{prefix}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        _write_all(tmp, model, config, optimizer, scheduler, train_state, tokenizer_writer)
        if target.is_dir():
            if old.is_dir():  # a stale .old next to a complete checkpoint
                shutil.rmtree(old)
            os.replace(target, old)
        os.replace(tmp, target)
        _fsync_path(target.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old.is_dir():
        shutil.rmtree(old)
    return target


# ------------------------------------------------------------------------------ averaging, pruning


def average_checkpoints(paths: Iterable[str | os.PathLike]) -> dict[str, torch.Tensor]:
    """Average the weights of several checkpoints (the paper averages the last 5 or 20).

    Floating-point tensors are averaged in float64 and cast back; integer tensors (counters, index
    buffers) are taken from the last checkpoint. Tied names map to the same averaged tensor.

    Args:
        paths: checkpoint directories of the same model.

    Returns:
        A state dict (CPU) for ``model.load_state_dict``.

    Raises:
        AiaynError: no paths, or checkpoints whose tensor names, shapes or ties differ.
    """
    dirs = [_resolve(p) for p in paths]
    if not dirs:
        raise AiaynError("average_checkpoints: no checkpoints given")
    sums: dict[str, torch.Tensor] = {}
    last: dict[str, torch.Tensor] = {}
    ref_aliases: dict[str, str] = {}
    for i, directory in enumerate(dirs):
        tensors, aliases = _read_model_file(directory)
        if i == 0:
            ref_aliases = aliases
            sums = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in tensors.items()}
        elif aliases != ref_aliases or tensors.keys() != sums.keys():
            raise AiaynError(f"{directory}: tensor names or ties differ from {dirs[0]}; not the same model")
        for k, v in tensors.items():
            if v.shape != sums[k].shape:
                raise AiaynError(
                    f"{directory}: tensor {k} has shape {tuple(v.shape)}, {dirs[0]} has "
                    f"{tuple(sums[k].shape)}; not the same model"
                )
            if v.is_floating_point():
                sums[k] += v.double()
        last = tensors
    out = {
        k: (sums[k] / len(dirs)).to(v.dtype) if v.is_floating_point() else v.clone() for k, v in last.items()
    }
    for dropped, kept in ref_aliases.items():
        out[dropped] = out[kept]
    return out


def periodic_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """The periodic ``step-N`` checkpoints of a training run, oldest first (by N, not by name).

    Args:
        run_dir: a run's ``train.out_dir``.

    Returns:
        The ``step-N`` directories; temporary and ``.old`` siblings are never listed.
    """
    steps = [p for p in Path(run_dir).glob("step-*") if p.is_dir() and p.name.split("-", 1)[1].isdigit()]
    return sorted(steps, key=lambda p: int(p.name.split("-", 1)[1]))


def write_average(paths: Iterable[str | os.PathLike], out: str | os.PathLike) -> Path:
    """Average checkpoints (:func:`average_checkpoints`) into a new checkpoint directory ``out``.

    ``config.json`` and the tokenizer files come from the last checkpoint; no training state is written,
    so the result is for decoding and evaluation, not for ``--resume``.

    Args:
        paths: checkpoint directories of one model (at least one).
        out: the directory to write (atomically; an existing checkpoint there is replaced).

    Returns:
        The written directory.

    Raises:
        AiaynError: the checkpoints differ in config or tensors, or ``out`` is one of them.
    """
    dirs = [_resolve(p) for p in paths]
    if not dirs:
        raise AiaynError("average: no checkpoints given")
    target = Path(out)
    if any(target.resolve() == d.resolve() for d in dirs):
        raise AiaynError(f"{target}: is one of the checkpoints being averaged; write the average elsewhere")
    config = load_config(dirs[-1])
    for d in dirs[:-1]:
        if load_config(d).get("model") != config.get("model"):
            raise AiaynError(f"{d}: its model config differs from {dirs[-1]}; average checkpoints of one model")
    state = average_checkpoints(dirs)
    own = (CONFIG_FILE, MODEL_FILE, STATE_FILE)
    tokenizer_files = [f for f in sorted(dirs[-1].iterdir()) if f.is_file() and f.name not in own]
    return save_checkpoint(target, state, config, tokenizer_writer=tokenizer_files)


def _natural_key(name: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def keep_last(parent: str | os.PathLike, pattern: str, n: int) -> list[Path]:
    """Delete all but the last ``n`` checkpoint directories in ``parent`` matching ``pattern``.

    "Last" is natural name order (``step_900`` < ``step_1000``). Temporary and ``.old`` siblings are
    never counted; a pruned checkpoint's ``.old`` sibling is deleted with it.

    Args:
        parent: the folder holding checkpoints.
        pattern: a glob such as ``"step_*"``.
        n: how many to keep (>= 0).

    Returns:
        The deleted directories.
    """
    if n < 0:
        raise AiaynError(f"keep_last: n must be >= 0, got {n}")
    found: dict[str, Path] = {}  # checkpoint name -> its directory (or its .old when that is all there is)
    for p in Path(parent).glob(pattern):
        if not p.is_dir() or p.name.startswith("."):
            continue
        if p.name.endswith(".old"):
            name = p.name[: -len(".old")]
            found.setdefault(name, p)
        else:
            found[p.name] = p
    names = sorted(found, key=_natural_key)
    doomed = [found[name] for name in names[: max(0, len(names) - n)]]
    for p in doomed:
        shutil.rmtree(p)
        old = p.with_name(p.name + ".old")
        if old.is_dir():
            shutil.rmtree(old)
    return doomed
