"""Text generation with a decoder-only model: greedy or sampled continuation of a batch of prompts."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from aiayn.errors import AiaynError
from aiayn.generate.choosers import greedy_chooser
from aiayn.generate.sampling import decode_loop, make_sampler
from aiayn.generate.steppers import LMStepper, eval_mode
from aiayn.models.decoder import DecoderModel


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int = 0,
             device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """Stack prompts right-aligned, so every prompt's next token is at the same column.

    Returns:
        ids (B, P) long and is_token (B, P) bool (False on the left padding).
    """
    p = max(len(x) for x in prompts)
    ids = torch.full((len(prompts), p), pad_id, dtype=torch.long)
    is_token = torch.zeros(len(prompts), p, dtype=torch.bool)
    for i, x in enumerate(prompts):
        if x:
            ids[i, p - len(x):] = torch.tensor(list(x), dtype=torch.long)
            is_token[i, p - len(x):] = True
    return ids.to(device), is_token.to(device)


def generate(
    model: DecoderModel,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    greedy: bool = False,
    seed: int | None = None,
    stop_ids: Sequence[int] = (2,),
    pad_id: int = 0,
    prefix_lm: bool = False,
    on_token: Callable[[int, int], None] | None = None,
) -> list[list[int]]:
    """Continue each prompt: the prompts are left-padded into one batch, prefilled once, then decoded one
    token per step with the KV cache; each row stops at its first stop id or after ``max_new_tokens``.

    Args:
        model: a decoder-only model (put in eval mode for the call, then restored).
        prompts: B non-empty lists of token ids (typically starting with BOS).
        max_new_tokens: the most tokens to generate per prompt.
        temperature: sampling temperature; 0 means greedy.
        top_k, top_p: top-k and nucleus filtering before sampling.
        greedy: take the most likely token (ignores temperature, top_k, top_p, seed).
        seed: seed of the sampling generator (reproducible samples on one device: the CPU and CUDA draw
            different random streams); None draws from torch's global RNG.
        stop_ids: ids that end a row (not included in its output).
        pad_id: padding id; it is never generated.
        prefix_lm: attend bidirectionally within the prompt (a prefix-LM model).
        on_token: streaming callback ``on_token(prompt_index, token_id)`` for each output token.
    Returns:
        The new tokens of each prompt (without the stop id).
    """
    if not isinstance(model, DecoderModel):
        raise AiaynError(f"generate() needs a decoder-only model, got {type(model).__name__}; "
                         "use aiayn.generate.translate() for encoder-decoder models")
    empty = [i for i, p in enumerate(prompts) if len(p) == 0]
    if empty:
        raise AiaynError(f"prompt(s) {empty} are empty; start every prompt with a token (e.g. BOS)")
    if max_new_tokens < 0:
        raise AiaynError(f"max_new_tokens={max_new_tokens} must be >= 0")
    if not prompts or max_new_tokens == 0:
        return [[] for _ in prompts]
    c = model.config
    longest = max(len(p) for p in prompts)
    if c.position in ("sinusoidal", "learned") and longest + max_new_tokens > c.max_len:
        raise AiaynError(f"prompt length {longest} + max_new_tokens {max_new_tokens} exceeds the model's "
                         f"max_len={c.max_len}; shorten the prompt or lower max_new_tokens")
    device = next(model.parameters()).device
    ids, is_token = left_pad(prompts, pad_id, device)
    banned_ids = () if pad_id in stop_ids else (pad_id,)
    greedy = greedy or temperature == 0
    if greedy:  # the stepper returns hidden states; the output layer chooses from them
        choose = greedy_chooser(model.lm_head, banned_ids)
    else:
        generator = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
        choose = make_sampler(temperature, top_k, top_p, generator)
    with eval_mode(model):
        stepper = LMStepper(model, ids, is_token, capacity=ids.shape[1] + max_new_tokens, prefix_lm=prefix_lm,
                            project=not greedy)
        budget = torch.full((len(prompts),), max_new_tokens, dtype=torch.long, device=device)
        tokens, lengths, _ = decode_loop(stepper, choose, budget, stop_ids=stop_ids,
                                         banned_ids=() if greedy else banned_ids,
                                         pad_id=pad_id, on_token=on_token, with_logprob=False)
    return [row[:n] for row, n in zip(tokens.tolist(), lengths.tolist())]
