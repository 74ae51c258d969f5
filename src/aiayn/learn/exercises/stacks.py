"""Lesson 7: encoder and decoder: teacher forcing's inputs and labels, and an encoder stack's forward pass.

References: :func:`aiayn.data.batching.collate_seq2seq` and :class:`aiayn.models.stack.TransformerStack`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import torch
from torch import Tensor

from aiayn.config import ModelConfig
from aiayn.data.batching import collate_seq2seq
from aiayn.learn.checking import Case, Exercise, Mistake
from aiayn.learn.exercises.common import generator, randn
from aiayn.models.stack import TransformerStack
from aiayn.nn.masks import padding_mask


# ---------------------------------------------------------------------------------------------- teacher_forcing
def teacher_forcing_reference(targets: list[list[int]], bos_id: int, eos_id: int, pad_id: int
                              ) -> tuple[Tensor, Tensor]:
    """B target sequences -> tgt_in (B, T) = [BOS] + target, padded with pad_id; labels (B, T) = target + [EOS],
    padded with -100 (T = longest target + 1)."""
    batch = collate_seq2seq(targets, targets, pad_id, bos_id, eos_id)
    return batch["tgt_in"], batch["labels"]


def teacher_forcing_variant(shift: str = "right", eos: bool = True, label_pad: str = "ignore", bos: bool = True
                            ) -> Callable[..., tuple[Tensor, Tensor]]:
    """The decoder's inputs and labels, or wrong ones: ``shift`` "none" (the labels are the inputs) or "wrong_way"
    (inputs end with EOS, labels start with BOS); ``eos`` False; ``label_pad`` "pad" (labels padded with pad_id);
    ``bos`` False."""
    def teacher_forcing(targets: list[list[int]], bos_id: int, eos_id: int, pad_id: int) -> tuple[Tensor, Tensor]:
        start = [bos_id] if bos else []
        end = [eos_id] if eos else []
        ins = [start + list(t) for t in targets]
        outs = [list(t) + end for t in targets]
        if shift == "none":
            outs = ins
        elif shift == "wrong_way":
            ins, outs = [list(t) + end for t in targets], [start + list(t) for t in targets]
        t = max(max(len(x) for x in ins), max(len(x) for x in outs))
        fill = -100 if label_pad == "ignore" else pad_id
        tgt_in = torch.tensor([x + [pad_id] * (t - len(x)) for x in ins], dtype=torch.long)
        labels = torch.tensor([x + [fill] * (t - len(x)) for x in outs], dtype=torch.long)
        return tgt_in, labels

    return teacher_forcing


def _teacher_cases(rng: random.Random) -> list[Case]:
    lengths = [rng.randint(1, 6) for _ in range(3)]
    random_targets = [[rng.randint(5, 20) for _ in range(n)] for n in lengths]
    return [Case("one target [7, 8, 9]", ([[7, 8, 9]], 1, 2, 0)),
            Case("two targets of lengths 3 and 1", ([[5, 6, 7], [9]], 1, 2, 0)),
            Case("other special ids: BOS 3, EOS 4, pad 9", ([[10, 11], [12, 13, 14, 15]], 3, 4, 9)),
            Case(f"random: lengths {lengths}", (random_targets, 1, 2, 0))]


TEACHER_FORCING = Exercise(
    name="teacher_forcing",
    signature="teacher_forcing(targets, bos_id, eos_id, pad_id): B lists of target ids -> (tgt_in, labels), each "
              "(B, longest + 1) long: tgt_in = [BOS] + target padded with pad_id, labels = target + [EOS] padded "
              "with -100",
    reference=teacher_forcing_reference,
    variant=teacher_forcing_variant,
    mistakes=(
        Mistake("shift", "none", "labels not shifted",
                "the label at position t is the NEXT token, the one the decoder has not seen: inputs [BOS] + target, "
                "labels target + [EOS]; with the labels equal to the inputs the model only learns to copy its input"),
        Mistake("shift", "wrong_way", "shifted the wrong way",
                "the decoder READS [BOS] + target and must PREDICT target + [EOS]; you swapped them"),
        Mistake("eos", False, "no EOS in the labels",
                "end every label sequence with EOS, or the model never learns to stop"),
        Mistake("label_pad", "pad", "labels padded with the pad id",
                "pad the labels with -100 (the loss's ignore index), so that padding is never scored; pad the "
                "inputs with pad_id"),
        Mistake("bos", False, "no BOS before the inputs",
                "the decoder's first input is BOS (the token that says: start); inputs are [BOS] + target"),
    ),
    cases=_teacher_cases,
    lesson="07",
)


# ---------------------------------------------------------------------------------------------- encode
def encode_reference(stack: TransformerStack, ids: Tensor) -> Tensor:
    """An encoder stack's output (B, S, D) for ids (B, S), right-padded with the config's pad id."""
    return stack(ids)[0]


def encode_variant(positions: str = "input", scale: bool = True, padding: str = "keys", final_norm: bool = True
                   ) -> Callable[..., Tensor]:
    """The encoder's forward pass, or a wrong one: ``positions`` "missing", "after_first_layer" or
    "after_last_layer"; ``scale`` False (embeddings not times sqrt(D)); ``padding`` "none"; ``final_norm`` False."""
    def encode(stack: TransformerStack, ids: Tensor) -> Tensor:
        c = stack.config
        x = stack.embed(ids) * (math.sqrt(c.d_model) if scale else 1.0)  # (B, S, D)
        pe = stack.abs_pos.table[: ids.shape[1]]  # (S, D)
        if positions == "input":
            x = x + pe
        mask = padding_mask(ids != c.pad_id) if padding == "keys" else None  # (B, 1, 1, S)
        for i, layer in enumerate(stack.layers):
            x = layer(x, mask=mask)[0]
            if positions == "after_first_layer" and i == 0:
                x = x + pe
        if positions == "after_last_layer":
            x = x + pe
        return stack.final_norm(x) if final_norm else x

    return encode


def _encode_cases(rng: random.Random) -> list[Case]:
    g = generator(rng)
    config = ModelConfig.preset("tiny", vocab_size=30, d_model=16, n_heads=2, d_ff=32, n_layers=2,
                                norm_position="pre", max_len=32)
    torch.manual_seed(rng.randrange(2**31))
    stack = TransformerStack(config, 2, torch.nn.Embedding(30, 16, padding_idx=0), causal=False).eval()
    with torch.no_grad():
        stack.embed.weight.copy_(randn(g, 30, 16, scale=0.3))
        stack.embed.weight[0] = 0
    t = rng.randint(2, 9)
    random_ids = torch.randint(5, 30, (2, t), generator=g)
    random_ids[1, rng.randint(1, t - 1):] = 0
    return [Case("2 sentences of 5 tokens, no padding", (stack, torch.randint(5, 30, (2, 5), generator=g))),
            Case("lengths 6 and 3, right-padded with 0", (stack, torch.tensor([[5, 9, 12, 7, 22, 8],
                                                                              [6, 17, 11, 0, 0, 0]]))),
            Case("one token", (stack, torch.tensor([[14]]))),
            Case(f"random: 2 sentences of {t} tokens, the second padded", (stack, random_ids))]


ENCODE = Exercise(
    name="encode",
    signature="encode(stack, ids): stack an aiayn TransformerStack (stack.embed, stack.config.d_model, "
              "stack.abs_pos.table (max_len, D), stack.layers, each layer(x, mask=...) -> (x, _, _), "
              "stack.final_norm), ids (B, S) right-padded with stack.config.pad_id -> (B, S, D)",
    reference=encode_reference,
    variant=encode_variant,
    mistakes=(
        Mistake("positions", "after_first_layer", "positions added after the first layer",
                "the first layer's attention then cannot tell positions apart (attention without positions is "
                "permutation-equivariant); add the position table to the embeddings, before any layer"),
        Mistake("positions", "after_last_layer", "positions added after the last layer",
                "no layer saw the positions; add the table to the embeddings before the first layer"),
        Mistake("positions", "missing", "no positions",
                "without positions the encoder is a bag of tokens: add stack.abs_pos.table[:S] to the embeddings"),
        Mistake("scale", False, "embeddings not scaled",
                "the paper multiplies the embeddings by sqrt(d_model) (section 3.4) before adding the positions"),
        Mistake("padding", "none", "padding not masked",
                "real tokens attended to the padding: pass mask = (ids != pad_id)[:, None, None, :] to every layer"),
        Mistake("final_norm", False, "no final norm",
                "a pre-LN stack ends with a norm (stack.final_norm) over the last layer's output"),
    ),
    cases=_encode_cases,
    prepare=None,
    lesson="07",
)
