"""Checks on the inputs of a decoding command, before the model sees them: inputs longer than the model takes,
inputs with nothing to decode, and inputs the tokenizer mostly does not know.

``aiayn translate``, ``generate`` and ``classify`` share them, so every command treats an over-long input by one
policy (``--on-long``) and words its warnings alike: each names the input (``file:line``, ``stdin:line`` or
``prompt N``), its length and the model's limit, and says what the model does with it.
"""

from __future__ import annotations

from collections.abc import Sequence

from aiayn.errors import AiaynError

ON_LONG = ("warn", "error", "truncate")
"""``--on-long`` policies: ``warn`` cuts an over-long input to the model's limit and says so, naming it; ``error``
stops before decoding anything, naming the first one; ``truncate`` cuts silently."""

UNKNOWN_SHARE = 0.10
"""An input is warned about when more than this share of its tokens are the tokenizer's ``<unk>``."""

SHOWN = 10
"""Warnings of one kind named one by one; the rest are counted in one last line."""


def input_name(path: str | None) -> str:
    """How messages name an input file: its path, or ``stdin`` for ``None`` and ``-``."""
    return "stdin" if path is None or path == "-" else str(path)


def is_blank(text: str, ids: Sequence[int]) -> bool:
    """An input with nothing to decode: empty or only whitespace, or no tokens at all."""
    return not text.strip() or len(ids) == 0


def _capped(messages: list[str], more: str) -> list[str]:
    """The first :data:`SHOWN` messages, then ``"N more <more>"`` for the rest."""
    if len(messages) <= SHOWN:
        return messages
    return [*messages[:SHOWN], f"{len(messages) - SHOWN} more {more}"]


def check_lengths(lengths: Sequence[int], limit: int, on_long: str, names: Sequence[str], effect: str,
                  fix: str = "split it") -> list[str]:
    """Hold each input's token count against the model's limit, by the ``--on-long`` policy.

    Args:
        lengths: (N,) the number of tokens of each input, before any cut.
        limit: the most tokens of an input the model takes whole.
        on_long: one of :data:`ON_LONG`.
        names: (N,) how to name each input in a message, e.g. ``in.txt:3`` or ``prompt 2``.
        effect: what happens to an input over the limit, as a clause, e.g. ``"only its first 128 tokens are
            translated"``.
        fix: what the user can do to the input instead, e.g. ``"split the line"``.

    Returns:
        Under ``warn``, one warning per input over the limit (the first :data:`SHOWN` of them, then a count);
        under ``truncate``, none.

    Raises:
        AiaynError: under ``error``, naming the first input over the limit (and how many more there are), the
            limit and the fixes; an unknown policy.
    """
    if on_long not in ON_LONG:
        raise AiaynError(f"--on-long {on_long!r}: choose one of {', '.join(ON_LONG)}")
    over = [(name, n) for name, n in zip(names, lengths) if n > limit]
    if not over or on_long == "truncate":
        return []
    if on_long == "error":
        name, n = over[0]
        more = f" ({len(over) - 1} more inputs are too)" if len(over) > 1 else ""
        raise AiaynError(f"{name}: {n} tokens, more than the model's limit of {limit} tokens{more}; {fix}, or pass "
                         f"--on-long truncate (or warn) to go on anyway: then {effect}")
    return _capped([f"{name}: {n} tokens, more than the model's limit of {limit} tokens; {effect} ({fix}, or pass "
                    "--on-long truncate to cut without this warning)" for name, n in over],
                   f"inputs over the limit of {limit} tokens")


def check_unknown(ids: Sequence[Sequence[int]], unk_id: int | None, names: Sequence[str],
                  share: float = UNKNOWN_SHARE) -> list[str]:
    """Warnings for inputs where more than ``share`` of the tokens are ``unk_id``.

    Args:
        ids: (N,) the token ids of each input.
        unk_id: the tokenizer's ``<unk>`` id; None for a pretrained vocabulary without one (byte-level
            vocabularies never produce it, so they are never warned about).
        names: (N,) how to name each input.
        share: the tolerated share of unknown tokens.

    Returns:
        One warning per such input (the first :data:`SHOWN` of them, then a count).
    """
    out = []
    for name, row in zip(names, ids):
        k = sum(1 for t in row if t == unk_id)
        if row and k / len(row) > share:
            out.append(f"{name}: {k} of {len(row)} tokens ({k / len(row):.0%}) are unknown to the tokenizer "
                       "(words or characters absent from its training data); the model sees each as <unk>, so "
                       "the output may drop or garble them")
    return _capped(out, f"inputs with more than {share:.0%} unknown tokens")
