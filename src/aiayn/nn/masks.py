"""Boolean attention masks. True means "may attend" (the SDPA convention).

Every function returns a bool tensor that broadcasts against attention scores of shape
``(B, H, T, S)``: 2-D masks are ``(T, S)``, per-example masks are ``(B, 1, T, S)`` or ``(B, 1, 1, S)``.
Combine them with :func:`combine` (logical AND, ``None`` meaning "no restriction"). Additive position
biases (ALiBi, T5) are not masks; they travel separately as a float ``bias``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def padding_mask(key_is_token: Tensor) -> Tensor:
    """Keys that are real tokens may be attended.

    Args:
        key_is_token: (B, S) bool, True at real tokens, False at padding.
    Returns:
        (B, 1, 1, S) bool.
    """
    return key_is_token[:, None, None, :]


def padding_mask_from_ids(ids: Tensor, pad_id: int) -> Tensor:
    """Padding mask from token ids: (B, S) long -> (B, 1, 1, S) bool."""
    return padding_mask(ids != pad_id)


def causal_mask(t: int, s: int | None = None, device: torch.device | str | None = None) -> Tensor:
    """Query i may attend key j when j <= i, with queries aligned to the END of the keys.

    With a KV cache the T new queries are the last T of S positions, so query i sits at absolute
    position ``S - T + i``.

    Returns:
        (T, S) bool, lower-triangular when T == S.
    """
    s = t if s is None else s
    q = torch.arange(s - t, s, device=device)[:, None]  # (T, 1)
    k = torch.arange(s, device=device)[None, :]  # (1, S)
    return k <= q


def sliding_window_mask(t: int, window: int, s: int | None = None, causal: bool = True,
                        device: torch.device | str | None = None) -> Tensor:
    """Each query sees only the ``window`` most recent keys (itself included); bidirectional if not causal.

    Returns:
        (T, S) bool, queries aligned to the end of the keys as in :func:`causal_mask`.
    """
    s = t if s is None else s
    q = torch.arange(s - t, s, device=device)[:, None]
    k = torch.arange(s, device=device)[None, :]
    near = (q - k).abs() < window
    return near & (k <= q) if causal else near


def prefix_lm_mask(t: int, prefix_len: Tensor) -> Tensor:
    """Prefix-LM: the first ``prefix_len[b]`` tokens see each other fully; the rest are causal.

    Args:
        t: sequence length T.
        prefix_len: (B,) long, length of each example's bidirectional prefix.
    Returns:
        (B, 1, T, T) bool.
    """
    causal = causal_mask(t, device=prefix_len.device)  # (T, T)
    in_prefix = torch.arange(t, device=prefix_len.device)[None, :] < prefix_len[:, None]  # (B, T)
    return (causal[None] | in_prefix[:, None, :])[:, None]  # key j in prefix visible to all queries


def local_global_mask(t: int, window: int, global_positions: Tensor | list[int], causal: bool = False,
                      device: torch.device | str | None = None, s: int | None = None) -> Tensor:
    """Longformer-style: a local window, plus global tokens that see and are seen by every position.

    Args:
        global_positions: key positions (in 0 .. S - 1) of the global tokens.
        s: key length S (default T); the T queries are the last T of the S positions, as in :func:`causal_mask`.
    Returns:
        (T, S) bool.
    """
    s = t if s is None else s
    mask = sliding_window_mask(t, window, s, causal=False, device=device)
    g = torch.zeros(s, dtype=torch.bool, device=device)
    g[torch.as_tensor(global_positions, dtype=torch.long, device=device)] = True
    mask = mask | g[None, :] | g[s - t:, None]
    return mask & causal_mask(t, s, device=device) if causal else mask


def block_sparse_mask(t: int, block: int, local_blocks: int = 1, stride: int | None = None,
                      causal: bool = False, device: torch.device | str | None = None, s: int | None = None) -> Tensor:
    """Block-sparse pattern (Sparse Transformer style) at block granularity.

    Query block qb may attend key block kb when ``|qb - kb| < local_blocks`` or, with ``stride``, when
    ``kb % stride == stride - 1`` (summary blocks every ``stride`` blocks).

    Args:
        s: key length S (default T); the T queries are the last T of the S positions, as in :func:`causal_mask`.
    Returns:
        (T, S) bool.
    """
    s = t if s is None else s
    qb = torch.arange(s - t, s, device=device)[:, None] // block  # (T, 1)
    kb = torch.arange(s, device=device)[None, :] // block  # (1, S)
    mask = (qb - kb).abs() < local_blocks
    if stride:
        mask = mask | (kb % stride == stride - 1)
    return mask & causal_mask(t, s, device=device) if causal else mask


def document_mask(doc_ids: Tensor, causal: bool = True) -> Tensor:
    """Packed sequences: tokens attend only within their own document.

    Args:
        doc_ids: (B, T) integer document id of each token (padding may use its own id, e.g. -1).
    Returns:
        (B, 1, T, T) bool.
    """
    same = doc_ids[:, :, None] == doc_ids[:, None, :]  # (B, T, T)
    if causal:
        same = same & causal_mask(doc_ids.shape[1], device=doc_ids.device)
    return same[:, None]


def combine(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of masks with broadcasting; ``None`` entries impose nothing. Returns None if all are None."""
    out: Tensor | None = None
    for m in masks:
        if m is None:
            continue
        out = m if out is None else out & m
    return out


def render(mask: Tensor, as_bias: bool = True) -> str:
    """Draw a 2-D mask as text: ``0`` where allowed and ``-inf`` where masked (or 1/0 if not ``as_bias``).

    Args:
        mask: (T, S) bool (extra leading dims of size 1 are squeezed).
    """
    m = mask
    while m.dim() > 2:
        m = m[0]
    on, off = ("0", "-inf") if as_bias else ("1", "0")
    width = max(len(on), len(off))
    return "\n".join(" ".join((on if bool(x) else off).rjust(width) for x in row) for row in m.tolist())
