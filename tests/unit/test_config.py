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
    (dict(gelu_approximate="erf"), "gelu_approximate='erf': unknown; choose one of none, tanh"),
    (dict(activation="swish"), "choose one of relu, gelu, silu, swiglu, geglu"),
    (dict(sinusoidal_layout="split"), "sinusoidal_layout='split': unknown; choose one of interleaved, halves"),
    (dict(rope_scaling="llama2"), "none, linear, ntk, yarn, llama3"),
    (dict(position_offset=-1), "position_offset=-1: must be a whole number >= 0"),
    (dict(position_offset=1.5), "position_offset=1.5: must be a whole number"),
    (dict(n_token_types=2), "n_token_types=2: token types apply to encoder or decoder models"),
    (dict(arch="encoder", n_token_types=0), "n_token_types=0: must be a whole number >= 1"),
    (dict(arch="encoder", output_bias=True), "output_bias=True: an encoder's masked-LM head always has its bias"),
    (dict(arch="encoder", tied_output_scale=True), "tied_output_scale=True: applies to the output layer"),
    (dict(tied_output_scale=True, tie_embeddings=False), "set tie_embeddings=true or tied_output_scale=false"),
    (dict(qkv_bias="yes"), "qkv_bias='yes': must be true or false, or null"),
    (dict(embedding_norm=1), "embedding_norm=1: must be true or false"),
    (dict(rope_scaling="llama3", rope_low_freq_factor=4.0, rope_high_freq_factor=1.0), "needs 0 < low < high"),
    (dict(rope_scaling="llama3", rope_low_freq_factor=0.0), "rope_low_freq_factor=0.0"),
])
def test_each_rule(changes: dict, fragment: str) -> None:
    base = ModelConfig.preset("tiny")
    with pytest.raises(AiaynError, match="invalid model config") as exc:
        base.replace(**changes)
    assert fragment in str(exc.value)


def test_the_family_options_report_every_problem_at_once() -> None:
    with pytest.raises(AiaynError) as exc:
        ModelConfig(arch="encoder", gelu_approximate="exact", sinusoidal_layout="split", position_offset=-2,
                    output_bias=True, tied_output_scale=True, rope_scaling="llama3", rope_low_freq_factor=5.0)
    msg = str(exc.value)
    for fragment in ("gelu_approximate='exact'", "sinusoidal_layout='split'", "position_offset=-2", "output_bias=True",
                     "tied_output_scale=True", "rope_low_freq_factor=5.0"):
        assert fragment in msg
    assert msg.count("\n  - ") == 6


def test_the_family_options_default_to_the_models_as_they_were() -> None:
    c = ModelConfig()
    assert (c.gelu_approximate, c.position_offset, c.sinusoidal_layout, c.qkv_bias, c.embedding_norm,
            c.n_token_types, c.tied_output_scale, c.output_bias) == ("none", 0, "interleaved", None, False, None,
                                                                     False, False)
    assert (c.rope_low_freq_factor, c.rope_high_freq_factor) == (1.0, 4.0)
    assert c.qkv_uses_bias and not c.replace(bias=False).qkv_uses_bias
    assert c.replace(bias=False, qkv_bias=True).qkv_uses_bias and not c.replace(qkv_bias=False).qkv_uses_bias


def test_a_saved_config_without_the_family_options_loads_with_their_defaults() -> None:
    """config.json of a checkpoint written before the options existed (tests/fixtures) loads; its model is the same."""
    saved = json.loads((Path(__file__).parents[1] / "fixtures" / "checkpoint-format-1" / "config.json").read_text())
    new_keys = {"gelu_approximate", "position_offset", "sinusoidal_layout", "rope_low_freq_factor",
                "rope_high_freq_factor", "qkv_bias", "embedding_norm", "n_token_types", "tied_output_scale",
                "output_bias"}
    assert not new_keys & set(saved["model"])
    c = ModelConfig.from_dict(saved["model"])
    assert c == ModelConfig.from_dict({**saved["model"], **{k: getattr(ModelConfig(), k) for k in new_keys}})
    assert new_keys <= set(c.to_dict())


def test_family_options_round_trip_through_json(tmp_path: Path) -> None:
    c = ModelConfig(arch="decoder", activation="gelu", gelu_approximate="tanh", position="learned", position_offset=2,
                    sinusoidal_layout="halves", rope_scaling="llama3", rope_scaling_factor=8.0,
                    rope_low_freq_factor=2.0, rope_high_freq_factor=8.0, bias=False, qkv_bias=True,
                    embedding_norm=True, n_token_types=3, tied_output_scale=True, output_bias=True)
    data = json.loads(c.to_json())
    assert (data["gelu_approximate"], data["qkv_bias"], data["n_token_types"], data["output_bias"]) == (
        "tanh", True, 3, True)
    assert ModelConfig.from_json(c.to_json(tmp_path / "config.json")) == c
    assert ModelConfig.from_json(tmp_path / "config.json") != c.replace(qkv_bias=None)
    assert ModelConfig.from_json(c.replace(activation="silu").to_json()).activation == "silu"


def test_the_mixture_of_experts_fields_report_every_problem_at_once() -> None:
    with pytest.raises(AiaynError) as exc:
        ModelConfig(ffn="sparse", n_experts=0, moe_top_k=3, moe_capacity_factor=0.0, moe_aux_loss_weight=-0.1,
                    moe_z_loss_weight=-1.0)
    msg = str(exc.value)
    for fragment in ("ffn='sparse': unknown; choose one of dense, moe", "n_experts=0: must be a whole number >= 1",
                     "moe_top_k=3: must be between 1 and n_experts=0", "moe_capacity_factor=0.0: must be > 0",
                     "moe_aux_loss_weight=-0.1: must be >= 0", "moe_z_loss_weight=-1.0: must be >= 0"):
        assert fragment in msg
    assert msg.count("\n  - ") == 6
    with pytest.raises(AiaynError, match="moe_top_k=5: must be between 1 and n_experts=4"):
        ModelConfig(ffn="moe", n_experts=4, moe_top_k=5)
    with pytest.raises(AiaynError, match="moe_capacity_factor='1.25': must be a number"):
        ModelConfig(ffn="moe", moe_capacity_factor="1.25")  # type: ignore[arg-type]


def test_the_mixture_of_experts_fields_round_trip_and_default_to_a_dense_model(tmp_path: Path) -> None:
    c = ModelConfig()
    assert (c.ffn, c.moe_capacity_factor) == ("dense", None)
    assert (c.n_experts, c.moe_top_k, c.moe_aux_loss_weight, c.moe_z_loss_weight) == (8, 2, 0.01, 0.001)
    moe = ModelConfig.preset("llama", ffn="moe", n_experts=4, moe_top_k=1, moe_capacity_factor=1.25,
                             moe_aux_loss_weight=0.02, moe_z_loss_weight=0.0)
    data = json.loads(moe.to_json())
    assert (data["ffn"], data["n_experts"], data["moe_top_k"], data["moe_capacity_factor"]) == ("moe", 4, 1, 1.25)
    assert ModelConfig.from_json(moe.to_json(tmp_path / "config.json")) == moe
    assert ModelConfig.from_json(tmp_path / "config.json") != moe.replace(moe_capacity_factor=None)
    # a saved config without the fields loads as the dense model it was
    saved = {k: v for k, v in ModelConfig.preset("tiny").to_dict().items() if k != "ffn" and "expert" not in k
             and not k.startswith("moe_")}
    assert ModelConfig.from_dict(saved) == ModelConfig.preset("tiny")
    # the expert fields change nothing while ffn is dense: the same modules, the same parameters
    torch.manual_seed(0)
    dense = build_model(ModelConfig.preset("tiny"))
    torch.manual_seed(0)
    also_dense = build_model(ModelConfig.preset("tiny", n_experts=3, moe_top_k=1, moe_capacity_factor=2.0))
    assert dense.state_dict().keys() == also_dense.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(dense.state_dict().values(), also_dense.state_dict().values()))


def test_the_family_presets() -> None:
    gpt2, bert, t5 = (ModelConfig.preset(n) for n in ("gpt2-small", "bert-base", "t5-small"))
    assert (gpt2.activation, gpt2.gelu_approximate, gpt2.position, gpt2.norm_position) == ("gelu", "tanh", "learned",
                                                                                          "pre")
    assert (bert.embedding_norm, bert.n_token_types, bert.norm_eps) == (True, 2, 1e-12)
    assert t5.tied_output_scale and t5.tie_embeddings and t5.position == "t5"
    bart, marian = ModelConfig.preset("bart-base"), ModelConfig.preset("marian")
    assert (bart.position_offset, bart.embedding_norm, bart.output_bias, bart.pad_id) == (2, True, True, 1)
    assert (marian.activation, marian.sinusoidal_layout, marian.output_bias, marian.scale_embeddings) == (
        "silu", "halves", True, True)


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
