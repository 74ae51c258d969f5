"""The options every ``aiayn`` command takes (``--accel``, ``--threads``), given before the command or after it."""

from __future__ import annotations

import argparse


def add_global_options(parser: argparse.ArgumentParser) -> None:
    """The options every command takes, on the main parser and on each command's (absent unless given, so that one
    given before the command is not reset by the command's parser)."""
    from aiayn import accel  # lazy: --version answers without torch

    parser.add_argument("--accel", choices=accel.CHOICES, default=argparse.SUPPRESS,
                        help="acceleration: auto (default, or $AIAYN_ACCEL) or none (the reference modules only)")
    parser.add_argument("--threads", type=thread_count, default=argparse.SUPPRESS, metavar="N",
                        help="torch threads (default, unless OMP_NUM_THREADS is set: one per core that other "
                             "processes leave free, one for a small training step; re-checked every 10 s while "
                             "training, and said when fewer than the cores)")


def thread_count(text: str) -> int:
    """``--threads``' value: a whole number of at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of threads, at least 1")
    return int(text)
