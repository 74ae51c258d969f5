"""Batching for sequence-to-sequence training: token-budget batches (as fairseq does) and collation.

The paper (section 5.1): "Sentence pairs were batched together by approximate sequence length. Each
training batch contained a set of sentence pairs containing approximately 25000 source tokens and
25000 target tokens." :func:`token_budget_batches` does that: examples are sorted by length (pairs
by their longer side, then source, then target length; ties and same-bucket examples in a random
order), cut greedily into batches whose padded size stays within a token budget, and the batches
are shuffled. Everything random comes from ``(seed, epoch)``, so a run
resumed at epoch ``e`` sees exactly the batches an uninterrupted run would.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

from aiayn.errors import AiaynError

IGNORE_INDEX = -100  # label value that cross-entropy ignores (torch's default ignore_index)

Lengths = Sequence[int] | Sequence[tuple[int, int]]


def _rng(seed: int, epoch: int) -> random.Random:
    """A generator that depends only on ``(seed, epoch)`` (string seeding is stable across runs)."""
    return random.Random(f"aiayn-batches:{seed}:{epoch}")


def _keys(lengths: Lengths) -> list[int]:
    """Per-example length that counts against the budget: max over source/target for pairs."""
    keys = []
    for i, ln in enumerate(lengths):
        k = max(ln) if isinstance(ln, tuple | list) else int(ln)
        if k < 0:
            raise AiaynError(f"example {i} has a negative length {ln}")
        keys.append(k)
    return keys


def token_budget_batches(
    lengths: Lengths,
    max_tokens: int,
    *,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    bucket_width: int = 1,
    max_batch_size: int | None = None,
    oversized: str = "alone",
) -> list[list[int]]:
    """Group example indices into batches whose padded size fits a token budget.

    The padded size of a batch is ``len(batch) * max(key)`` where an example's key is its length,
    or ``max(src_len, tgt_len)`` for pairs (a length of 0 counts as 1). Pass the lengths the tensors
    will have, e.g. ``(len(src), len(tgt) + 1)`` for :func:`collate_seq2seq`.

    Args:
        lengths: one length per example, or one ``(src_len, tgt_len)`` pair per example.
        max_tokens: budget for each batch's padded size.
        seed: run seed; with ``epoch`` it fixes every random choice.
        epoch: epoch number; each epoch gets different batches and a different batch order.
        shuffle: if False (evaluation), examples are sorted by length (ties by index) and the batches
            come shortest first, with no randomness.
        bucket_width: lengths ``k * w .. k * w + w - 1`` share bucket ``k`` and are mixed randomly;
            1 sorts exactly (least padding), larger widths trade padding for variety.
        max_batch_size: optional cap on examples per batch.
        oversized: what to do with an example whose key exceeds ``max_tokens``: ``"alone"`` puts it
            in a batch of its own (which then exceeds the budget), ``"error"`` raises AiaynError.

    Returns:
        Batches of example indices; every index appears in exactly one batch.
    """
    if max_tokens < 1:
        raise AiaynError(f"max_tokens must be >= 1, got {max_tokens}")
    if bucket_width < 1:
        raise AiaynError(f"bucket_width must be >= 1, got {bucket_width}")
    if max_batch_size is not None and max_batch_size < 1:
        raise AiaynError(f"max_batch_size must be >= 1 or None, got {max_batch_size}")
    if oversized not in ("alone", "error"):
        raise AiaynError(f"oversized must be 'alone' or 'error', got {oversized!r}")
    keys = [max(k, 1) for k in _keys(lengths)]
    rng = _rng(seed, epoch)
    order = list(range(len(keys)))
    if shuffle:
        rng.shuffle(order)
    w = bucket_width
    if len(lengths) > 0 and isinstance(lengths[0], tuple | list):
        # by the budget key, then source, then target length: keeps both sides' padding small
        order.sort(key=lambda i: (keys[i] // w, lengths[i][0] // w, lengths[i][1] // w))  # type: ignore[index]
    else:
        order.sort(key=lambda i: keys[i] // w)  # stable: random order inside each bucket

    batches: list[list[int]] = []
    batch: list[int] = []
    batch_max = 0
    for i in order:
        k = keys[i]
        if k > max_tokens:
            if oversized == "error":
                raise AiaynError(
                    f"example {i} is {k} tokens long, more than max_tokens={max_tokens}; raise max_tokens "
                    "or filter long pairs first (filter_by_token_length)"
                )
            if batch:
                batches.append(batch)
                batch, batch_max = [], 0
            batches.append([i])
            continue
        new_max = max(batch_max, k)
        full = max_batch_size is not None and len(batch) >= max_batch_size
        if batch and (full or (len(batch) + 1) * new_max > max_tokens):
            batches.append(batch)
            batch, new_max = [], k
        batch.append(i)
        batch_max = new_max
    if batch:
        batches.append(batch)
    if shuffle:
        rng.shuffle(batches)
    return batches


def fixed_size_batches(
    n: int, batch_size: int, *, seed: int, epoch: int, shuffle: bool = True
) -> list[list[int]]:
    """Plain batches of ``batch_size`` examples in random order (the last one may be smaller).

    The baseline that :func:`token_budget_batches` is measured against; also fine for data of equal
    lengths (e.g. packed language-model blocks).

    Args:
        n: number of examples.
        batch_size: examples per batch.
        seed: run seed.
        epoch: epoch number (a different permutation each epoch).
        shuffle: if False, indices stay in order.
    """
    if batch_size < 1:
        raise AiaynError(f"batch_size must be >= 1, got {batch_size}")
    order = list(range(n))
    if shuffle:
        _rng(seed, epoch).shuffle(order)
    return [order[i : i + batch_size] for i in range(0, n, batch_size)]


def collate_seq2seq(
    src_ids: Sequence[Sequence[int]],
    tgt_ids: Sequence[Sequence[int]],
    pad_id: int,
    bos_id: int,
    eos_id: int,
) -> dict[str, torch.Tensor | int]:
    """Pad a batch of token-id pairs into the tensors teacher-forced training needs.

    Args:
        src_ids: B source sequences (no BOS/EOS).
        tgt_ids: B target sequences (no BOS/EOS).
        pad_id: id used to pad ``src`` and ``tgt_in``.
        bos_id: id put before each target in ``tgt_in``.
        eos_id: id put after each target in ``labels``.

    Returns:
        ``src`` (B, S) long, right-padded with ``pad_id`` (S >= 1 even if every source is empty);
        ``tgt_in`` (B, T) long, ``[bos] + target`` right-padded with ``pad_id``;
        ``labels`` (B, T) long, ``target + [eos]`` right-padded with ``IGNORE_INDEX`` (-100);
        ``n_tokens`` int, the number of labels that are not ``IGNORE_INDEX``.
        ``tgt_in[:, t]`` is the decoder input whose next token is ``labels[:, t]``.
    """
    if len(src_ids) != len(tgt_ids):
        raise AiaynError(f"collate got {len(src_ids)} sources but {len(tgt_ids)} targets")
    if len(src_ids) == 0:
        raise AiaynError("collate got an empty batch")
    b = len(src_ids)
    s_len = max(1, max(len(s) for s in src_ids))
    t_len = max(len(t) for t in tgt_ids) + 1
    src = torch.full((b, s_len), pad_id, dtype=torch.long)  # (B, S)
    tgt_in = torch.full((b, t_len), pad_id, dtype=torch.long)  # (B, T)
    labels = torch.full((b, t_len), IGNORE_INDEX, dtype=torch.long)  # (B, T)
    n_tokens = 0
    for i, (s, t) in enumerate(zip(src_ids, tgt_ids)):
        if len(s):
            src[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
        tgt_in[i, : len(t) + 1] = torch.as_tensor([bos_id, *t], dtype=torch.long)
        labels[i, : len(t) + 1] = torch.as_tensor([*t, eos_id], dtype=torch.long)
        n_tokens += len(t) + 1
    return {"src": src, "tgt_in": tgt_in, "labels": labels, "n_tokens": n_tokens}


def padding_fraction(batches: Sequence[Sequence[int]], lengths: Lengths) -> float:
    """Fraction of padded positions in the given batches (0 = no waste).

    For pairs, source and target are padded separately and both count:
    ``1 - sum(real tokens) / sum(B * S + B * T)``.

    Args:
        batches: batches of example indices.
        lengths: the same lengths given to the batcher.
    """
    real = padded = 0
    for batch in batches:
        if not batch:
            continue
        first = lengths[batch[0]]
        sides = len(first) if isinstance(first, tuple | list) else 0
        if sides:
            for side in range(sides):
                side_lens = [lengths[i][side] for i in batch]  # type: ignore[index]
                real += sum(side_lens)
                padded += len(batch) * max(side_lens)
        else:
            side_lens = [int(lengths[i]) for i in batch]  # type: ignore[arg-type]
            real += sum(side_lens)
            padded += len(batch) * max(side_lens)
    return 0.0 if padded == 0 else 1.0 - real / padded
