"""Every diagnosis of the course's checker, each held to a deliberately wrong implementation.

Two kinds of wrong implementation: the exercise's own wrong variant for every known mistake (the checker must name
exactly that mistake, on two seeds), and wrong functions written by hand the way a learner writes them (the
checker must name the mistake they make). Plus the checker's other verdicts: a correct function passes, a stub is
"not written yet", an error is shown with its line, two mistakes together are both named, an input changed in place
is noted.
"""

from __future__ import annotations

import importlib.util
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from aiayn.learn.assemble import REFERENCE_PIECES
from aiayn.learn.checking import check_function
from aiayn.learn.exercises import EXERCISES

MISTAKES = [(name, m) for name, ex in EXERCISES.items() for m in ex.mistakes]


def diagnosed(name: str, fn, seed: int = 0) -> list[str]:
    result = check_function(EXERCISES[name], fn, seed=seed)
    assert not result.passed, f"{name}: a wrong function passed"
    return result.titles


@pytest.mark.parametrize("name", list(EXERCISES))
def test_the_reference_and_the_right_variant_pass(name: str) -> None:
    ex = EXERCISES[name]
    for seed in (0, 1):
        assert check_function(ex, ex.reference, seed=seed).passed
        assert check_function(ex, ex.variant(), seed=seed).passed, check_function(ex, ex.variant(), seed=seed)


@pytest.mark.parametrize(("name", "mistake"), MISTAKES, ids=[f"{n}-{m.knob}={m.value}" for n, m in MISTAKES])
def test_each_wrong_variant_gets_its_own_diagnosis(name: str, mistake) -> None:  # noqa: ANN001
    ex = EXERCISES[name]
    wrong = ex.variant(**{mistake.knob: mistake.value})
    for seed in (3, 4):
        assert diagnosed(name, wrong, seed) == [mistake.title]


@pytest.mark.parametrize(("name", "mistake"), MISTAKES, ids=[f"{n}-{m.knob}={m.value}" for n, m in MISTAKES])
def test_each_wrong_variant_returns_a_value_somewhere(name: str, mistake) -> None:  # noqa: ANN001
    """A variant that raised on every case would 'match' any function that raises everywhere."""
    ex = EXERCISES[name]
    wrong = ex.variant(**{mistake.knob: mistake.value})
    cases = ex.cases(__import__("random").Random(0))
    assert any(ex.run(wrong, c).error is None for c in cases)


def test_every_exercise_has_mistakes_with_distinct_titles() -> None:
    for ex in EXERCISES.values():
        titles = [m.title for m in ex.mistakes]
        assert titles and len(set(titles)) == len(titles), ex.name


@pytest.mark.parametrize("name", list(REFERENCE_PIECES))
def test_assemble_reference_pieces_pass_their_checks(name: str) -> None:
    assert check_function(EXERCISES[name], REFERENCE_PIECES[name], seed=2).passed


# ---------------------------------------------------------------------------------------------- hand-written mistakes
def _scores(q, k):  # noqa: ANN001, ANN202
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])


def test_missing_scale() -> None:
    def attention(q, k, v):  # noqa: ANN001, ANN202
        return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v

    assert diagnosed("attention", attention) == ["missing scale"]


def test_wrong_scale_divided_by_d_k() -> None:
    def attention(q, k, v):  # noqa: ANN001, ANN202
        return torch.softmax(q @ k.transpose(-2, -1) / q.size(-1), dim=-1) @ v

    assert diagnosed("attention", attention) == ["wrong scale: 1/d_k"]


def test_wrong_scale_from_the_values_width() -> None:
    def attention(q, k, v):  # noqa: ANN001, ANN202
        return torch.softmax(q @ k.mT / v.shape[-1] ** 0.5, dim=-1) @ v

    assert diagnosed("attention", attention) == ["wrong scale: the values' width"]


def test_softmax_over_the_wrong_axis() -> None:
    def attention(q, k, v):  # noqa: ANN001, ANN202
        return F.softmax(_scores(q, k), dim=2) @ v  # dim 2 of (B, H, T, S) is the queries

    assert diagnosed("attention", attention) == ["softmax over the wrong axis"]


def test_two_mistakes_are_both_named() -> None:
    def attention(q, k, v):  # noqa: ANN001, ANN202
        return torch.softmax(q @ k.transpose(-2, -1), dim=-2) @ v

    assert diagnosed("attention", attention) == ["missing scale + softmax over the wrong axis"]


def test_transposed_mask() -> None:
    def masked_attention(q, k, v, mask=None):  # noqa: ANN001, ANN202
        s = _scores(q, k)
        if mask is not None:
            mask = mask.transpose(-1, -2)
            s = s.masked_fill(~mask, torch.finfo(s.dtype).min)
        w = torch.softmax(s, -1)
        if mask is not None:
            w = w * mask.any(-1, keepdim=True)
        return w @ v

    assert diagnosed("masked_attention", masked_attention) == ["mask transposed"]


def test_inverted_mask() -> None:
    def masked_attention(q, k, v, mask=None):  # noqa: ANN001, ANN202
        s = _scores(q, k)
        if mask is not None:  # True read as "blocked"
            s = s.masked_fill(mask, torch.finfo(s.dtype).min)
            return torch.softmax(s, -1).masked_fill(mask.all(-1, keepdim=True), 0) @ v
        return torch.softmax(s, -1) @ v

    assert diagnosed("masked_attention", masked_attention) == ["mask inverted"]


def test_mask_added_after_the_softmax() -> None:
    def masked_attention(q, k, v, mask=None):  # noqa: ANN001, ANN202
        w = torch.softmax(_scores(q, k), dim=-1)
        if mask is not None:
            w = w.masked_fill(~mask, 0.0)
        return w @ v

    assert diagnosed("masked_attention", masked_attention) == ["mask applied after the softmax"]


def test_nan_on_a_fully_masked_row() -> None:
    def masked_attention(q, k, v, mask=None):  # noqa: ANN001, ANN202
        s = _scores(q, k)
        if mask is not None:
            s = s.masked_fill(mask == 0, float("-inf"))
        return s.softmax(-1) @ v

    result = check_function(EXERCISES["masked_attention"], masked_attention, seed=0)
    assert result.titles == ["NaN on a fully masked row"]
    assert "is NaN" in result.report()


def test_a_large_negative_fill_gives_the_mean_of_the_values() -> None:
    def masked_attention(q, k, v, mask=None):  # noqa: ANN001, ANN202
        s = _scores(q, k)
        if mask is not None:
            s = s.masked_fill(~mask, -1e9)  # the Annotated Transformer's
        return s.softmax(-1) @ v

    assert diagnosed("masked_attention", masked_attention) == ["a fully masked row gives the mean of the values"]


def test_blocked_scores_set_to_zero() -> None:
    def masked_attention(q, k, v, mask=None):  # noqa: ANN001, ANN202
        s = _scores(q, k)
        if mask is not None:
            s = s * mask
        return s.softmax(-1) @ v

    assert diagnosed("masked_attention", masked_attention) == ["blocked scores set to 0"]


def test_heads_split_in_the_wrong_order() -> None:
    def split_heads(x, n_heads):  # noqa: ANN001, ANN202
        b, t, d = x.shape
        return x.view(b, n_heads, t, d // n_heads)

    assert diagnosed("split_heads", split_heads) == ["heads split in the wrong order"]


def test_heads_merged_in_the_wrong_order() -> None:
    def merge_heads(x):  # noqa: ANN001, ANN202
        b, h, t, dh = x.shape
        return x.reshape(b, t, h * dh)

    assert diagnosed("merge_heads", merge_heads) == ["heads merged in the wrong order"]


def test_multi_head_attention_scaled_by_the_model_width() -> None:
    def multi_head_attention(x, mha):  # noqa: ANN001, ANN202
        b, t, d = x.shape
        h = mha.n_heads
        q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in mha.qkv_proj(x).chunk(3, dim=-1))
        w = (q @ k.transpose(-2, -1) / math.sqrt(d)).softmax(-1)
        return mha.out_proj((w @ v).transpose(1, 2).reshape(b, t, d))

    assert diagnosed("multi_head_attention", multi_head_attention) == ["scaled by the model width"]


def test_causal_mask_off_by_one_sees_the_next_token() -> None:
    def causal_mask(t, s=None):  # noqa: ANN001, ANN202
        s = s or t
        return torch.ones(t, s, dtype=torch.bool).tril(diagonal=s - t + 1)

    assert diagnosed("causal_mask", causal_mask) == ["causal mask off by one: sees the next token"]


def test_causal_mask_off_by_one_cannot_see_itself() -> None:
    def causal_mask(t, s=None):  # noqa: ANN001, ANN202
        s = s or t
        return torch.ones(t, s, dtype=torch.bool).tril(diagonal=s - t - 1)

    assert diagnosed("causal_mask", causal_mask) == ["causal mask off by one: cannot see itself"]


def test_causal_mask_that_ignores_the_cache() -> None:
    def causal_mask(t, s=None):  # noqa: ANN001, ANN202
        return torch.ones(t, s or t, dtype=torch.bool).tril()

    assert diagnosed("causal_mask", causal_mask) == ["queries not aligned to the end of the keys"]


def test_causal_mask_upper_triangle() -> None:
    def causal_mask(t, s=None):  # noqa: ANN001, ANN202
        s = s or t
        return torch.ones(t, s, dtype=torch.bool).triu(diagonal=s - t)

    assert diagnosed("causal_mask", causal_mask) == ["causal mask transposed"]


def test_additive_causal_mask() -> None:
    def causal_mask(t, s=None):  # noqa: ANN001, ANN202
        s = s or t
        return torch.full((t, s), float("-inf")).triu(diagonal=s - t + 1)

    assert diagnosed("causal_mask", causal_mask) == ["additive mask"]


def test_decoder_mask_padding_on_the_queries() -> None:
    def decoder_mask(is_token):  # noqa: ANN001, ANN202
        t = is_token.shape[1]
        return is_token[:, None, :, None] & torch.ones(t, t, dtype=torch.bool).tril()

    assert diagnosed("decoder_mask", decoder_mask) == ["padding not masked on the keys"]


def test_decoder_mask_with_or() -> None:
    def decoder_mask(is_token):  # noqa: ANN001, ANN202
        t = is_token.shape[1]
        return is_token[:, None, None, :] | torch.ones(t, t, dtype=torch.bool).tril()

    assert diagnosed("decoder_mask", decoder_mask) == ["masks combined with OR"]


def test_sinusoidal_in_halves() -> None:
    def sinusoidal(max_len, d_model):  # noqa: ANN001, ANN202
        pos = torch.arange(max_len)[:, None].float()
        angle = pos / 10000 ** (torch.arange(0, d_model, 2).float() / d_model)
        return torch.cat([angle.sin(), angle.cos()], dim=-1)

    assert diagnosed("sinusoidal", sinusoidal) == ["sines and cosines in halves"]


def test_sinusoidal_with_each_column_its_own_exponent() -> None:
    def sinusoidal(max_len, d_model):  # noqa: ANN001, ANN202
        pe = torch.zeros(max_len, d_model)
        for pos in range(max_len):
            for j in range(d_model):
                angle = pos / 10000 ** (j / d_model)
                pe[pos, j] = math.sin(angle) if j % 2 == 0 else math.cos(angle)
        return pe

    assert diagnosed("sinusoidal", sinusoidal) == ["each column with its own exponent"]


def test_rope_on_adjacent_pairs() -> None:
    def rope(x, positions):  # noqa: ANN001, ANN202
        dh = x.shape[-1]
        angle = positions[:, None].float() / 10000 ** (torch.arange(0, dh, 2).float() / dh)
        x1, x2 = x[..., ::2], x[..., 1::2]
        rotated = torch.stack([x1 * angle.cos() - x2 * angle.sin(), x1 * angle.sin() + x2 * angle.cos()], dim=-1)
        return rotated.flatten(-2)

    assert diagnosed("rope", rope) == ["adjacent pairs rotated"]


def test_rope_that_ignores_the_positions() -> None:
    def rope(x, positions):  # noqa: ANN001, ANN202
        dh, t = x.shape[-1], x.shape[-2]
        angle = torch.arange(t)[:, None].float() / 10000 ** (torch.arange(0, dh, 2).float() / dh)
        cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)
        x1, x2 = x.chunk(2, -1)
        return x * cos + torch.cat([-x2, x1], -1) * sin

    assert diagnosed("rope", rope) == ["positions ignored"]


def test_feed_forward_relu_at_the_end() -> None:
    def feed_forward(x, w1, b1, w2, b2):  # noqa: ANN001, ANN202
        return F.relu(F.linear(F.linear(x, w1, b1), w2, b2))

    assert diagnosed("feed_forward", feed_forward) == ["ReLU after the second layer"]


def test_sublayer_pre_and_post_swapped() -> None:
    def sublayer(x, f, norm, pre_norm):  # noqa: ANN001, ANN202
        return norm(x + f(x)) if pre_norm else x + f(norm(x))

    assert diagnosed("sublayer", sublayer) == ["pre-LN and post-LN swapped"]


def test_sublayer_without_the_residual() -> None:
    def sublayer(x, f, norm, pre_norm):  # noqa: ANN001, ANN202
        return f(norm(x)) if pre_norm else norm(f(x))

    assert diagnosed("sublayer", sublayer) == ["no residual connection"]


def test_teacher_forcing_without_the_shift() -> None:
    def teacher_forcing(targets, bos_id, eos_id, pad_id):  # noqa: ANN001, ANN202
        width = max(map(len, targets)) + 1
        rows = [[bos_id, *t] + [pad_id] * (width - len(t) - 1) for t in targets]
        tgt_in = torch.tensor(rows)
        return tgt_in, tgt_in.masked_fill(tgt_in == pad_id, -100)

    assert diagnosed("teacher_forcing", teacher_forcing) == ["labels not shifted"]


def test_teacher_forcing_labels_padded_with_pad() -> None:
    def teacher_forcing(targets, bos_id, eos_id, pad_id):  # noqa: ANN001, ANN202
        width = max(map(len, targets)) + 1
        tgt_in = torch.tensor([[bos_id, *t] + [pad_id] * (width - len(t) - 1) for t in targets])
        labels = torch.tensor([[*t, eos_id] + [pad_id] * (width - len(t) - 1) for t in targets])
        return tgt_in, labels

    assert diagnosed("teacher_forcing", teacher_forcing) == ["labels padded with the pad id"]


def test_positions_added_after_the_first_layer() -> None:
    def encode(stack, ids):  # noqa: ANN001, ANN202
        x = stack.embed(ids) * math.sqrt(stack.config.d_model)
        mask = (ids != stack.config.pad_id)[:, None, None, :]
        for i, layer in enumerate(stack.layers):
            x = layer(x, mask=mask)[0]
            if i == 0:
                x = x + stack.abs_pos.table[: ids.shape[1]]
        return stack.final_norm(x)

    assert diagnosed("encode", encode) == ["positions added after the first layer"]


def test_encoder_without_the_padding_mask() -> None:
    def encode(stack, ids):  # noqa: ANN001, ANN202
        x = stack.embed(ids) * math.sqrt(stack.config.d_model) + stack.abs_pos.table[: ids.shape[1]]
        for layer in stack.layers:
            x = layer(x)[0]
        return stack.final_norm(x)

    assert diagnosed("encode", encode) == ["padding not masked"]


def test_greedy_decoding_that_feeds_the_whole_prefix_to_the_cache() -> None:
    def greedy_decode(model, src, max_len):  # noqa: ANN001, ANN202
        memory, src_is_token, _ = model.encode(src)
        cache = model.new_cache(max_len + 1)
        ids = torch.ones(src.shape[0], 1, dtype=torch.long)
        for _ in range(max_len):
            nxt = model.decode(ids, memory, src_is_token, cache=cache).logits[:, -1].argmax(-1)
            ids = torch.cat([ids, nxt[:, None]], 1)
        out = []
        for row in ids[:, 1:].tolist():
            out.append(row[:row.index(2)] if 2 in row else row)
        return out

    assert diagnosed("greedy_decode", greedy_decode) == ["whole prefix fed to the cache"]


def test_greedy_decoding_that_does_not_stop_at_eos() -> None:
    def greedy_decode(model, src, max_len):  # noqa: ANN001, ANN202
        memory, src_is_token, _ = model.encode(src)
        cache = model.new_cache(max_len + 1)
        tok = torch.ones(src.shape[0], 1, dtype=torch.long)
        out = [[] for _ in range(src.shape[0])]
        for _ in range(max_len):
            tok = model.decode(tok, memory, src_is_token, cache=cache).logits[:, -1:].argmax(-1)
            for row, t in enumerate(tok[:, 0].tolist()):
                if t != 2:
                    out[row].append(t)
        return out

    assert diagnosed("greedy_decode", greedy_decode) == ["no stop at EOS"]


def test_beam_step_per_beam() -> None:
    def beam_step(scores, log_probs, k):  # noqa: ANN001, ANN202
        b, beams, v = log_probs.shape
        top, tok = (scores[:, :, None] + log_probs).topk(max(k // beams, 1), dim=-1)  # each beam's own best
        beam = torch.arange(beams)[None, :, None].expand_as(tok)
        order = top.reshape(b, -1).argsort(dim=1, descending=True)[:, :k]
        return (top.reshape(b, -1).gather(1, order), beam.reshape(b, -1).gather(1, order),
                tok.reshape(b, -1).gather(1, order))

    assert diagnosed("beam_step", beam_step) == ["best tokens of each beam"]


def test_beam_step_without_the_running_scores() -> None:
    def beam_step(scores, log_probs, k):  # noqa: ANN001, ANN202
        b, beams, v = log_probs.shape
        top, idx = log_probs.reshape(b, -1).topk(k)
        return top, idx // v, idx % v

    assert diagnosed("beam_step", beam_step) == ["running scores forgotten"]


def test_noam_warmup_exponent() -> None:
    def noam_lr(step, d_model, warmup):  # noqa: ANN001, ANN202
        return d_model**-0.5 * min(step**-0.5, step * warmup**-0.5)

    assert diagnosed("noam_lr", noam_lr) == ["warmup exponent -0.5"]


def test_label_smoothing_over_the_other_classes() -> None:
    def label_smoothed_loss(logits, labels, epsilon):  # noqa: ANN001, ANN202
        keep = labels != -100
        logp = logits[keep].log_softmax(-1)
        target = torch.full_like(logp, epsilon / (logp.shape[-1] - 1))
        target.scatter_(1, labels[keep][:, None], 1 - epsilon)
        return -(target * logp).sum(-1).mean()

    assert diagnosed("label_smoothed_loss", label_smoothed_loss) == ["smoothing spread over the other classes"]


def test_loss_averaged_over_padding_too() -> None:
    def label_smoothed_loss(logits, labels, epsilon):  # noqa: ANN001, ANN202
        per = F.cross_entropy(logits, labels, ignore_index=-100, label_smoothing=epsilon, reduction="none")
        return per.mean()

    assert diagnosed("label_smoothed_loss", label_smoothed_loss) == ["ignored positions counted"]


def test_entropy_in_nats() -> None:
    def head_entropy(weights):  # noqa: ANN001, ANN202
        w = weights.double()
        per_row = -(w * w.clamp(min=1e-30).log()).sum(-1)
        live = w.sum(-1) > 0
        return (per_row * live).sum(-1) / live.sum(-1)

    assert diagnosed("head_entropy", head_entropy) == ["entropy in nats"]


def test_entropy_nan_from_zero_weights() -> None:
    def head_entropy(weights):  # noqa: ANN001, ANN202
        w = weights.double()
        per_row = -(w * torch.log2(w)).sum(-1)
        live = w.sum(-1) > 0
        return (per_row * live).sum(-1) / live.sum(-1)

    assert diagnosed("head_entropy", head_entropy) == ["NaN from 0 log 0"]


# ---------------------------------------------------------------------------------------------- other verdicts
def test_a_stub_is_not_written_yet() -> None:
    def attention(q, k, v):  # noqa: ANN001, ANN202
        raise NotImplementedError

    result = check_function(EXERCISES["attention"], attention, seed=0)
    assert not result.passed and not result.diagnoses and result.not_written
    assert result.report().startswith("attention: not written yet")


def test_an_error_is_shown_with_its_line_and_not_misdiagnosed() -> None:
    def attention(q, k, v):  # noqa: ANN001, ANN202
        return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_k), dim=-1) @ v  # noqa: F821

    result = check_function(EXERCISES["attention"], attention, seed=0)
    assert not result.passed and not result.diagnoses
    report = result.report()
    assert "raised NameError" in report and "test_learn_diagnoses.py" in report and "math.sqrt(d_k)" in report


def test_a_function_that_changes_its_input_is_noted() -> None:
    def attention(q, k, v):  # noqa: ANN001, ANN202
        q /= math.sqrt(q.shape[-1])
        return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v

    result = check_function(EXERCISES["attention"], attention, seed=0)
    assert result.passed and any("changed its input q in place" in n for n in result.notes)


def test_an_unknown_mistake_shows_the_first_case_that_differs() -> None:
    def attention(q, k, v):  # noqa: ANN001, ANN202
        return torch.softmax(_scores(q, k), dim=-1) @ v + 0.5

    result = check_function(EXERCISES["attention"], attention, seed=0)
    assert not result.diagnoses
    assert "first case that differs" in result.report() and "no known mistake does exactly this" in result.report()


def test_a_wrong_shape_is_named() -> None:
    def split_heads(x, n_heads):  # noqa: ANN001, ANN202
        b, t, d = x.shape
        return x.view(b, t, n_heads, d // n_heads)

    result = check_function(EXERCISES["split_heads"], split_heads, seed=0)
    assert result.titles == ["heads axis not moved forward"] and "has shape" in result.report()


def test_a_learners_file_under_a_folder_named_aiayn_keeps_its_line(tmp_path: Path) -> None:
    folder = tmp_path / "aiayn" / "work"  # what `git clone` of this repository makes: a folder named aiayn
    folder.mkdir(parents=True)
    (folder / "mine.py").write_text("import math\nimport torch\n\n\ndef attention(q, k, v):\n"
                                    "    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_k), dim=-1) @ v\n",
                                    encoding="utf-8")
    spec = importlib.util.spec_from_file_location("mine_in_aiayn", folder / "mine.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    report = check_function(EXERCISES["attention"], module.attention, seed=0).report()
    assert f"{folder / 'mine.py'}:6" in report and "math.sqrt(d_k)" in report


def test_the_learn_checks_pass_from_a_clone_in_a_folder_named_aiayn(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("needs git and this repository's history to clone")
    clone = tmp_path / "aiayn"
    subprocess.run(["git", "clone", "--quiet", "--depth", "1", f"file://{root}", str(clone)], check=True, timeout=120)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/unit/test_learn_diagnoses.py", "-k", "shown_with_its_line"],
                          cwd=clone, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
