"""Checkpoints as directories, written so that a kill at any instruction leaves one that loads.

A checkpoint directory holds:

- ``config.json``: the caller's config dict (model config, tokenizer kind, ...).
- ``model.safetensors``: the model's state dict. Shared (tied) tensors are stored once; the other
  names are recorded in the file's metadata (``aiayn.aliases``) and restored on load.
- tokenizer files: copied from given paths, or written by a callback.
- ``training_state.pt`` (optional): optimizer and scheduler state, RNG states, and the caller's
  ``train_state`` (step, epoch, data position, anything JSON-like). Read only with
  ``torch.load(weights_only=True)``, so it holds tensors, numbers, strings, lists and dicts, never
  pickled objects.
- ``manifest.json``, written last: the format version and the size and SHA-256 of every other file. A
  directory whose manifest is present and whose files have the listed sizes is *complete*; the loaders
  check the weights', the training state's and the config's checksums. Checkpoints written before
  manifests existed load unverified.

Saving (:func:`save_checkpoint`): everything is serialized in memory first (a bad config, an
unsafe ``train_state`` or NaN/inf weights are refused before the disk is touched), then written into a
temporary sibling ``.<name>.tmp-<host>-<pid>-<random>`` with every file fsynced and the manifest
last. Then an existing ``<name>`` is renamed to ``<name>.old``, the new directory renamed to
``<name>``, the parent fsynced, and ``<name>.old`` renamed to ``.<name>.trash-<host>-<pid>-<random>``
before it is deleted, so a half-deleted folder never sits under a name a reader looks at. At every
instant ``<name>`` is complete, or it is missing and ``<name>.old`` is complete; :func:`checkpoint_dir`
finds whichever it is. A load reads through :class:`~aiayn.checkpoint.layout.CheckpointRead`, which pins that
directory, its manifest and its files at once, so that a save replacing the checkpoint meanwhile cannot mix two
saves' files in one load (tokenizers included). An error after
``<name>`` was moved aside moves it back. Temporary and trash folders left by a killed save are deleted
by a later save once their process is gone (same host: the pid no longer exists; another host: older
than a day), never while it runs. Every ``OSError`` of a save becomes one :class:`AiaynError` naming
the path and the cause in words.

This package's ``__init__`` is the API; the code lives in:

- :mod:`aiayn.checkpoint.save`: serializing and saving (:func:`save_checkpoint`).
- :mod:`aiayn.checkpoint.load`: reading weights, config and training state back.
- :mod:`aiayn.checkpoint.layout`: the file names, the manifest, completeness, where a cut-short save left the
  checkpoint (:func:`checkpoint_dir`, :func:`recovered_file`); below every package that reads checkpoints.
- :mod:`aiayn.checkpoint.atomic`: writing a checkpoint with its manifest and the two renames of a save (a resumed
  run's recovery after a save cut short is :func:`aiayn.train.restore.recover_checkpoint`, beside the run lock).
- :mod:`aiayn.checkpoint.sets`: averaging checkpoints, listing and pruning a run's checkpoints.
- :mod:`aiayn.checkpoint.rng_state`: the RNG states a training state holds.
- :mod:`aiayn.checkpoint.disk`: fsynced writes, hidden temporary and trash folders, sweeping the leftovers of
  dead processes, ``OSError`` in words.
"""

from __future__ import annotations

from aiayn.checkpoint.disk import STALE_AFTER_S, describe_os_error
from aiayn.checkpoint.layout import (
    ALIASES_KEY,
    CONFIG_FILE,
    FORMAT_VERSION,
    MANIFEST_FILE,
    MODEL_FILE,
    STATE_FILE,
    checkpoint_dir,
    checkpoint_file,
    recovered_file,
)
from aiayn.checkpoint.load import load_config, load_model_state, load_training_state, read_state_dict
from aiayn.checkpoint.rng_state import capture_rng, restore_rng
from aiayn.checkpoint.save import TokenizerWriter, save_checkpoint
from aiayn.checkpoint.sets import average_checkpoints, keep_last, periodic_checkpoints, write_average

__all__ = [
    "ALIASES_KEY",
    "CONFIG_FILE",
    "FORMAT_VERSION",
    "MANIFEST_FILE",
    "MODEL_FILE",
    "STALE_AFTER_S",
    "STATE_FILE",
    "TokenizerWriter",
    "average_checkpoints",
    "capture_rng",
    "checkpoint_dir",
    "checkpoint_file",
    "describe_os_error",
    "keep_last",
    "load_config",
    "load_model_state",
    "load_training_state",
    "periodic_checkpoints",
    "read_state_dict",
    "recovered_file",
    "restore_rng",
    "save_checkpoint",
    "write_average",
]
