"""Attention heads narrower or wider than d_model / n_heads (``head_dim``), held to transformers.

T5 v1.1 checkpoints such as t5-v1_1-small and flan-t5-small have ``d_kv * num_heads != d_model`` (6 heads of 64 in
512), and Gemma- or Qwen3-like LLaMA configs an explicit ``head_dim``. A tiny random transformers model of each kind is
saved beside a tiny tokenizer (never downloaded) and converted with ``from_hf``; the converted checkpoint must give
transformers' logits at 1e-5 in fp32, with padding, and again decoding step by step through the KV cache, with the
reference modules and accelerated (which declines such heads). The config field itself: validation, JSON, and
defaults that leave every model as it was.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from aiayn import AiaynError, ModelConfig, build_model, count_parameters
from aiayn.nn.attention import MultiHeadAttention

transformers = pytest.importorskip("transformers")
from tokenizers import Tokenizer as HFTokenizer  # noqa: E402
from tokenizers import models, pre_tokenizers, trainers  # noqa: E402

from aiayn.generate.steppers import LMStepper, Seq2SeqStepper, eval_mode  # noqa: E402
from aiayn.hf import from_hf, to_hf  # noqa: E402
from aiayn.pretrained import load_pretrained  # noqa: E402

ATOL = 1e-5
D, H, KV, DH, FF, MAX = 32, 4, 2, 12, 48, 64  # H * DH = 48, not D
TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "Two young, white males are outside near many bushes.",
    "Several men in hard hats are operating a giant pulley system.",
    "Ein kleines Mädchen klettert in ein Spielhaus aus Holz.",
    "it's, can't, won't, they're, I'm, we've!",
] * 3


def _close(got: Tensor, want: Tensor) -> None:
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def _randomize_t5(model: nn.Module) -> None:
    """Embeddings N(0, 0.3), other matrices N(0, 1 / fan_in), norm weights near 1; the queries also scaled by
    d_kv^-0.5, as T5's own initialization folds the scale its attention leaves out into them (unscaled scores of
    wide heads would otherwise make the float rounding of both implementations approach the tolerance)."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.normal_(1.0, 0.2)
            elif "embed" in name or "shared" in name or "relative_attention_bias" in name:
                p.normal_(0.0, 0.3)
            else:
                p.normal_(0.0, p.shape[1] ** -0.5 * (DH**-0.5 if name.endswith(".q.weight") else 1.0))


def _t5_folder(folder: Path) -> Any:
    """A T5 v1.1 (gated GELU, unscaled output layer) of 4 heads of 12 in 32, with a unigram tokenizer."""
    tok = HFTokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.train_from_iterator(TEXT, trainers.UnigramTrainer(vocab_size=120, special_tokens=["<pad>", "</s>", "<unk>"],
                                                          unk_token="<unk>", show_progress=False))
    vocab = [(piece, score) for piece, score in json.loads(tok.to_str())["model"]["vocab"]]
    transformers.T5TokenizerFast(vocab=vocab, extra_ids=3).save_pretrained(folder)
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    cfg = transformers.T5Config(vocab_size=len(hf_tok), d_model=D, d_kv=DH, d_ff=FF, num_layers=2,
                                num_decoder_layers=2, num_heads=H, relative_attention_num_buckets=8,
                                relative_attention_max_distance=20, pad_token_id=0, eos_token_id=1,
                                decoder_start_token_id=0, feed_forward_proj="gated-gelu", tie_word_embeddings=False)
    model = transformers.T5ForConditionalGeneration(cfg)
    _randomize_t5(model)
    model.save_pretrained(folder)
    return hf_tok


def _llama_folder(folder: Path) -> Any:
    """A LLaMA of 4 query and 2 key/value heads of 12 in 32 (``head_dim`` given), with a byte-fallback BPE."""
    tok = HFTokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
    tok.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=340, special_tokens=["<unk>", "<s>", "</s>",
                                                                                      *byte_tokens],
                                                      show_progress=False))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
              for m in json.loads(tok.to_str())["model"]["merges"]]
    transformers.LlamaTokenizerFast(vocab=tok.get_vocab(), merges=merges, add_bos_token=True,
                                    add_eos_token=False).save_pretrained(folder)
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    cfg = transformers.LlamaConfig(vocab_size=len(hf_tok), hidden_size=D, intermediate_size=FF, num_hidden_layers=2,
                                   num_attention_heads=H, num_key_value_heads=KV, head_dim=DH,
                                   max_position_embeddings=MAX, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2,
                                   tie_word_embeddings=False,
                                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    model.save_pretrained(folder)
    return hf_tok


def _reference(folder: Path, cls: str) -> nn.Module:
    return getattr(transformers, cls).from_pretrained(str(folder), attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def t5(tmp_path_factory: pytest.TempPathFactory) -> tuple[nn.Module, Path]:
    root = tmp_path_factory.mktemp("t5-head-dim")
    _t5_folder(root / "hf")
    return _reference(root / "hf", "T5ForConditionalGeneration"), from_hf(root / "hf", root / "aiayn")


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[nn.Module, Path]:
    root = tmp_path_factory.mktemp("llama-head-dim")
    _llama_folder(root / "hf")
    return _reference(root / "hf", "LlamaForCausalLM"), from_hf(root / "hf", root / "aiayn")


# ---------------------------------------------------------------------------------------------- T5 v1.1
def _t5_batch(vocab: int) -> tuple[Tensor, Tensor, Tensor]:
    """Right-padded sources (3, 9) ending in EOS, their attention mask, and decoder inputs (3, 7) from pad."""
    gen = torch.Generator().manual_seed(1)
    lengths = torch.tensor([9, 6, 3])
    src = torch.randint(3, vocab, (3, 9), generator=gen)
    mask = torch.arange(9)[None, :] < lengths[:, None]
    src[torch.arange(3), lengths - 1] = 1
    src[~mask] = 0
    tgt = torch.randint(3, vocab, (3, 7), generator=gen)
    tgt[:, 0] = 0
    return src, mask, tgt


def test_t5_d_kv_becomes_head_dim(t5: tuple[nn.Module, Path]) -> None:
    ref, ckpt = t5
    config = load_pretrained(ckpt, accel="none").config
    assert (config.d_model, config.n_heads, config.head_dim) == (D, H, DH)
    assert json.loads((ckpt / "config.json").read_text())["model"]["head_dim"] == DH
    assert ref.config.d_kv * ref.config.num_heads != ref.config.d_model


@pytest.mark.parametrize("accel", ("none", "auto"))
def test_t5_logits_equal_transformers_with_and_without_the_cache(accel: str, t5: tuple[nn.Module, Path]) -> None:
    ref, ckpt = t5
    model = load_pretrained(ckpt, accel=accel).model
    src, mask, tgt = _t5_batch(ref.config.vocab_size)
    with torch.no_grad():
        want = ref(input_ids=src, attention_mask=mask.long(), decoder_input_ids=tgt).logits
        _close(model(src, tgt, src_is_token=mask).logits, want)
    with eval_mode(model):
        stepper = Seq2SeqStepper(model, src, capacity=4, bos_id=0, src_is_token=mask)  # the cache grows
        got = [stepper.first()] + [stepper.step(tgt[:, t]) for t in range(1, tgt.shape[1])]
    _close(torch.stack(got, 1), want)


def test_t5_round_trip_writes_d_kv(t5: tuple[nn.Module, Path], tmp_path: Path) -> None:
    ref, ckpt = t5
    to_hf(ckpt, tmp_path / "back")
    assert json.loads((tmp_path / "back" / "config.json").read_text())["d_kv"] == DH
    back = _reference(tmp_path / "back", "T5ForConditionalGeneration")
    src, mask, tgt = _t5_batch(ref.config.vocab_size)
    with torch.no_grad():
        _close(back(input_ids=src, attention_mask=mask.long(), decoder_input_ids=tgt).logits,
               ref(input_ids=src, attention_mask=mask.long(), decoder_input_ids=tgt).logits)


# ---------------------------------------------------------------------------------------------- LLaMA
def _lm_batch(vocab: int) -> tuple[Tensor, Tensor, Tensor]:
    """Left-padded ids (3, 12), their attention mask and the positions of the real tokens."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (3, 12), generator=gen)
    mask = torch.arange(12)[None, :] >= 12 - torch.tensor([12, 8, 5])[:, None]
    ids[~mask] = 0
    return ids, mask, (mask.long().cumsum(1) - 1).clamp(min=0)


def test_llama_head_dim_is_kept(llama: tuple[nn.Module, Path]) -> None:
    _, ckpt = llama
    config = load_pretrained(ckpt, accel="none").config
    assert (config.d_model, config.n_heads, config.kv_heads, config.head_dim) == (D, H, KV, DH)


@pytest.mark.parametrize("accel", ("none", "auto"))
def test_llama_logits_equal_transformers_with_and_without_the_cache(accel: str,
                                                                    llama: tuple[nn.Module, Path]) -> None:
    ref, ckpt = llama
    model = load_pretrained(ckpt, accel=accel).model
    ids, mask, positions = _lm_batch(ref.config.vocab_size)
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask.long(), position_ids=positions).logits
        got = model(ids, is_token=mask, positions=positions).logits
    _close(got[mask], want[mask])
    prompt = 8
    with eval_mode(model):
        stepper = LMStepper(model, ids[:, :prompt], mask[:, :prompt], capacity=ids.shape[1])
        steps = [stepper.first()] + [stepper.step(ids[:, col]) for col in range(prompt, ids.shape[1])]
    _close(torch.stack(steps, 1), want[:, prompt - 1:])


def test_llama_round_trip_writes_head_dim(llama: tuple[nn.Module, Path], tmp_path: Path) -> None:
    ref, ckpt = llama
    to_hf(ckpt, tmp_path / "back")
    assert json.loads((tmp_path / "back" / "config.json").read_text())["head_dim"] == DH
    back = _reference(tmp_path / "back", "LlamaForCausalLM")
    ids, mask, positions = _lm_batch(ref.config.vocab_size)
    with torch.no_grad():
        _close(back(input_ids=ids, attention_mask=mask.long(), position_ids=positions).logits[mask],
               ref(input_ids=ids, attention_mask=mask.long(), position_ids=positions).logits[mask])


# ---------------------------------------------------------------------------------------------- the config field
def test_head_dim_defaults_to_d_model_over_n_heads_and_follows_them() -> None:
    c = ModelConfig.preset("tiny")
    assert c.head_dim == 8 and c.to_dict()["head_dim"] is None
    assert c.replace(d_model=64).head_dim == 16  # null follows d_model and n_heads
    wide = c.replace(head_dim=12)
    assert wide.head_dim == 12 and wide.replace(d_model=64).head_dim == 12
    assert ModelConfig.from_json(wide.to_json()) == wide
    assert json.loads(wide.to_json())["head_dim"] == 12
    assert ModelConfig(d_model=10, n_heads=3, head_dim=4).head_dim == 4  # D need not divide by H then


def test_the_default_head_dim_leaves_models_as_they_were() -> None:
    """A config without the field (as saved before it existed) builds the same parameters, bit for bit."""
    for preset in ("tiny", "llama"):
        data = ModelConfig.preset(preset, vocab_size=64, n_layers=1, d_model=64, n_heads=4, n_kv_heads=2,
                                   d_ff=32).to_dict()
        old = {k: v for k, v in data.items() if k != "head_dim"}
        torch.manual_seed(0)
        a = build_model(ModelConfig.from_dict(old))
        torch.manual_seed(0)
        b = build_model(ModelConfig.from_dict(data))
        assert a.state_dict().keys() == b.state_dict().keys()
        assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
        attn = next(m for m in b.modules() if isinstance(m, MultiHeadAttention))
        assert attn.head_dim == 16 and attn.out_proj.weight.shape == (64, 64)


def test_head_dim_shapes_the_projections() -> None:
    config = ModelConfig.preset("tiny", n_kv_heads=2, head_dim=12)
    model = build_model(config)
    self_attn, cross_attn = model.decoder.layers[0].self_attn, model.decoder.layers[0].cross_attn
    assert self_attn.qkv_proj.weight.shape == (4 * 12 + 2 * 2 * 12, 32)  # (H*Dh + 2*Hkv*Dh, D)
    assert self_attn.out_proj.weight.shape == (32, 4 * 12)
    assert cross_attn.q_proj.weight.shape == (48, 32) and cross_attn.kv_proj.weight.shape == (48, 32)


@pytest.mark.parametrize("changes, fragment", [
    (dict(head_dim=0), "head_dim=0: must be a whole number >= 1"),
    (dict(head_dim=-4), "head_dim=-4: must be a whole number >= 1"),
    (dict(head_dim=8.0), "head_dim=8.0: must be a whole number"),
    (dict(position="rope", head_dim=7), "position='rope': needs an even head width, got head_dim=7"),
    (dict(d_model=30, n_heads=4), "not divisible by n_heads=4"),
])
def test_head_dim_validation(changes: dict, fragment: str) -> None:
    with pytest.raises(AiaynError, match="invalid model config") as exc:
        ModelConfig.preset("tiny").replace(**changes)
    assert fragment in str(exc.value)


def test_an_explicit_head_dim_lifts_the_divisibility_rule() -> None:
    assert ModelConfig.preset("tiny", d_model=30, n_heads=4, head_dim=8).problems() == []
    assert ModelConfig.check({"d_model": 30, "n_heads": 4, "head_dim": 0}) == [
        "head_dim=0: must be a whole number >= 1, or null (d_model / n_heads)"]


def test_flops_count_the_attention_width() -> None:
    """Wider heads cost their larger projections and, per key of the context, 2 * H * head_dim more."""
    from aiayn.models.stats import forward_flops_per_token

    c = ModelConfig.preset("llama", vocab_size=64, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=48)
    wide = c.replace(head_dim=12)  # heads of 12 instead of 8
    per_layer = 2 * 32 * (4 * 4) + 2 * 32 * (2 * 4)  # q and out: D x H*4 more; k and v: D x Hkv*4 more
    assert count_parameters(build_model(wide)) - count_parameters(build_model(c)) == 2 * per_layer
    context = 5
    extra = forward_flops_per_token(wide, tgt_len=context) - forward_flops_per_token(c, tgt_len=context)
    assert extra == 2 * 2 * per_layer + 2 * 2 * context * (4 * 4)  # 2 FLOPs per weight; 2 layers; attention
