"""ModelConfig: validation (all problems at once), JSON round trip, key suggestions, presets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from aiayn import AiaynError, build_model, count_parameters
from aiayn.config import PRESETS, ModelConfig


def test_validation_collects_every_problem_in_one_error() -> None:
    with pytest.raises(AiaynError) as exc:
        ModelConfig(d_model=10, n_heads=3, activation="tanh", dropout=1.5)
    msg = str(exc.value)
    assert "d_model=10" in msg and "n_heads=3" in msg  # not divisible
    assert "activation='tanh'" in msg and "swiglu" in msg  # lists the valid choices
    assert "dropout=1.5" in msg
    assert msg.count("\n  - ") == 3


@pytest.mark.parametrize("changes, fragment", [
    (dict(arch="gpt"), "arch='gpt'"),
    (dict(position="rope", d_model=12, n_heads=4), "even head width"),
    (dict(n_kv_heads=3), "n_kv_heads=3"),
    (dict(deepnorm=True, norm_position="pre"), "deepnorm"),
    (dict(tgt_vocab_size=100), "share_src_tgt_embeddings"),
    (dict(arch="encoder", sliding_window=4), "sliding_window"),
    (dict(pad_id=70), "pad_id=70"),
    (dict(vocab_size=0), "vocab_size=0"),
    (dict(norm_eps=0.0), "norm_eps"),
    (dict(rope_scaling="linear", rope_scaling_factor=0.5), "rope_scaling_factor"),
])
def test_each_rule(changes: dict, fragment: str) -> None:
    base = ModelConfig.preset("tiny")
    with pytest.raises(AiaynError, match="invalid model config") as exc:
        base.replace(**changes)
    assert fragment in str(exc.value)


def test_valid_configs_have_no_problems_and_derived_values() -> None:
    c = ModelConfig.preset("tiny", n_kv_heads=2, n_encoder_layers=3, tgt_vocab_size=50,
                           share_src_tgt_embeddings=False)
    assert c.problems() == []
    assert (c.head_dim, c.kv_heads, c.encoder_layers, c.target_vocab_size) == (8, 2, 3, 50)
    d = ModelConfig.preset("tiny")
    assert (d.kv_heads, d.encoder_layers, d.target_vocab_size) == (4, 2, 64)


def test_wrongly_typed_values_are_reported_like_any_other_problem() -> None:
    with pytest.raises(AiaynError) as exc:
        ModelConfig.from_dict({"vocab_size": "100", "dropout": "0.1", "n_heads": 3, "d_model": 10})
    msg = str(exc.value)
    assert "vocab_size='100'" in msg and "dropout='0.1'" in msg and "not divisible" in msg
    with pytest.raises(AiaynError, match="dropout"):
        ModelConfig(dropout="0.1")  # type: ignore[arg-type]


def test_json_round_trip_string_and_file(tmp_path: Path) -> None:
    c = ModelConfig.preset("llama", n_layers=3, vocab_size=1000, rope_scaling="yarn", rope_scaling_factor=4.0)
    text = c.to_json()
    assert json.loads(text)["rope_scaling"] == "yarn"
    assert ModelConfig.from_json(text) == c
    path = tmp_path / "config.json"
    assert c.to_json(path) == path.read_text(encoding="utf-8")
    back = ModelConfig.from_json(path)
    assert back == c and back.to_dict() == c.to_dict()
    assert ModelConfig.from_json(str(path)) == c
    assert ModelConfig.from_json(path) != c.replace(n_layers=4)


def test_json_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(AiaynError, match="not found"):
        ModelConfig.from_json(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{\n  "d_model": 8,\n  oops\n}\n', encoding="utf-8")
    with pytest.raises(AiaynError, match=r"bad\.json:3: invalid JSON"):
        ModelConfig.from_json(bad)
    invalid = tmp_path / "invalid.json"
    invalid.write_text('{"d_model": 10, "n_heads": 3}', encoding="utf-8")
    with pytest.raises(AiaynError, match="not divisible"):
        ModelConfig.from_json(invalid)


def test_unknown_key_suggests_the_closest(tmp_path: Path) -> None:
    with pytest.raises(AiaynError, match="did you mean 'd_model'") as exc:
        ModelConfig.from_dict({"d_modle": 8, "n_heads": 2})
    assert "'d_modle'" in str(exc.value)
    path = tmp_path / "c.json"
    path.write_text('{"n_layer": 2}', encoding="utf-8")
    with pytest.raises(AiaynError, match="did you mean 'n_layers'") as exc:
        ModelConfig.from_json(path)
    assert str(path) in str(exc.value)
    with pytest.raises(AiaynError, match="did you mean 'dropout'"):
        ModelConfig.preset("tiny", dropuot=0.2)
    with pytest.raises(AiaynError, match="unknown preset 'paper-huge'"):
        ModelConfig.preset("paper-huge")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_builds_a_working_model(name: str) -> None:
    full = ModelConfig.preset(name)
    assert full.name == name
    small = ModelConfig.preset(name, n_layers=1, n_encoder_layers=1, vocab_size=97)  # keep the width
    assert (small.d_model, small.n_heads, small.d_ff) == (full.d_model, full.n_heads, full.d_ff)
    torch.manual_seed(0)
    model = build_model(small).eval()
    ids = torch.randint(1, 97, (1, 5))
    with torch.no_grad():
        if small.arch == "encoder-decoder":
            assert model(ids, ids[:, :4]).logits.shape == (1, 4, 97)
        else:
            assert model(ids).logits.shape == (1, 5, 97)
        if small.n_classes:
            assert model(ids, task="classify").logits.shape == (1, small.n_classes)
        assert all(torch.isfinite(p).all() for p in model.parameters())


def test_paper_base_has_about_63m_parameters() -> None:
    c = ModelConfig.preset("paper-base")
    table3 = (37000, 512, 8, 2048, 6, 0.1)
    assert (c.vocab_size, c.d_model, c.n_heads, c.d_ff, c.n_layers, c.dropout) == table3
    with torch.device("meta"):  # shapes only: no memory, no initialization cost
        model = build_model(c, init=False)
    n = count_parameters(model)
    assert 60_000_000 <= n <= 66_000_000, n
    # the embedding matrix (shared by both stacks and the output layer) is counted once
    assert n - count_parameters(model, exclude_embeddings=True) == 37000 * 512


def test_paper_big_has_about_213m_parameters() -> None:
    with torch.device("meta"):
        model = build_model(ModelConfig.preset("paper-big"), init=False)
    assert 205_000_000 <= count_parameters(model) <= 220_000_000  # the paper's Table 3 says 213M
