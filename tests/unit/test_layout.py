"""Column-major inference weights: same values and ties, same outputs and decodes, checkpoints still save."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aiayn import ModelConfig, build_model
from aiayn.accel.cpu.layout import column_major_linears, is_column_major
from aiayn.checkpoint import load_model_state, save_checkpoint
from aiayn.generate import generate, translate


def _model(arch: str, **kw: object) -> nn.Module:
    torch.manual_seed(0)
    return build_model(ModelConfig.preset("tiny", arch=arch, vocab_size=50, **kw)).eval()


def _clone(model: nn.Module, arch: str, **kw: object) -> nn.Module:
    other = _model(arch, **kw)
    other.load_state_dict(model.state_dict())
    return other


@pytest.mark.parametrize("arch", ["encoder-decoder", "decoder", "encoder"])
def test_every_linear_becomes_column_major_with_values_and_ties_kept(arch: str) -> None:
    kw = {"n_classes": 3} if arch == "encoder" else {}
    model = _model(arch, **kw)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = {id(p) for p in model.parameters()}
    column_major_linears(model)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert linears and all(is_column_major(m.weight) for m in linears)
    assert {id(p) for p in model.parameters()} == params  # same Parameter objects: ties and optimizers survive
    after = model.state_dict()
    assert after.keys() == before.keys()
    for k, v in before.items():
        assert after[k].shape == v.shape and torch.equal(after[k], v), k
    if arch != "encoder":
        embed = model.tgt_embed if arch == "encoder-decoder" else model.embed
        assert model.lm_head.proj.weight is embed.weight  # still tied
    column_major_linears(model)  # idempotent
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())


@pytest.mark.parametrize("arch", ["encoder-decoder", "decoder", "encoder"])
def test_outputs_match_the_row_major_model(arch: str) -> None:
    kw = {"n_classes": 3} if arch == "encoder" else {}
    ref = _model(arch, **kw)
    col = column_major_linears(_clone(ref, arch, **kw))
    ids = torch.randint(3, 50, (3, 9))
    with torch.no_grad():
        if arch == "encoder-decoder":
            a, b = ref(ids, ids[:, :6]).logits, col(ids, ids[:, :6]).logits
        else:
            a, b = ref(ids).logits, col(ids).logits
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def test_decoding_matches_the_row_major_model() -> None:
    ref = _model("encoder-decoder")
    col = column_major_linears(_clone(ref, "encoder-decoder"))
    src = torch.randint(4, 50, (3, 7))
    beams = [translate(m, src, beam_size=3, max_len_b=8) for m in (ref, col)]
    assert [[h.tokens for h in s] for s in beams[0]] == [[h.tokens for h in s] for s in beams[1]]
    lm = _model("decoder")
    lm_col = column_major_linears(_clone(lm, "decoder"))
    prompts = [[5, 6, 7], [8, 9]]
    assert generate(lm, prompts, max_new_tokens=6, greedy=True) == generate(lm_col, prompts, max_new_tokens=6,
                                                                             greedy=True)


def test_a_column_major_model_saves_and_loads(tmp_path) -> None:
    model = column_major_linears(_model("encoder-decoder"))
    save_checkpoint(tmp_path / "ck", model, {})
    fresh = _model("encoder-decoder")
    for p in fresh.parameters():
        p.data.zero_()
    load_model_state(tmp_path / "ck", fresh)
    for (k, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), k
