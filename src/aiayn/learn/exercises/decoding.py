"""Lesson 8: decoding: greedy search with a KV cache, and one step of beam search.

References: :func:`aiayn.generate.greedy_translate` and the candidate selection of :func:`aiayn.generate.beam_search`
(each sentence's K beams times V tokens flattened, the best K kept; beam = index // V, token = index % V).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.generate import greedy_translate
from aiayn.learn.checking import Case, Exercise, Mistake
from aiayn.learn.exercises.common import generator, randn
from aiayn.models.build import build_model

PAD, BOS, EOS = 0, 1, 2


# ---------------------------------------------------------------------------------------------- greedy_decode
def greedy_decode_reference(model: nn.Module, src: Tensor, max_len: int) -> list[list[int]]:
    """Each source's greedy output ids (no BOS, no EOS), at most ``max_len`` of them."""
    hyps = greedy_translate(model, src, max_len_a=0.0, max_len_b=max_len, bos_id=BOS, eos_id=EOS, pad_id=PAD)
    return [list(h.tokens) for h in hyps]


def greedy_decode_variant(feed: str = "new_token", stop: str = "eos", start: str = "bos", steps: str = "max_len"
                          ) -> Callable[..., list[list[int]]]:
    """Greedy decoding, or a wrong one: ``feed`` "whole_prefix" (the whole prefix fed again into the cache at every
    step); ``stop`` "never" (tokens after EOS kept) or "keep_eos" (EOS in the output); ``start`` "pad"; ``steps``
    "one_less"."""
    def greedy_decode(model: Any, src: Tensor, max_len: int) -> list[list[int]]:
        memory, src_is_token, _ = model.encode(src)  # (B, S, D)
        b = src.shape[0]
        cache = model.new_cache(max_len + 1)
        prefix = torch.full((b, 1), BOS if start == "bos" else PAD, dtype=torch.long)  # (B, 1)
        out: list[list[int]] = [[] for _ in range(b)]
        done = [False] * b
        for _ in range(max_len if steps == "max_len" else max_len - 1):
            fed = prefix if feed == "whole_prefix" else prefix[:, -1:]
            logits = model.decode(fed, memory, src_is_token, cache=cache).logits  # (B, t, V)
            tok = logits[:, -1].argmax(-1)  # (B,)
            for i, token in enumerate(tok.tolist()):
                if done[i]:
                    continue
                if token == EOS and stop != "never":
                    done[i] = True
                    if stop == "keep_eos":
                        out[i].append(token)
                    continue
                if token != EOS:
                    out[i].append(token)
            if all(done):
                break
            prefix = torch.cat([prefix, tok[:, None]], dim=1)
        return out

    return greedy_decode


#: the fixed sources the decoding model is fitted to (the first case)
PROBE = torch.randint(3, 12, (6, 5), generator=torch.Generator().manual_seed(5))


@functools.lru_cache(maxsize=1)
def decoding_model() -> nn.Module:
    """A small random encoder-decoder (vocabulary 12: pad 0, BOS 1, EOS 2) whose greedy outputs of :data:`PROBE`
    end at EOS in some rows and run to 8 tokens in others, and go on after an EOS: its output bias rules out pad and
    BOS, and the EOS bias is a low quantile of how far EOS trails the best token along the greedy outputs."""
    config = ModelConfig.preset("tiny", vocab_size=12, d_model=16, n_heads=2, d_ff=32, n_layers=1,
                                output_bias=True, max_len=32, tie_embeddings=False)
    never = greedy_decode_variant(stop="never")
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        model = build_model(config, init=False).eval()
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(randn(g, *p.shape, scale=1.0 if "lm_head" in name else 0.3))
            bias = model.lm_head.proj.bias
            bias[PAD] = bias[BOS] = bias[EOS] = -30.0
            out = greedy_decode_reference(model, PROBE, 8)  # without EOS
            bias[EOS] = 0.0
            logits = model(PROBE, torch.tensor([[BOS] + o for o in out])).logits  # (6, 9, V)
            gap = (logits[..., 3:].max(-1).values - logits[..., EOS]).flatten()
            for q in (0.15, 0.25, 0.1, 0.35):
                bias[EOS] = float(gap.quantile(q))
                outputs = greedy_decode_reference(model, PROBE, 8)
                if any(len(o) == 8 for o in outputs) and outputs != never(model, PROBE, 8):
                    return model
    raise RuntimeError("no random decoding model fits the probe")  # not reached with these seeds


def _greedy_cases(rng: random.Random) -> list[Case]:
    g = generator(rng)
    model = decoding_model()
    padded = PROBE.clone()
    padded[1, 3:] = PAD
    padded[4, 2:] = PAD
    b, s, n = rng.randint(1, 4), rng.randint(2, 7), rng.randint(2, 10)
    return [Case("6 sources of 5 tokens, at most 8 output tokens", (model, PROBE, 8)),
            Case("sources right-padded with 0 (lengths 5, 3, 5, 5, 2, 5)", (model, padded, 8)),
            Case("one source, at most 3 tokens", (model, PROBE[:1], 3)),
            Case("one source, at most 1 token", (model, PROBE[2:3], 1)),
            Case(f"random: {b} source(s) of {s} tokens, at most {n} output tokens",
                 (model, torch.randint(3, 12, (b, s), generator=g), n))]


GREEDY_DECODE = Exercise(
    name="greedy_decode",
    signature="greedy_decode(model, src, max_len): model an aiayn encoder-decoder (model.encode(src) -> memory, "
              "src_is_token, _; model.new_cache(n); model.decode(new_ids, memory, src_is_token, cache=cache).logits "
              "(B, t, V)), src (B, S) padded with 0 -> one list of ids per source, at most max_len, without BOS "
              "(1) and EOS (2)",
    reference=greedy_decode_reference,
    variant=greedy_decode_variant,
    mistakes=(
        Mistake("feed", "whole_prefix", "whole prefix fed to the cache",
                "the cache already holds the keys and values of every earlier token: feed only the NEWEST token "
                "each step (ids[:, -1:]); feeding the whole prefix again stores it twice and shifts the positions"),
        Mistake("stop", "never", "no stop at EOS",
                "a sentence ends at its first EOS: drop the tokens it would produce after it"),
        Mistake("stop", "keep_eos", "EOS kept in the output",
                "stop at EOS without adding it: outputs hold the words, not the end marker"),
        Mistake("start", "pad", "decoding started from pad",
                "the decoder was trained on [BOS] + target: its first input is BOS (id 1)"),
        Mistake("steps", "one_less", "one token short",
                "a sentence may have max_len tokens: run max_len steps (then EOS would be forced)"),
    ),
    cases=_greedy_cases,
    lesson="08",
)


# ---------------------------------------------------------------------------------------------- beam_step
def beam_step_reference(scores: Tensor, log_probs: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """One step of beam search for each sentence, as :func:`aiayn.generate.beam_search` selects its candidates.

    Args:
        scores: (B, K) each beam's log-probability so far.
        log_probs: (B, K, V) each beam's next-token log-probabilities.
        k: how many candidates to keep.
    Returns:
        (B, k) each: the candidates' scores (best first), the beam each extends, and its token.
    """
    b, beams, v = log_probs.shape
    cand = (scores[:, :, None] + log_probs).reshape(b, beams * v)  # (B, K*V)
    top, idx = cand.topk(k, dim=1)  # (B, k) best first
    return top, idx // v, idx % v


def beam_step_variant(add: bool = True, choose: str = "per_sentence", index: str = "div_mod"
                      ) -> Callable[..., tuple[Tensor, Tensor, Tensor]]:
    """A beam step, or a wrong one: ``add`` False (the running scores forgotten); ``choose`` "per_beam" (each beam
    keeps its own best tokens) or "whole_batch" (candidates of all sentences compared); ``index`` "mod_div" (beam
    and token read from the flat index the other way round)."""
    def beam_step(scores: Tensor, log_probs: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
        b, beams, v = log_probs.shape
        cand = scores[:, :, None] + log_probs if add else log_probs  # (B, K, V)
        if choose == "per_beam":  # the best k // K tokens of each beam, then sorted
            per = max(k // beams, 1)
            top, tok = cand.topk(per, dim=-1)  # (B, K, per)
            beam = torch.arange(beams)[None, :, None].expand_as(tok)
            top, order = top.reshape(b, -1).sort(dim=1, descending=True)
            return (top[:, :k], beam.reshape(b, -1).gather(1, order)[:, :k],
                    tok.reshape(b, -1).gather(1, order)[:, :k])
        if choose == "whole_batch":
            top, idx = cand.reshape(-1).topk(b * k)  # (B*k,) all sentences together
            idx = idx % (beams * v)
            top, idx = top.reshape(b, k), idx.reshape(b, k)
        else:
            top, idx = cand.reshape(b, beams * v).topk(k, dim=1)
        if index == "mod_div":
            return top, idx % beams, idx // beams
        return top, idx // v, idx % v

    return beam_step


def _beam_cases(rng: random.Random) -> list[Case]:
    g = generator(rng)

    def case(label: str, b: int, k: int, v: int, keep: int) -> Case:
        scores = -randn(g, b, k, scale=2.0).abs().sort(dim=1, descending=True).values  # (B, K), best first
        log_probs = torch.log_softmax(randn(g, b, k, v, scale=2.0), dim=-1)
        return Case(label, (scores, log_probs, keep))

    b = rng.randint(1, 3)
    return [case("2 sentences, 3 beams, 7 tokens, keep 3", 2, 3, 7, 3),
            case("1 sentence, 4 beams, 10 tokens, keep 8 (the 2K candidates beam search keeps)", 1, 4, 10, 8),
            case("3 sentences, 2 beams, 5 tokens, keep 4", 3, 2, 5, 4),
            case(f"random: {b} sentence(s), 4 beams, 9 tokens, keep 4", b, 4, 9, 4)]


BEAM_STEP = Exercise(
    name="beam_step",
    signature="beam_step(scores, log_probs, k): scores (B, K) the beams' log-probabilities so far, log_probs (B, K, V) "
              "their next tokens' -> (top_scores, beam, token), each (B, k), best first",
    reference=beam_step_reference,
    variant=beam_step_variant,
    mistakes=(
        Mistake("add", False, "running scores forgotten",
                "a candidate's score is its beam's score PLUS the token's log-probability: scores[:, :, None] + "
                "log_probs"),
        Mistake("choose", "per_beam", "best tokens of each beam",
                "compare all K*V candidates of a sentence together (one beam may supply all of the best ones): "
                "reshape to (B, K*V) before topk"),
        Mistake("choose", "whole_batch", "sentences compared with each other",
                "each sentence keeps its own best k: flatten (K, V) per sentence, (B, K*V), not the whole batch"),
        Mistake("index", "mod_div", "beam and token read the wrong way round",
                "in the flat index over (K, V) the beam is index // V and the token index % V"),
    ),
    cases=_beam_cases,
    lesson="08",
)
