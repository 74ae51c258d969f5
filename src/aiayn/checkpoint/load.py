"""Reading a checkpoint: weights (tied names restored), config and training state, each checked first.

Every reader takes a checkpoint path or a :class:`~aiayn.checkpoint.layout.CheckpointRead`: a path is pinned for
that one read; a load that reads several files (config, weights, tokenizers) pins the checkpoint once and passes the
pin to each, so that all of them come from one save even while training saves the checkpoint again. Each file is
checked against its directory's manifest. Nothing is unpickled: weights are safetensors, the config is JSON, and
the training state is read with ``torch.load(weights_only=True)``. Before the weights are read, the memory they need
(known from the safetensors header) is compared with what this process may use (:func:`check_memory`).
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import safetensors
import torch
from torch import nn

from aiayn.checkpoint.layout import (
    ALIASES_KEY,
    CONFIG_FILE,
    MODEL_FILE,
    STATE_FILE,
    CheckpointRead,
    read_checkpoint,
)
from aiayn.errors import AiaynError, where
from aiayn.files import BadJSON, parse_json

try:
    import resource  # POSIX: the address-space limit (ulimit -v)
except ImportError:  # Windows
    resource = None

Checkpoint = str | os.PathLike | CheckpointRead  # a checkpoint's path, or the checkpoint pinned for one load
MiB = 1 << 20


def first_non_finite(tensors: Mapping[str, torch.Tensor]) -> str | None:
    """The name of the first floating-point tensor holding NaN or inf, else None."""
    for name, t in tensors.items():
        if t.is_floating_point() and t.device.type != "meta" and not bool(torch.isfinite(t).all()):
            return name
    return None


def read_state_dict(path: Checkpoint) -> dict[str, torch.Tensor]:
    """Read a checkpoint's model state dict (on CPU) with tied names restored as the same tensor.

    Args:
        path: a checkpoint directory, or a pinned :class:`~aiayn.checkpoint.layout.CheckpointRead`.

    Raises:
        AiaynError: the directory or ``model.safetensors`` is missing, unreadable, differs from its
            checksum, holds NaN/inf, or needs more memory than this process may use.
    """
    tensors, aliases = read_model_file(path)
    for dropped, kept in aliases.items():
        tensors[dropped] = tensors[kept]
    return tensors


def read_model_file(directory: Checkpoint) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors of ``directory/model.safetensors`` (each shared tensor once) and the aliases of the tied
    names (``aliases[dropped] = kept``), checked against the manifest and for NaN/inf.

    Raises:
        AiaynError: the file is missing, corrupt, differs from its checksum, holds NaN/inf, or needs more memory
            than this process may use.
    """
    return read_checkpoint(directory, _read_model_file)


def _read_model_file(ck: CheckpointRead) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    file = ck.file(MODEL_FILE)
    if not ck.has(MODEL_FILE):
        raise AiaynError(f"{file}: checkpoint has no {MODEL_FILE}; the checkpoint is incomplete")
    check_memory(ck, copies=1)  # the tensors are mapped from the file
    source = ck.os_path(MODEL_FILE)
    try:
        with safetensors.safe_open(str(source), framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        aliases = parse_json(metadata.get(ALIASES_KEY, "{}"))
        if not isinstance(aliases, dict) or not all(isinstance(v, str) for v in aliases.values()):
            raise ValueError(f"{ALIASES_KEY} is not a table of tensor names")
    except (MemoryError, RuntimeError, safetensors.SafetensorError, OSError, ValueError) as e:
        raise (out_of_memory(file, e)
               or AiaynError(f"{file}: cannot read model weights ({_first_line(e)}); the file is corrupt")) from None
    missing = sorted({k for k in aliases.values() if k not in tensors})
    if missing:
        raise AiaynError(f"{file}: aliases point at missing tensors {missing}; the file is corrupt")
    bad = first_non_finite(tensors)
    if bad is not None:
        raise AiaynError(
            f"{file}: holds NaN/inf in tensor {bad}; it was written by a diverged run, use an earlier checkpoint"
        )
    return tensors, aliases


def load_model_state(
    path: Checkpoint, model: nn.Module, strict: bool = True
) -> tuple[list[str], list[str]]:
    """Load a checkpoint's weights into ``model`` (tied parameters stay tied: values are copied in).

    Args:
        path: a checkpoint directory, or a pinned :class:`~aiayn.checkpoint.layout.CheckpointRead`.
        model: a model built from the checkpoint's config.
        strict: require exactly matching keys.

    Returns:
        ``(missing_keys, unexpected_keys)`` as ``nn.Module.load_state_dict`` returns them (both
        empty when ``strict``).

    Raises:
        AiaynError: missing/corrupt files, NaN/inf weights, or keys or shapes that do not match the model.
    """
    def load(ck: CheckpointRead) -> tuple[list[str], list[str]]:
        state = read_state_dict(ck)
        try:
            return model.load_state_dict(state, strict=strict)
        except RuntimeError as e:
            raise AiaynError(
                f"{ck.file(MODEL_FILE)}: weights do not fit the model ({e}); build the model from this "
                f"checkpoint's {CONFIG_FILE}"
            ) from e
    return read_checkpoint(path, load)


def load_config(path: Checkpoint) -> dict:
    """Read a checkpoint's ``config.json``.

    Raises:
        AiaynError: missing directory or file, invalid JSON (with the line), or a checksum mismatch.
    """
    def load(ck: CheckpointRead) -> dict:
        file = ck.file(CONFIG_FILE)
        data = ck.read_bytes(CONFIG_FILE, check=False)
        if data is None:
            raise AiaynError(f"{file}: checkpoint has no {CONFIG_FILE}; the checkpoint is incomplete")
        try:
            config = parse_json(data)
        except BadJSON as e:
            raise AiaynError(f"{where(file, e.line)}: invalid JSON ({e.detail}); the checkpoint is corrupt") from None
        if not isinstance(config, dict):
            raise AiaynError(f"{file}: expected a JSON object, got {type(config).__name__}")
        ck.check(CONFIG_FILE, data)
        return config
    return read_checkpoint(path, load)


def load_training_state(path: Checkpoint, map_location: str | torch.device = "cpu") -> dict | None:
    """Read ``training_state.pt`` safely (``weights_only=True``), or None if the checkpoint has none.

    Returns:
        ``{"format_version", "optimizer", "scheduler", "rng", **train_state}``: ``optimizer`` and
        ``scheduler`` are state dicts (or None), ``rng`` is for :func:`~aiayn.checkpoint.rng_state.restore_rng`,
        and the rest is the ``train_state`` given to :func:`~aiayn.checkpoint.save.save_checkpoint`.

    Raises:
        AiaynError: the file differs from its checksum, is missing while the manifest lists it, is corrupt,
            or holds objects that are not plain data (refused: loading them could run code).
    """
    def load(ck: CheckpointRead) -> dict | None:
        file = ck.file(STATE_FILE)
        source = ck.os_path(STATE_FILE)
        if source is None:
            return None
        try:
            state = torch.load(source, map_location=map_location, weights_only=True)
        except Exception as e:  # torch raises several types (UnpicklingError, RuntimeError, EOFError)
            raise _state_error(file, e) from None
        if not isinstance(state, dict) or "format_version" not in state:
            raise AiaynError(f"{file}: not an aiayn training state; the checkpoint is corrupt")
        return state
    return read_checkpoint(path, load)


def pickled_class(e: BaseException) -> str | None:
    """The class ``torch.load(weights_only=True)`` refused to unpickle (its seven lines name it), else None."""
    named = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
    return named.group(1) if named else None


def _state_error(file: Path, e: Exception) -> AiaynError:
    """One line for what ``torch.load(weights_only=True)`` raised on the training state ``file``."""
    text, named = str(e), pickled_class(e)
    if named:
        return AiaynError(f"{file}: holds objects other than tensors and plain values (it names {named}); "
                          "refused for safety, since loading it could run code: use a checkpoint that aiayn saved "
                          "(its training state holds only tensors, numbers, strings, lists and dicts), or start a new "
                          "run in another train.out_dir")
    said = re.search(r"WeightsUnpickler error:\s*(.+)", text)  # what went wrong, after torch's general advice
    return out_of_memory(file, e) or AiaynError(
        f"{file}: cannot read training state ({said.group(1).strip() if said else _first_line(e)}); the file is "
        "corrupt: restore it, or start a new run in another train.out_dir")


# ----------------------------------------------------------------------------------------------------- memory


def _weights_bytes(ck: CheckpointRead) -> int | None:
    """The bytes of the tensors ``model.safetensors`` holds, from its header alone (every tensor's dtype and shape
    are known before any is read); None when the file is absent or its header does not fit the file (the reader
    then says what is wrong with it)."""
    f = ck.open_file(MODEL_FILE)
    if f is None:
        return None
    try:
        with f:
            total = os.fstat(f.fileno()).st_size
            (n,) = struct.unpack("<Q", f.read(8))  # the header's length, then the header: JSON
            if n > min(total - 8, 100 * MiB):
                return None
            header = parse_json(f.read(n))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    except (OSError, struct.error, BadJSON, AttributeError, KeyError, IndexError, TypeError):
        return None
    return end if isinstance(end, int) and 8 + n + end == total else None


def _room() -> tuple[int | None, int | None, int | None]:
    """``(limit, in_use, available)`` in bytes: this process's address-space limit (``ulimit -v``) and the address
    space it uses now, and the memory the machine has available (RAM and swap); None where unknown."""
    limit = in_use = available = None
    if resource is not None:
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        limit = None if soft == resource.RLIM_INFINITY else soft
    try:
        status = Path("/proc/self/status").read_text()
        in_use = int(re.search(r"^VmSize:\s+(\d+) kB", status, re.M).group(1)) * 1024
        info = dict(re.findall(r"^(\w+):\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M))
        available = (int(info["MemAvailable"]) + int(info.get("SwapFree", 0))) * 1024
    except (OSError, AttributeError, KeyError, ValueError):
        pass
    return limit, in_use, available


def check_memory(path: Checkpoint, copies: int = 2) -> None:
    """Refuse to load weights that cannot fit: ``copies`` times their size (1: the tensors, mapped from the file; 2:
    those and the model they are copied into) against this process's address-space limit (``ulimit -v``), and their
    size against the memory the machine has available. Nothing is refused where the size or the room is unknown.

    Raises:
        AiaynError: naming the file, the memory needed, the memory there is, and the fix.
    """
    def check(ck: CheckpointRead) -> None:
        weights = _weights_bytes(ck)
        if weights is None:
            return
        file = ck.file(MODEL_FILE)
        limit, in_use, available = _room()
        needed = copies * weights + 64 * MiB  # 64 MiB for what a load allocates besides (the NaN checks' masks)
        if limit is not None and in_use is not None and needed > limit - in_use:
            raise AiaynError(
                f"{file}: the model needs {needed // MiB} MiB of address space to load ({weights // MiB} MiB of "
                f"weights{', mapped from the file and copied into the model' if copies > 1 else ''}); this process "
                f"may use {max(limit - in_use, 0) // MiB} MiB more (ulimit -v allows {limit // MiB} MiB, "
                f"{in_use // MiB} MiB are in use): raise the limit (ulimit -v unlimited), or load a smaller model")
        if available is not None and weights + 64 * MiB > available:
            raise AiaynError(
                f"{file}: the model needs {(weights + 64 * MiB) // MiB} MiB of memory to load; this machine has "
                f"{available // MiB} MiB available: stop other programs that use memory, or use a machine with more")
    read_checkpoint(path, check)


def _says_out_of_memory(e: BaseException) -> bool:
    """Whether an error of torch or safetensors says that memory could not be had."""
    return isinstance(e, MemoryError) or getattr(e, "errno", None) == 12 or bool(
        re.search(r"can't allocate|cannot allocate|not enough memory|out of memory|bad_alloc|os error 12",
                  str(e), re.I))


def out_of_memory(file: Path, e: BaseException) -> AiaynError | None:
    """The error to raise for ``e`` when it is an allocation that failed while ``file`` was read or its model was
    built (``MemoryError``, or torch's RuntimeError saying it could not allocate); None for any other error."""
    if not _says_out_of_memory(e):
        return None
    limit, _, available = _room()
    room = [f"ulimit -v allows this process {limit // MiB} MiB" if limit is not None else "",
            f"the machine has {available // MiB} MiB available" if available is not None else ""]
    said = "; ".join(r for r in room if r)
    return AiaynError(f"{file}: out of memory while loading the model ({_first_line(e)}){f'; {said}' if said else ''}"
                      ": raise the limit (ulimit -v unlimited), stop other programs that use memory, or load a "
                      "smaller model")


@contextmanager
def memory_errors_said(file: Path) -> Iterator[None]:
    """Raise an allocation that fails in the block (building or moving the model of ``file``) as one
    :class:`AiaynError` (:func:`out_of_memory`); every other error passes as it is."""
    try:
        yield
    except (MemoryError, RuntimeError) as e:
        error = out_of_memory(file, e)
        if error is None:
            raise
        raise error from None


def _first_line(e: BaseException, limit: int = 200) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text if len(text) <= limit else text[:limit] + "..."
