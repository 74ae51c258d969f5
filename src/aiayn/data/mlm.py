"""BERT's masked-language-model corruption (Devlin et al., 2019, section 3.1).

"The training data generator chooses 15% of the token positions at random for prediction. If the
i-th token is chosen, we replace the i-th token with (1) the [MASK] token 80% of the time (2) a
random token 10% of the time (3) the unchanged i-th token 10% of the time."

Each eligible position is chosen independently with probability ``mlm_prob`` (as in BERT and HF's
``DataCollatorForLanguageModeling``), so 15% is the expected share, not an exact count; a batch can
have no chosen position at all, in which case every label is -100.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from aiayn.errors import AiaynError

IGNORE_INDEX = -100


def mask_tokens(
    input_ids: torch.Tensor,
    *,
    mask_id: int,
    vocab_size: int,
    special_ids: Iterable[int],
    generator: torch.Generator | None = None,
    mlm_prob: float = 0.15,
    mask_prob: float = 0.8,
    random_prob: float = 0.1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Corrupt a batch for masked-LM training.

    Args:
        input_ids: (B, T) LongTensor of token ids.
        mask_id: The [MASK] id (never chosen, never drawn as a random replacement).
        vocab_size: Vocabulary size V; random replacements are drawn uniformly from ``[0, V)`` minus
            ``special_ids`` and ``mask_id``.
        special_ids: Ids never chosen for prediction: padding, BOS/CLS, EOS/SEP, UNK, ...
        generator: Source of randomness (its device is used for drawing); None uses torch's global one.
        mlm_prob: Probability that an eligible position is chosen.
        mask_prob: Share of chosen positions replaced by ``mask_id``.
        random_prob: Share of chosen positions replaced by a random token; the remaining
            ``1 - mask_prob - random_prob`` keep their token.

    Returns:
        ``(masked_input, labels)``, both (B, T): the corrupted ids, and the original id at chosen
        positions with -100 elsewhere.
    """
    if not 0.0 <= mlm_prob <= 1.0:
        raise AiaynError(f"mlm_prob must be in [0, 1], got {mlm_prob}")
    if mask_prob < 0 or random_prob < 0 or mask_prob + random_prob > 1.0:
        raise AiaynError(
            f"mask_prob ({mask_prob}) and random_prob ({random_prob}) must be >= 0 and sum to at most 1"
        )
    excluded = set(special_ids) | {mask_id}
    candidates = torch.tensor([i for i in range(vocab_size) if i not in excluded], dtype=torch.long)
    if random_prob > 0 and candidates.numel() == 0:
        raise AiaynError(
            f"no ordinary token to draw at random: vocab_size {vocab_size} holds only special ids"
        )

    device = input_ids.device
    gen_device = generator.device if generator is not None else torch.device("cpu")
    special = torch.tensor(sorted(excluded), dtype=input_ids.dtype, device=device)
    eligible = ~torch.isin(input_ids, special)  # (B, T)

    shape = input_ids.shape
    u_choose = torch.rand(shape, generator=generator, device=gen_device).to(device)  # (B, T)
    u_how = torch.rand(shape, generator=generator, device=gen_device).to(device)  # (B, T)
    pick = torch.randint(max(candidates.numel(), 1), shape, generator=generator, device=gen_device)
    chosen = eligible & (u_choose < mlm_prob)
    to_mask = chosen & (u_how < mask_prob)
    to_random = chosen & (u_how >= mask_prob) & (u_how < mask_prob + random_prob)

    masked = input_ids.clone()
    masked[to_mask] = mask_id
    if candidates.numel() > 0:
        random_ids = candidates.to(gen_device)[pick].to(device=device, dtype=input_ids.dtype)  # (B, T)
        masked = torch.where(to_random, random_ids, masked)
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    return masked, labels
