"""Decoding: beam search vs brute force, beam 1 == greedy, batched == one by one, ensembles vs a plain mean of
the models, sampling, filters."""

from __future__ import annotations

import copy
import itertools
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from aiayn import AiaynError, ModelConfig, build_model
from aiayn.accel.cpu.topk import MIN_BLOCKED_ARGMAX
from aiayn.generate import (
    LMStepper,
    decode_loop,
    filter_logits,
    generate,
    greedy_choice,
    greedy_translate,
    left_pad,
    length_penalty,
    make_sampler,
    top_k_filter,
    top_p_filter,
    translate,
)
from aiayn.models import DecoderModel, EncoderDecoderModel

PAD, BOS, EOS = 0, 1, 2



def peaky(model: nn.Module, scale: float, eos_bias: float) -> nn.Module:
    """Sharpen the output distribution (scaled, untied output weights) and make EOS a real competitor, so that
    beam search and greedy search disagree and hypotheses end at many different lengths."""
    old = model.lm_head.proj
    new = nn.Linear(old.in_features, old.out_features)
    with torch.no_grad():
        new.weight.copy_(old.weight * scale)
        new.bias.zero_()
        new.bias[EOS] = eos_bias
    model.lm_head.proj = new
    return model.eval()


def seq2seq(vocab: int = 12, scale: float = 3.0, eos_bias: float = 3.0, seed: int = 0,
            **kw: object) -> EncoderDecoderModel:
    """A tiny, peaky encoder-decoder model (see :func:`peaky`)."""
    torch.manual_seed(seed)
    cfg = ModelConfig.preset("tiny", vocab_size=vocab, tie_embeddings=False, **kw)
    return peaky(build_model(cfg), scale, eos_bias)


def lm(position: str = "rope", **kw: object) -> DecoderModel:
    """A tiny pre-LN language model with large random weights: its greedy continuations vary (a freshly
    initialized one mostly repeats a token, which would make the comparisons below weak)."""
    torch.manual_seed(0)
    model = build_model(ModelConfig.preset("tiny", arch="decoder", position=position, norm_position="pre",
                                           tie_embeddings=False, **kw))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.5)
    return model.eval()


def sources(vocab: int, lengths: list[int]) -> torch.Tensor:
    """Right-padded (B, S) sources of the given lengths, each ending in EOS."""
    g = torch.Generator().manual_seed(1)
    src = torch.full((len(lengths), max(lengths)), PAD)
    for i, n in enumerate(lengths):
        src[i, :n - 1] = torch.randint(3, vocab, (n - 1,), generator=g)
        src[i, n - 1] = EOS
    return src


# ---------------------------------------------------------------------------------------------- beam search
def brute_force(model: EncoderDecoderModel, src: torch.Tensor, max_len: int, alpha: float
                ) -> list[tuple[float, list[int]]]:
    """Score every output (tokens from 3..V-1, then EOS) of at most ``max_len`` tokens; best first."""
    vocab = model.config.target_vocab_size
    outputs = [list(p) for n in range(max_len + 1) for p in itertools.product(range(3, vocab), repeat=n)]
    width = max_len + 1
    tgt_in = torch.tensor([[BOS] + o + [PAD] * (width - 1 - len(o)) for o in outputs])  # (N, width)
    tgt_out = torch.tensor([o + [EOS] + [PAD] * (width - 1 - len(o)) for o in outputs])
    with torch.inference_mode():
        logp = model(src.expand(len(outputs), -1), tgt_in).logits.float().log_softmax(-1)  # (N, width, V)
    tok_logp = logp.gather(2, tgt_out[:, :, None]).squeeze(2) * (tgt_out != PAD)
    total = tok_logp.sum(1).tolist()
    scored = [(lp / length_penalty(len(o) + 1, alpha), o) for lp, o in zip(total, outputs)]
    return sorted(scored, key=lambda x: -x[0])


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_search_matches_brute_force(alpha: float) -> None:
    """With a beam wide enough to keep every prefix, beam search returns exactly the brute-force ranking;
    with a narrow beam, every hypothesis carries its true score and none beats the optimum."""
    model = seq2seq(vocab=6, scale=3.0, eos_bias=1.0)
    max_len = 4  # 3 tokens -> 121 outputs
    for src in sources(6, [5, 3]).split(1):
        src = src[:, : int((src != PAD).sum())]
        best = brute_force(model, src, max_len, alpha)
        wide = translate(model, src, beam_size=128, alpha=alpha, max_len_a=0, max_len_b=max_len, n_best=10)[0]
        assert [h.tokens for h in wide] == [o for _, o in best[:10]]
        assert [h.score for h in wide] == pytest.approx([s for s, _ in best[:10]], abs=1e-4)
        true_score = {tuple(o): s for s, o in best}
        narrow = translate(model, src, beam_size=2, alpha=alpha, max_len_a=0, max_len_b=max_len, n_best=2)[0]
        for h in narrow:
            assert h.score == pytest.approx(true_score[tuple(h.tokens)], abs=1e-4)
            assert h.score == pytest.approx(h.logprob / length_penalty(len(h.tokens) + 1, alpha))
            assert h.score <= best[0][0] + 1e-5


def reference_beam_search(model: EncoderDecoderModel, src: torch.Tensor, k: int, alpha: float, max_len: int
                          ) -> list[tuple[float, list[int]]]:
    """The same rules as :func:`translate`, written plainly for one sentence: lists, no cache, no batching."""
    alive: list[tuple[float, list[int]]] = [(0.0, [])]
    finished: list[tuple[float, list[int]]] = []
    for t in range(max_len + 1):
        with torch.inference_mode():
            tgt = torch.tensor([[BOS] + toks for _, toks in alive])
            logp = model(src.expand(len(alive), -1), tgt).logits[:, -1].float().log_softmax(-1).tolist()
        allowed = [EOS] if t == max_len else [v for v in range(len(logp[0])) if v not in (PAD, BOS)]
        cands = sorted(((cum + logp[b][v], toks, v) for b, (cum, toks) in enumerate(alive) for v in allowed),
                       key=lambda c: -c[0])[: 2 * k]
        finished += [(cum / length_penalty(t + 1, alpha), toks) for rank, (cum, toks, v) in enumerate(cands)
                     if v == EOS and rank < k]
        finished = sorted(finished, key=lambda h: -h[0])[:k]
        alive = [(cum, toks + [v]) for cum, toks, v in cands if v != EOS][:k]
        if not alive or len(finished) == k and alive[0][0] / length_penalty(t + 1, alpha) <= finished[-1][0]:
            break
    return finished


@pytest.mark.parametrize("alpha", [0.0, 0.6])
@pytest.mark.parametrize("vocab", [12, 3000])
def test_batched_beam_search_matches_plain_reference(alpha: float, vocab: int, device: str) -> None:
    """Batched beam search (cache reordering, finished pools, sentences leaving the batch) follows the
    plain per-sentence reference exactly, including when it stops early. Vocabulary 3000 takes the blocked
    top-k path (:mod:`aiayn.accel.cpu.topk`), with a partial last block. The reference runs on the CPU."""
    model = seq2seq(vocab=vocab)
    lengths = [7, 3, 5, 6, 2, 4]
    src = sources(vocab, lengths)
    got = translate(copy.deepcopy(model).to(device), src.to(device), beam_size=3, alpha=alpha, n_best=3,
                    max_len_a=0.5, max_len_b=4)
    for i, n in enumerate(lengths):
        want = reference_beam_search(model, src[i:i + 1, :n], 3, alpha, int(0.5 * n + 4))
        assert [h.tokens for h in got[i]] == [toks for _, toks in want]
        assert [h.score for h in got[i]] == pytest.approx([score for score, _ in want], abs=1e-4)


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_one_is_greedy(alpha: float, device: str) -> None:
    model = seq2seq().to(device)
    src = sources(12, [7, 3, 5, 6, 2, 4]).to(device)
    beam = translate(model, src, beam_size=1, alpha=alpha, max_len_b=10)
    greedy = greedy_translate(model, src, alpha=alpha, max_len_b=10)
    assert [h[0].tokens for h in beam] == [g.tokens for g in greedy]
    assert [h[0].score for h in beam] == pytest.approx([g.score for g in greedy], abs=1e-4)
    assert len({len(g.tokens) for g in greedy}) > 2  # the model ends sentences at different lengths


def test_beam_beats_greedy_and_returns_sorted_n_best() -> None:
    model = seq2seq()
    src = sources(12, [7, 3, 5, 6, 2, 4])
    beam = translate(model, src, beam_size=4, max_len_b=10, n_best=4)
    greedy = greedy_translate(model, src, max_len_b=10)
    assert any(b[0].tokens != g.tokens for b, g in zip(beam, greedy))  # the test model is not trivial
    assert sum(b[0].score for b in beam) > sum(g.score for g in greedy)
    for hyps in beam:
        assert 1 <= len(hyps) <= 4
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == len(hyps)
        assert all(PAD not in h.tokens and BOS not in h.tokens and EOS not in h.tokens for h in hyps)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_batched_translation_equals_one_by_one(beam_size: int, device: str) -> None:
    model = seq2seq(position="rope").to(device)
    lengths = [7, 3, 5, 2]
    src = sources(12, lengths).to(device)
    batched = translate(model, src, beam_size=beam_size, n_best=beam_size, max_len_b=8)
    greedy_batched = greedy_translate(model, src, max_len_b=8)
    for i, n in enumerate(lengths):
        alone = translate(model, src[i:i + 1, :n], beam_size=beam_size, n_best=beam_size, max_len_b=8)[0]
        assert [h.tokens for h in batched[i]] == [h.tokens for h in alone]
        assert [h.score for h in batched[i]] == pytest.approx([h.score for h in alone], abs=1e-4)
        assert greedy_batched[i].tokens == greedy_translate(model, src[i:i + 1, :n], max_len_b=8)[0].tokens


# ---------------------------------------------------------------------------------------------- ensembles
class MeanOfModels(nn.Module):
    """Reference ensemble: full uncached forward passes of every member; log of the mean probability."""

    def __init__(self, models: list[EncoderDecoderModel]) -> None:
        super().__init__()
        self.members = nn.ModuleList(models)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> SimpleNamespace:
        logp = torch.stack([m(src, tgt).logits.float().log_softmax(-1) for m in self.members])  # (M, N, T, V)
        return SimpleNamespace(logits=logp.logsumexp(0) - math.log(len(self.members)))


def two_models(vocab: int = 12) -> list[EncoderDecoderModel]:
    """Two different members (other seed, other positions), as ensembles of independent trainings are."""
    return [seq2seq(vocab=vocab, eos_bias=0.0), seq2seq(vocab=vocab, seed=1, position="rope", eos_bias=0.0)]


@pytest.mark.parametrize("alpha", [0.0, 0.6])
@pytest.mark.parametrize("vocab", [12, 3000])
def test_ensemble_beam_search_matches_plain_reference(alpha: float, vocab: int) -> None:
    """An ensemble decodes as the plain reference beam search over the mean of the members' probabilities
    (every member re-run without a cache at every step): cached == uncached and batched == single for the
    ensemble's stepper, whose rows and caches move together."""
    models = two_models(vocab)
    lengths = [7, 3, 5, 6, 2, 4]
    src = sources(vocab, lengths)
    got = translate(models, src, beam_size=3, alpha=alpha, n_best=3, max_len_a=0.5, max_len_b=4)
    reference = MeanOfModels(models).eval()
    for i, n in enumerate(lengths):
        want = reference_beam_search(reference, src[i:i + 1, :n], 3, alpha, int(0.5 * n + 4))
        assert [h.tokens for h in got[i]] == [toks for _, toks in want]
        assert [h.score for h in got[i]] == pytest.approx([score for score, _ in want], abs=1e-4)
    n_best = [[h.tokens for h in hyps] for hyps in got]
    assert len({len(t) for hyps in n_best for t in hyps}) > 2  # hypotheses end at many lengths
    for member in models:  # the ensemble is neither member
        alone = translate(member, src, beam_size=3, alpha=alpha, n_best=3, max_len_a=0.5, max_len_b=4)
        assert [[h.tokens for h in hyps] for hyps in alone] != n_best


def test_ensemble_greedy_is_beam_one_and_batches_like_single_sentences() -> None:
    models = two_models()
    lengths = [7, 3, 5, 2]
    src = sources(12, lengths)
    greedy = greedy_translate(models, src, max_len_b=8)
    assert [h[0].tokens for h in translate(models, src, beam_size=1, max_len_b=8)] == [g.tokens for g in greedy]
    for i, n in enumerate(lengths):
        assert greedy[i].tokens == greedy_translate(models, src[i:i + 1, :n], max_len_b=8)[0].tokens


def test_ensemble_of_one_model_or_of_copies_is_that_model() -> None:
    model = seq2seq()
    src = sources(12, [7, 3, 5, 6, 2, 4])
    alone = translate(model, src, beam_size=4, n_best=2, max_len_b=8)
    for ensemble in ([model], (model, model)):
        got = translate(ensemble, src, beam_size=4, n_best=2, max_len_b=8)
        assert [[h.tokens for h in x] for x in got] == [[h.tokens for h in x] for x in alone]
        assert [h.score for x in got for h in x] == pytest.approx([h.score for x in alone for h in x], abs=1e-4)


def test_ensemble_rejects_mismatched_members() -> None:
    with pytest.raises(AiaynError, match="target vocabularies"):
        translate([seq2seq(vocab=12), seq2seq(vocab=13)], torch.tensor([[5, 2]]))
    with pytest.raises(AiaynError, match="encoder-decoder"):
        translate([seq2seq(), lm()], torch.tensor([[5, 2]]))
    with pytest.raises(AiaynError, match="at least one"):
        greedy_translate([], torch.tensor([[5, 2]]))


def test_max_length_per_sentence() -> None:
    model = seq2seq(eos_bias=-5.0)  # EOS unlikely: outputs run to the limit, where EOS is forced
    src = sources(12, [6, 3])
    for hyps, n in zip(translate(model, src, max_len_a=1.0, max_len_b=2), [6, 3]):
        assert len(hyps[0].tokens) == n + 2
    assert all(len(g.tokens) == 3 for g in greedy_translate(model, src, max_len_a=0.0, max_len_b=3))
    assert [len(h[0].tokens) for h in translate(model, src, max_len_a=0.5, max_len_b=1)] == [4, 2]


def test_translate_restores_training_mode_and_ignores_dropout() -> None:
    model = seq2seq(dropout=0.5)
    src = sources(12, [5, 4])
    want = [h[0].tokens for h in translate(model, src)]
    model.train()
    assert [h[0].tokens for h in translate(model, src)] == want
    assert model.training


def test_translate_rejects_mistakes() -> None:
    with pytest.raises(AiaynError, match="encoder-decoder"):
        translate(lm(), torch.tensor([[5, 2]]))
    with pytest.raises(AiaynError, match="n_best"):
        translate(seq2seq(), torch.tensor([[5, 2]]), beam_size=2, n_best=3)


def test_length_penalty() -> None:
    assert length_penalty(1, 0.6) == 1.0
    assert length_penalty(7, 0.6) == pytest.approx(2.0 ** 0.6)
    assert length_penalty(30, 0.0) == 1.0


# ---------------------------------------------------------------------------------------------- decoder-only
def greedy_reference(model: DecoderModel, prompt: list[int], n: int, prefix_lm: bool = False) -> list[int]:
    """Greedy continuation with no cache: recompute the whole sequence at every step."""
    seq = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            prefix = torch.tensor([len(prompt)]) if prefix_lm else None
            logits = model(torch.tensor([seq]), prefix_len=prefix).logits[0, -1]
            logits[PAD] = float("-inf")
            seq.append(int(logits.argmax()))
    return seq[len(prompt):]


PROMPTS = [[BOS, 5, 6, 7, 8, 9], [BOS, 10], [BOS, 11, 12, 13]]


@pytest.mark.parametrize("position", ["learned", "rope", "alibi", "t5"])
def test_left_padded_generation_equals_each_prompt_alone(position: str, device: str) -> None:
    reference = lm(position)  # the uncached reference runs on the CPU
    model = copy.deepcopy(reference).to(device)
    batched = generate(model, PROMPTS, max_new_tokens=6, greedy=True, stop_ids=())
    for prompt, out in zip(PROMPTS, batched):
        assert out == generate(model, [prompt], max_new_tokens=6, greedy=True, stop_ids=())[0]
        assert out == greedy_reference(reference, prompt, 6)


def test_prefix_lm_generation_matches_uncached_reference() -> None:
    model = lm("rope")
    batched = generate(model, PROMPTS, max_new_tokens=5, greedy=True, stop_ids=(), prefix_lm=True)
    causal = generate(model, PROMPTS, max_new_tokens=5, greedy=True, stop_ids=())
    assert batched != causal  # the bidirectional prefix changes the continuation
    for prompt, out in zip(PROMPTS, batched):
        assert out == greedy_reference(model, prompt, 5, prefix_lm=True)


def test_lm_stepper_reorder_follows_rows() -> None:
    """Reordering the LM stepper (as beam search does) keeps each row's cache and positions together."""
    model = lm("alibi")
    ids, is_token = left_pad(PROMPTS)
    index = torch.tensor([2, 0, 0, 1])
    new = torch.tensor([20, 21, 22, 23])
    with torch.inference_mode():
        stepper = LMStepper(model, ids, is_token, capacity=8)
        stepper.first()
        stepper.reorder(index)
        got = stepper.step(new)
        for row, i in enumerate(index.tolist()):
            want = model(torch.tensor([PROMPTS[i] + [int(new[row])]])).logits[0, -1]
            torch.testing.assert_close(got[row], want, atol=1e-5, rtol=0)


def test_rows_stop_individually_and_stream() -> None:
    model = lm("alibi")
    free = generate(model, PROMPTS, max_new_tokens=8, greedy=True, stop_ids=())
    stop = free[0][3]  # a token row 0 produces: stop there
    events: list[tuple[int, int]] = []
    outs = generate(model, PROMPTS, max_new_tokens=8, greedy=True, stop_ids=(stop,),
                    on_token=lambda i, t: events.append((i, t)))
    for f, o in zip(free, outs):
        assert o == (f[:f.index(stop)] if stop in f else f)
    assert len(outs[0]) <= 3
    for i, o in enumerate(outs):
        assert [t for j, t in events if j == i] == o


def test_a_stop_read_one_step_late_gives_the_same_outputs(monkeypatch) -> None:
    """On an accelerator the loop reads "every row stopped" one step late (LaggedFlag): forced here on the CPU,
    greedy and sampled outputs with rows stopping at different steps equal the prompt read's, one step later."""
    from aiayn.generate import common, sampling
    model = lm("alibi")
    free = generate(model, PROMPTS, max_new_tokens=10, greedy=True, stop_ids=())
    kw = dict(max_new_tokens=10, stop_ids=tuple({f[2] for f in free}))  # every greedy row stops by its 3rd token
    prompt = [generate(model, PROMPTS, greedy=True, **kw), generate(model, PROMPTS, seed=7, **kw)]
    steps = {"prompt": 0, "lagged": 0}
    real_step = LMStepper.step

    def counted(self, tokens, key):
        steps[key] += 1
        return real_step(self, tokens)
    monkeypatch.setattr(LMStepper, "step", lambda self, tokens: counted(self, tokens, "prompt"))
    generate(model, PROMPTS, greedy=True, **kw)
    monkeypatch.setattr(LMStepper, "step", lambda self, tokens: counted(self, tokens, "lagged"))
    monkeypatch.setattr(sampling, "LaggedFlag", lambda device, lagged=None: common.LaggedFlag(device, lagged=True))
    assert generate(model, PROMPTS, seed=7, **kw) == prompt[1]
    steps["lagged"] = 0
    assert generate(model, PROMPTS, greedy=True, **kw) == prompt[0]
    assert max(len(o) for o in prompt[0]) < 10  # every row stopped before its limit: the late read mattered
    assert steps["lagged"] == steps["prompt"] + 1


def test_a_lagged_flag_answers_one_call_late() -> None:
    from aiayn.generate.common import LaggedFlag
    flag = LaggedFlag(torch.device("cpu"), lagged=True)
    assert [flag.seen(torch.tensor(v)) for v in (False, True, False, True)] == [False, False, True, False]
    assert [LaggedFlag(torch.device("cpu")).seen(torch.tensor(v)) for v in (False, True)] == [False, True]


def test_sampling_is_reproducible_and_top_k_1_is_greedy(device: str) -> None:
    model = lm("rope").to(device)
    a = generate(model, PROMPTS, max_new_tokens=12, seed=3, stop_ids=())
    assert a == generate(model, PROMPTS, max_new_tokens=12, seed=3, stop_ids=())
    assert a != generate(model, PROMPTS, max_new_tokens=12, seed=4, stop_ids=())
    greedy = generate(model, PROMPTS, max_new_tokens=12, greedy=True, stop_ids=())
    assert generate(model, PROMPTS, max_new_tokens=12, seed=5, top_k=1, stop_ids=()) == greedy
    assert generate(model, PROMPTS, max_new_tokens=12, temperature=0, stop_ids=()) == greedy
    assert generate(model, PROMPTS, max_new_tokens=12, seed=5, top_p=1e-6, stop_ids=()) == greedy
    assert all(len(o) == 12 and PAD not in o for o in a)


def test_decode_loop_without_logprob_makes_the_same_choices(device: str) -> None:
    """``generate`` decodes without a log-softmax pass (``decode_loop(with_logprob=False)``): the choices on the
    logits equal those on the log-probs, greedy (the blocked argmax path: 8 rows x 6000 ids) and sampled, and
    equal uncached greedy decoding."""
    model = lm("rope", vocab_size=6000).to(device)
    prompts = [[BOS, 5 + i, 40 * i + 7] for i in range(8)]
    assert len(prompts) * 6000 >= MIN_BLOCKED_ARGMAX
    ids, is_token = left_pad(prompts, device=device)

    def run(choose: object, with_logprob: bool) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.inference_mode():
            stepper = LMStepper(model, ids, is_token, capacity=ids.shape[1] + 10)
            budget = torch.full((len(prompts),), 10, device=device)
            tokens, _, logprob = decode_loop(stepper, choose, budget, stop_ids=(), banned_ids=(PAD,),
                                             with_logprob=with_logprob)
        return tokens.cpu(), logprob.cpu()

    greedy, logprob = run(greedy_choice, True)
    greedy_fast, no_logprob = run(greedy_choice, False)
    assert torch.equal(greedy, greedy_fast)
    assert logprob.isfinite().all() and no_logprob.isnan().all()
    assert greedy.tolist() == generate(model, prompts, max_new_tokens=10, greedy=True, stop_ids=())
    reference = copy.deepcopy(model).cpu()
    for prompt, row in zip(prompts, greedy.tolist()):
        assert row == greedy_reference(reference, prompt, 10)
    for top_k, top_p in ((None, None), (50, None), (None, 0.9)):
        chooser = lambda: make_sampler(0.8, top_k, top_p, torch.Generator(device=device).manual_seed(1))  # noqa
        assert torch.equal(run(chooser(), True)[0], run(chooser(), False)[0])


def test_generate_rejects_mistakes() -> None:
    with pytest.raises(AiaynError, match="empty"):
        generate(lm(), [[BOS], []], max_new_tokens=3)
    with pytest.raises(AiaynError, match="decoder-only"):
        generate(seq2seq(), [[BOS]], max_new_tokens=3)
    with pytest.raises(AiaynError, match="max_len"):
        generate(lm("learned"), [[BOS] * 100], max_new_tokens=40)
    assert generate(lm(), [[BOS]], max_new_tokens=0) == [[]]


# ---------------------------------------------------------------------------------------------- filters
def test_top_k_filter_keeps_k_largest() -> None:
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0, 2.0]])
    kept = top_k_filter(logits, 2).isfinite()
    assert kept.tolist() == [[False, True, False, True, False]]
    assert top_k_filter(logits, 10).equal(logits)


def test_top_p_filter_keeps_smallest_set_with_enough_mass() -> None:
    probs = torch.tensor([[0.05, 0.5, 0.15, 0.3], [0.25, 0.25, 0.25, 0.25]])
    logits = probs.log()
    T, F = True, False
    assert top_p_filter(logits, 0.7).isfinite().tolist() == [[F, T, F, T], [T, T, T, F]]
    assert top_p_filter(logits, 0.4).isfinite().tolist() == [[F, T, F, F], [T, T, F, F]]
    assert top_p_filter(logits, 0.9).isfinite().tolist() == [[F, T, T, T], [T, T, T, T]]
    assert top_p_filter(logits, 1e-9).isfinite().sum(1).tolist() == [1, 1]


def test_top_p_filter_against_definition() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(50, 20, generator=g) * 2
    for p in (0.1, 0.5, 0.9, 0.99):
        kept = top_p_filter(logits, p).isfinite()
        probs = logits.softmax(-1)
        for row, keep in zip(probs, kept):
            ordered = row.sort(descending=True).values
            need = int((ordered.cumsum(0) < p).sum()) + 1  # smallest prefix with mass >= p
            assert int(keep.sum()) == need
            assert bool(keep[row.argmax()]) and (keep.all() or row[keep].min() >= row[~keep].max())
    kept = filter_logits(logits, top_k=3, top_p=0.9).isfinite().sum(1)
    assert 1 <= int(kept.min()) and int(kept.max()) == 3
