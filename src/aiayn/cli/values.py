"""Checked values of command-line options: argparse ``type=`` functions that refuse a bad number at parse time, and
checks of devices and output paths made before any work starts.

A value argparse refuses ends the command with ``aiayn COMMAND: error: argument --FLAG: ...`` and exit code 2
(argparse's own convention), before a checkpoint is loaded or a file is read.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

import torch

from aiayn.errors import AiaynError

#: the largest whole number an option takes (a 64-bit signed integer: what torch's seeds and sizes hold)
MAX_WHOLE = 2**63 - 1


def whole(low: int, high: int = MAX_WHOLE) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` to ``high``.

    Args:
        low: the smallest value allowed.
        high: the largest value allowed.
    Returns:
        A function ``text -> int`` that raises :class:`argparse.ArgumentTypeError` with the fix.
    """
    span = f"at least {low}" if high == MAX_WHOLE else f"from {low} to {high}"

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; give one {span}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{text}: give a whole number {span}")
        if value > high:
            raise argparse.ArgumentTypeError(f"{text}: too large; give a whole number from {low} to {high}")
        return value

    parse.__name__ = "whole number"  # what argparse would call the type in its own messages
    return parse


def number(low: float, high: float = math.inf, *, open_low: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number in ``[low, high]`` (``(low, high]`` with ``open_low``).

    Args:
        low: the lower end.
        high: the upper end (inf: none).
        open_low: whether ``low`` itself is refused.
    Returns:
        A function ``text -> float`` that raises :class:`argparse.ArgumentTypeError` with the fix.
    """
    if math.isinf(high):
        span = f"{'above' if open_low else 'at least'} {low:g}"
    else:
        span = f"in {'(' if open_low else '['}{low:g}, {high:g}]"

    def parse(text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number; give a number {span}") from None
        above = value > low if open_low else value >= low
        if not (math.isfinite(value) and above and value <= high):
            raise argparse.ArgumentTypeError(f"{text}: give a finite number {span}")
        return value

    parse.__name__ = "number"
    return parse


def utf8_text(text: str) -> str:
    """An argparse type: text given on the command line, which must be valid UTF-8 (Python keeps the bytes of an
    undecodable argument as lone surrogates, which no file, page or terminal can take)."""
    bad = next((i for i, ch in enumerate(text) if "\ud800" <= ch <= "\udfff"), None)
    if bad is not None:
        byte = f" (byte {ord(text[bad]) - 0xDC00:#04x})" if "\udc80" <= text[bad] <= "\udcff" else ""
        raise argparse.ArgumentTypeError(f"not valid UTF-8 text{byte} at character {bad + 1}; give UTF-8 text, or "
                                         "put the text in a UTF-8 file")
    return text


def device_name(name: str, flag: str = "--device") -> str:
    """Check a ``--device`` value (auto, cpu, cuda, cuda:N, mps) against torch and this machine; returns it.

    Raises:
        AiaynError: not a device torch knows, or a CUDA device this machine lacks.
    """
    from aiayn.train.train_config import device_problem  # lazy: loaded when the command runs

    if device_problem(name) is not None:
        raise AiaynError(f"{flag} {name}: not a device; use auto, cpu, cuda, cuda:N or mps")
    if name == "auto":
        return name
    device = torch.device(name)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise AiaynError(f"{flag} {name}: this machine has no CUDA GPU that torch can use; use --device cpu "
                             "(or auto)")
        if device.index is not None and device.index >= count:
            raise AiaynError(f"{flag} {name}: this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}; "
                             "pick one of them")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise AiaynError(f"{flag} {name}: MPS is not available on this machine; use --device cpu (or auto)")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise AiaynError(f"{flag} {name}: aiayn runs on cpu, cuda or mps; use one of them (or auto)")
    return name


def output_file(path: str | None, flag: str) -> None:
    """Check before any work that ``path`` (an option naming a file to write; None or ``-``: stdout) can be a file:
    not a folder, and no file where a parent folder must go.

    Raises:
        AiaynError: naming the option, the path and the fix.
    """
    if path is None or path == "-":
        return
    p = Path(path)
    if p.is_dir():
        raise AiaynError(f"{flag} {path}: is a folder; give the path of a file to write (e.g. {p / 'out.txt'})")
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise AiaynError(f"{flag} {path}: {parent} is a file, not a folder; choose another path")
            break
