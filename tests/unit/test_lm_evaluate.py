"""Language-model evaluation batches its sliding windows: the same perplexity as one window at a time, every
window (the last, shorter one included) scored once, and the batch size honoured."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from aiayn.checkpoint import save_checkpoint
from aiayn.config import ModelConfig
from aiayn.evaluate.lm import sliding_window_nll, window_plan
from aiayn.evaluate.run import evaluate_lm
from aiayn.models.build import build_model
from aiayn.pretrained import load_pretrained
from aiayn.tokenize import CharTokenizer

CONTEXT = 16


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    """A tiny decoder with learned positions: its logits depend on where a token sits in its window."""
    torch.manual_seed(0)
    return build_model(ModelConfig.preset("tiny", arch="decoder", vocab_size=20, max_len=CONTEXT,
                                          position="learned")).eval()


def _recording(model: torch.nn.Module, shapes: list[tuple[int, int]]):  # noqa: ANN202
    def fn(x: torch.Tensor) -> torch.Tensor:
        shapes.append(tuple(x.shape))
        return model(x).logits
    return fn


@pytest.mark.parametrize(("n", "stride"), [(100, 8), (101, 5), (16, 8), (17, 8), (40, 15), (9, 3), (2, 1)])
@pytest.mark.parametrize("batch_size", [2, 3, 64])
def test_batched_equals_one_window_at_a_time(model: torch.nn.Module, n: int, stride: int, batch_size: int) -> None:
    torch.manual_seed(n * stride)
    ids = torch.randint(5, 20, (n,))
    single: list[tuple[int, int]] = []
    batched: list[tuple[int, int]] = []
    one = sliding_window_nll(_recording(model, single), ids, CONTEXT, stride)
    many = sliding_window_nll(_recording(model, batched), ids, CONTEXT, stride, batch_size=batch_size)
    assert many[1] == one[1] == n - 1
    assert many[0] == pytest.approx(one[0], rel=1e-6)
    plan = window_plan(n, CONTEXT, stride)
    assert all(b == 1 for b, _ in single) and len(single) == len(plan)
    assert sum(b for b, _ in batched) == len(plan) and all(b <= batch_size for b, _ in batched)
    assert batched[-1][1] == plan[-1][1] - plan[-1][0]  # the last window, shorter or not, is scored
    if len(plan) > batch_size:
        assert len(batched) < len(single)


def test_progress_counts_every_window(model: torch.nn.Module) -> None:
    ids = torch.randint(5, 20, (100,))
    done: list[int] = []
    sliding_window_nll(lambda x: model(x).logits, ids, CONTEXT, 8, batch_size=4, progress=done.append)
    assert sum(done) == len(window_plan(100, CONTEXT, 8)) and max(done) == 4


def test_bad_batch_size(model: torch.nn.Module) -> None:
    from aiayn.errors import AiaynError

    with pytest.raises(AiaynError, match="batch_size"):
        sliding_window_nll(lambda x: model(x).logits, torch.arange(5, 15), CONTEXT, 8, batch_size=0)


def test_evaluate_lm_is_the_same_for_every_batch_size(tmp_path: Path) -> None:
    text = "the quick brown fox jumps over the lazy dog\n" * 8
    tok = CharTokenizer.train([text])
    torch.manual_seed(1)
    lm = build_model(ModelConfig.preset("tiny", arch="decoder", vocab_size=tok.vocab_size, max_len=CONTEXT,
                                        position="learned"))
    ckpt = save_checkpoint(tmp_path / "lm", lm, {"task": "lm", "model": lm.config.to_dict(),
                                                 "tokenizers": {"text": "tokenizer.json"}, "block_size": CONTEXT,
                                                 "newline_symbol": None},
                           tokenizer_writer=lambda d: tok.save(d / "tokenizer.json"))
    data = tmp_path / "eval.txt"
    data.write_text(text, encoding="utf-8")
    pre = load_pretrained(ckpt, accel="none")
    one = evaluate_lm(pre, data, batch_size=1)
    for batch_size in (5, 64):
        many = evaluate_lm(pre, data, batch_size=batch_size, progress=True)
        assert many["tokens"] == one["tokens"] == len(text) - 1
        assert many["perplexity"] == pytest.approx(one["perplexity"], rel=1e-6)
