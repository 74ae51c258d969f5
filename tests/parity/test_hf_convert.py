"""Hugging Face interop for the decoder-only families (GPT-2, LLaMA 3, Mistral, Qwen2), held to transformers.

Each family is a tiny random transformers model built from its config class and saved with ``save_pretrained``
beside a tiny tokenizer (never downloaded). ``from_hf`` converts the folder; the converted checkpoint must give
transformers' logits at 1e-5 in fp32 (with left padding and an attention mask, and decoding step by step with the
KV cache), the same 32 greedy tokens as ``generate(do_sample=False)`` through aiayn's generation and through
``aiayn generate``, and the same logits again after ``to_hf`` and ``from_pretrained``. An aiayn-trained model goes
out through ``to_hf`` and loads in ``AutoModelForCausalLM``. ``.bin`` and sharded weights convert alike; a refused
family, a corrupt folder and an unreachable Hub name give one clear error each.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from aiayn import ModelConfig, build_model
from aiayn.errors import AiaynError

transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file  # noqa: E402
from tokenizers import Tokenizer as HFTokenizer  # noqa: E402
from tokenizers import models, pre_tokenizers, trainers  # noqa: E402

from aiayn.accel import compile_decoding  # noqa: E402
from aiayn.checkpoint import save_checkpoint  # noqa: E402
from aiayn.cli.main import main  # noqa: E402
from aiayn.generate.lm import generate  # noqa: E402
from aiayn.generate.steppers import LMStepper, eval_mode  # noqa: E402
from aiayn.hf import from_hf, to_hf  # noqa: E402
from aiayn.pretrained import load_pretrained  # noqa: E402
from aiayn.tokenize import CharTokenizer  # noqa: E402

ATOL = 1e-5
D, H, KV, FF, L, MAX = 32, 4, 2, 48, 2, 64
NEW = 32  # greedy tokens compared
TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "Two young, white males are outside near many bushes.",
    "Several men in hard hats are operating a giant pulley system.",
    "A little girl climbing into a wooden playhouse.",
    "Ein kleines Mädchen klettert in ein Spielhaus aus Holz.",
    "it's, can't, won't, they're, I'm, we've!",
] * 3
PROMPTS = ["The quick brown fox", "A little girl climbing into a wooden"]


# ---------------------------------------------------------------------------------------------- tiny folders
def _merges(tok: HFTokenizer) -> list[tuple[str, str]]:
    merges = json.loads(tok.to_str())["model"]["merges"]
    return [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in merges]  # type: ignore[misc]


def _byte_level(folder: Path, cls: str) -> None:
    """Byte-level BPE with <|endoftext|> as EOS (and, absent others, BOS and padding), as GPT-2's and Qwen2's."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(TEXT, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    getattr(transformers, cls)(vocab=tok.get_vocab(with_added_tokens=False), merges=_merges(tok)).save_pretrained(
        folder)


def _llama_tokenizer(folder: Path) -> None:
    """SentencePiece-style BPE with byte fallback, <unk>=0 <s>=1 </s>=2, as LLaMA's."""
    tok = HFTokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
    tok.train_from_iterator(TEXT, trainers.BpeTrainer(
        vocab_size=380, special_tokens=["<unk>", "<s>", "</s>", *byte_tokens], show_progress=False))
    transformers.LlamaTokenizerFast(vocab=tok.get_vocab(), merges=_merges(tok), add_bos_token=True,
                                    add_eos_token=False).save_pretrained(folder)


def _eager(cfg: Any) -> Any:
    cfg._attn_implementation = "eager"
    return cfg


def _hf_config(family: str, vocab: int, bos: int, eos: int) -> Any:
    ids = dict(bos_token_id=bos, eos_token_id=eos)
    if family == "gpt2":
        return transformers.GPT2Config(vocab_size=vocab, n_positions=MAX, n_embd=D, n_layer=L, n_head=H, n_inner=FF,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **ids)
    llama_like = dict(vocab_size=vocab, hidden_size=D, intermediate_size=FF, num_hidden_layers=L,
                      num_attention_heads=H, num_key_value_heads=KV, max_position_embeddings=MAX, rms_norm_eps=1e-6,
                      **ids)
    if family == "llama":  # LLaMA 3.1's RoPE scaling, untied output layer
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
        return transformers.LlamaConfig(**llama_like, rope_parameters=rope, tie_word_embeddings=False)
    if family == "mistral":  # a sliding window shorter than the sequences
        return transformers.MistralConfig(**llama_like, sliding_window=6, tie_word_embeddings=False,
                                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    if family == "mixtral":  # four experts, two per token, and a sliding window
        return transformers.MixtralConfig(**llama_like, sliding_window=6, tie_word_embeddings=False,
                                          num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.02,
                                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    return transformers.Qwen2Config(**llama_like, tie_word_embeddings=True,  # biases on q, k, v; tied output
                                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


HF_CLASSES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
              "qwen2": "Qwen2ForCausalLM", "mixtral": "MixtralForCausalLM"}
FAMILIES = tuple(HF_CLASSES)


def _reference(family: str, folder: Path) -> tuple[nn.Module, Any]:
    """A random transformers model of ``family`` and its tokenizer, saved together into ``folder``."""
    if family in ("gpt2", "qwen2"):
        _byte_level(folder, "GPT2TokenizerFast" if family == "gpt2" else "Qwen2TokenizerFast")
    else:
        _llama_tokenizer(folder)
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    bos = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    cfg = _eager(_hf_config(family, len(tok), bos, tok.eos_token_id))
    torch.manual_seed(0)
    model = getattr(transformers, HF_CLASSES[family])(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
        # EOS scores exactly 0 at every step (its output row is zero), below the best of the other tokens: both
        # implementations then generate all NEW tokens
        model.get_output_embeddings().weight[tok.eos_token_id].zero_()
    model.generation_config.pad_token_id = tok.eos_token_id
    model.save_pretrained(folder)
    return model, transformers.AutoTokenizer.from_pretrained(str(folder))  # as transformers reads the model's folder


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[nn.Module, Any, Path, Path]]:
    """family -> (transformers model, its tokenizer, its folder, the aiayn checkpoint converted from it)."""
    out = {}
    for family in FAMILIES:
        root = tmp_path_factory.mktemp(family)
        model, tok = _reference(family, root / "hf")
        out[family] = (model, tok, root / "hf", from_hf(root / "hf", root / "aiayn"))
    return out


def _batch(vocab: int, lengths: tuple[int, ...] = (12, 8, 5)) -> tuple[Tensor, Tensor, Tensor]:
    """Left-padded ids (B, T), their attention mask and the position ids that count real tokens only."""
    t = max(lengths)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (len(lengths), t), generator=gen)
    mask = torch.arange(t)[None, :] >= t - torch.tensor(lengths)[:, None]
    ids[~mask] = 0
    return ids, mask, (mask.long().cumsum(1) - 1).clamp(min=0)


def _close(got: Tensor, want: Tensor) -> None:
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


# ---------------------------------------------------------------------------------------------- logits
@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_transformers_with_left_padding(family: str, converted) -> None:
    ref, tok, _, ckpt = converted[family]
    pre = load_pretrained(ckpt, accel="none")
    assert pre.task == "lm" and pre.tokenizers["text"].eos_id == tok.eos_token_id
    ids, mask, positions = _batch(len(tok))
    with torch.no_grad():
        full = ref(input_ids=ids[:1]).logits
        _close(pre.model(ids[:1]).logits, full)  # no padding, no mask
        want = ref(input_ids=ids, attention_mask=mask.long(), position_ids=positions).logits
        got = pre.model(ids, is_token=mask, positions=positions).logits
    _close(got[mask], want[mask])


@pytest.mark.parametrize("step", ["eager", "compiled"])
@pytest.mark.filterwarnings("error::RuntimeWarning")  # a compiled step that fell back to eager fails
@pytest.mark.parametrize("family", FAMILIES)
def test_cached_steps_equal_the_full_pass(family: str, step: str, converted) -> None:
    """The left-padded prompts prefilled, then one token per step through the KV cache (accelerated as loaded; or
    the step compiled over a static cache, ``aiayn.accel.compile_decoding``)."""
    ref, tok, _, ckpt = converted[family]
    model = load_pretrained(ckpt, accel="none" if step == "compiled" else None).model
    if step == "compiled":
        torch._dynamo.reset()
        compile_decoding(model, backend="aot_eager")
    ids, mask, positions = _batch(len(tok))
    prompt = 8  # columns of the prompt (every row has tokens among them); the rest is fed one column per step
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask.long(), position_ids=positions).logits
    with eval_mode(model):
        stepper = LMStepper(model, ids[:, :prompt], mask[:, :prompt], capacity=ids.shape[1])
        got = [stepper.first()]
        for col in range(prompt, ids.shape[1]):
            assert bool(mask[:, col].all())
            got.append(stepper.step(ids[:, col]))
    _close(torch.stack(got, 1), want[:, prompt - 1:])


# ---------------------------------------------------------------------------------------------- greedy generation
def _hf_greedy(ref: nn.Module, tok: Any, prompt: str) -> tuple[list[int], list[int]]:
    ids = tok.encode(prompt, add_special_tokens=False)
    x = torch.tensor([ids])
    with torch.no_grad():
        out = ref.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=NEW,
                           pad_token_id=tok.eos_token_id)
    return ids, out[0, len(ids):].tolist()


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generation_equals_transformers(family: str, converted, capsys: pytest.CaptureFixture) -> None:
    ref, tok, _, ckpt = converted[family]
    expected = [_hf_greedy(ref, tok, p) for p in PROMPTS]
    assert all(len(new) == NEW for _, new in expected)
    pre = load_pretrained(ckpt)
    ours = pre.tokenizers["text"]
    assert [ours.encode(p) for p in PROMPTS] == [ids for ids, _ in expected]
    got = generate(pre.model, [ids for ids, _ in expected], max_new_tokens=NEW, greedy=True,
                   stop_ids=(ours.eos_id,), pad_id=ours.pad_id)  # one left-padded batch
    assert got == [new for _, new in expected]
    # the command line, on the converted checkpoint: both prompts as one batch
    argv = ["generate", "--checkpoint", str(ckpt), "--greedy", "--max-new-tokens", str(NEW)]
    assert main([*argv, *(a for p in PROMPTS for a in ("--prompt", p))]) == 0
    texts = []
    for prompt, (ids, new) in zip(PROMPTS, expected, strict=True):
        start = tok.decode(ids, skip_special_tokens=True)
        texts.append(prompt + tok.decode(ids + new, skip_special_tokens=True)[len(start):])
    assert capsys.readouterr().out == "\n".join([texts[0], "-" * 40, texts[1]]) + "\n"


# ---------------------------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip_gives_transformers_the_same_model(family: str, converted, tmp_path: Path) -> None:
    ref, tok, folder, ckpt = converted[family]
    out = to_hf(ckpt, tmp_path / "back")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [HF_CLASSES[family]] and config["model_type"] == family
    assert config["torch_dtype"] == "float32"
    saved = load_file(str(folder / "model.safetensors"))
    written = load_file(str(out / "model.safetensors"))
    assert sorted(written) == sorted(saved)  # tied weights stored once, as transformers stores them
    back = transformers.AutoModelForCausalLM.from_pretrained(str(out), attn_implementation="eager").eval()
    ids, mask, positions = _batch(len(tok))
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask.long(), position_ids=positions).logits
        got = back(input_ids=ids, attention_mask=mask.long(), position_ids=positions).logits
    _close(got[mask], want[mask])
    back_tok = transformers.AutoTokenizer.from_pretrained(str(out))
    for text in [*TEXT[:6], "Café déjà vu 😀\nline two"]:
        assert back_tok.encode(text) == tok.encode(text), text
        ids = tok.encode(text)
        assert back_tok.decode(ids, skip_special_tokens=True) == tok.decode(ids, skip_special_tokens=True)
    assert (back_tok.eos_token_id, back.config.eos_token_id) == (tok.eos_token_id, ref.config.eos_token_id)


def _aiayn_lm(tmp_path: Path, **model: Any) -> tuple[nn.Module, CharTokenizer, Path]:
    """A small aiayn language model with a char tokenizer, saved as an lm checkpoint (as training writes it)."""
    tok = CharTokenizer.train(TEXT)
    config = ModelConfig(vocab_size=tok.vocab_size, d_model=D, n_heads=H, n_layers=L, d_ff=FF, max_len=MAX,
                         dropout=0.0, **model)
    torch.manual_seed(0)
    lm = build_model(config).eval()
    with torch.no_grad():
        for p in lm.parameters():
            p.add_(0.1 * torch.randn_like(p))  # norms away from 1, biases away from 0
    meta = {"task": "lm", "model": config.to_dict(), "tokenizers": {"text": "tokenizer.json"}, "block_size": MAX,
            "newline_symbol": None, "packing": False}
    ckpt = save_checkpoint(tmp_path / "aiayn", lm, meta, tokenizer_writer=lambda d: tok.save(d / "tokenizer.json"))
    return lm, tok, ckpt


# the shakespeare-char recipe's model (GPT-2's shape with the exact GELU), and the llama preset's
AIAYN_MODELS = {
    "gpt2": dict(arch="decoder", activation="gelu", norm="layernorm", norm_position="pre", position="learned",
                 scale_embeddings=False, tie_embeddings=True, init="gpt2"),
    "llama": dict(arch="decoder", n_kv_heads=KV, activation="swiglu", norm="rmsnorm", norm_eps=1e-6,
                  norm_position="pre", position="rope", bias=False, scale_embeddings=False, tie_embeddings=False,
                  init="gpt2"),
    "mixtral": dict(arch="decoder", n_kv_heads=KV, activation="swiglu", norm="rmsnorm", norm_eps=1e-6,
                    norm_position="pre", position="rope", bias=False, scale_embeddings=False, tie_embeddings=False,
                    init="gpt2", ffn="moe", n_experts=3, moe_top_k=2, sliding_window=5),
}


@pytest.mark.parametrize("family", sorted(AIAYN_MODELS))
def test_an_aiayn_trained_model_loads_in_transformers(family: str, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    lm, tok, ckpt = _aiayn_lm(tmp_path, **AIAYN_MODELS[family])
    assert main(["convert", "--to-hf", str(ckpt), "--out", str(tmp_path / "hf")]) == 0
    assert "wrote the transformers folder" in capsys.readouterr().out
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), attn_implementation="eager").eval()
    assert type(ref).__name__ == HF_CLASSES[family]
    ids, mask, positions = _batch(tok.vocab_size)
    with torch.no_grad():
        want = lm(ids, is_token=mask, positions=positions).logits
        got = ref(input_ids=ids, attention_mask=mask.long(), position_ids=positions).logits
    _close(got[mask], want[mask])
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    for text in TEXT[:6] + ["two\nlines, and an unknown character: \u2603"]:
        assert hf_tok.encode(text) == tok.encode(text), text
        assert hf_tok.decode(tok.encode(text), skip_special_tokens=True) == tok.decode(tok.encode(text))
    assert ref.config.eos_token_id == tok.eos_id and ref.config.pad_token_id == tok.pad_id


# ---------------------------------------------------------------------------------------------- weight files
def _same_checkpoint(a: Path, b: Path) -> None:
    sa, sb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert sorted(sa) == sorted(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)


def _copy_folder(src: Path, dst: Path, skip: tuple[str, ...] = ("model.safetensors",)) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        if f.name not in skip:
            (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_bin_and_sharded_weights_convert_alike(converted, tmp_path: Path) -> None:
    ref, _, folder, ckpt = converted["llama"]
    state = load_file(str(folder / "model.safetensors"))
    bin_folder = _copy_folder(folder, tmp_path / "bin")
    torch.save(state, bin_folder / "pytorch_model.bin")
    _same_checkpoint(from_hf(bin_folder, tmp_path / "from_bin"), ckpt)
    # sharded .bin, with its index
    shards = _copy_folder(folder, tmp_path / "bin_shards")
    keys = sorted(state)
    weight_map = {}
    for n, part in enumerate((keys[: len(keys) // 2], keys[len(keys) // 2:])):
        name = f"pytorch_model-0000{n + 1}-of-00002.bin"
        torch.save({k: state[k] for k in part}, shards / name)
        weight_map.update(dict.fromkeys(part, name))
    (shards / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    _same_checkpoint(from_hf(shards, tmp_path / "from_bin_shards"), ckpt)
    # sharded safetensors, as save_pretrained writes them
    sharded = tmp_path / "st_shards"
    ref.save_pretrained(sharded, max_shard_size="40KB")
    assert (sharded / "model.safetensors.index.json").is_file() and not (sharded / "model.safetensors").exists()
    for f in folder.glob("tokenizer*"):
        (sharded / f.name).write_bytes(f.read_bytes())
    _same_checkpoint(from_hf(sharded, tmp_path / "from_st_shards"), ckpt)


# ---------------------------------------------------------------------------------------------- errors
def test_an_unsupported_model_type_is_one_error_naming_it(converted, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    folder = _copy_folder(converted["gpt2"][2], tmp_path / "mamba", skip=())
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "mamba"}))
    assert main(["convert", "--from-hf", str(folder), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error:" in err and "'mamba' is not supported" in err
    assert all(t in err for t in ("gpt2", "llama", "mistral", "mixtral", "qwen2"))
    assert not (tmp_path / "out").exists()
    # a setting aiayn cannot represent is named
    (folder / "config.json").write_text(json.dumps({**config, "activation_function": "gelu_fast"}))
    with pytest.raises(AiaynError, match="activation_function='gelu_fast'"):
        from_hf(folder, tmp_path / "out")


def test_a_corrupt_or_incomplete_folder_is_one_error_naming_the_file(converted, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    folder = _copy_folder(converted["gpt2"][2], tmp_path / "hf", skip=())
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert main(["convert", "--from-hf", str(folder), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(weights) in err and "corrupt" in err
    (folder / "model.safetensors").write_bytes((converted["gpt2"][2] / "model.safetensors").read_bytes())
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "n_inner": FF + 8}))
    with pytest.raises(AiaynError, match=r"model\.safetensors: the weights do not fit config\.json .*ffn\.w_in"):
        from_hf(folder, tmp_path / "out")
    (folder / "config.json").write_text(json.dumps({**config, "n_layer": L + 1}))
    with pytest.raises(AiaynError, match=f"the weights lack 'h.{L}.ln_1.weight'"):
        from_hf(folder, tmp_path / "out")
    weights.unlink()
    with pytest.raises(AiaynError, match="no weights"):
        from_hf(folder, tmp_path / "out")
    (folder / "config.json").write_text("{ not json")
    with pytest.raises(AiaynError, match=r"config\.json:1: not valid JSON"):
        from_hf(folder, tmp_path / "out")
    with pytest.raises(AiaynError, match="no such folder"):
        from_hf(tmp_path / "absent", tmp_path / "out")


def test_damaged_tensor_bytes_are_named_as_a_damaged_file(converted, tmp_path: Path) -> None:
    """Bytes of a tensor changed into NaN or infinity: the conversion names the file and the tensor (not "the run
    diverged", which is about training)."""
    from safetensors.torch import save_file

    folder = _copy_folder(converted["llama"][2], tmp_path / "hf")
    state = load_file(str(converted["llama"][2] / "model.safetensors"))
    key = sorted(state)[3]
    state[key].view(-1)[5] = float("nan")
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(AiaynError, match=rf"model\.safetensors: tensor '{re.escape(key)}' holds NaN or infinite "
                                         r"values; the file is damaged: download it again"):
        from_hf(folder, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("family", FAMILIES)
def test_a_folder_without_tokenizer_files_is_refused_or_converted_weights_only(
        family: str, converted, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """No tokenizer files: one error saying so (never an empty tokenizer); with --no-tokenizer the weights convert,
    logits equal transformers', and a command that needs the tokenizer names what is missing."""
    ref, tok, folder, _ = converted[family]
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        if (folder / name).exists():
            (bare / name).write_bytes((folder / name).read_bytes())
    assert main(["convert", "--from-hf", str(bare), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no tokenizer files" in err and "--no-tokenizer" in err
    assert not (tmp_path / "out").exists()
    assert main(["convert", "--from-hf", str(bare), "--out", str(tmp_path / "out"), "--no-tokenizer"]) == 0
    assert "weights only" in capsys.readouterr().out
    pre = load_pretrained(tmp_path / "out", accel="none")
    ids, mask, positions = _batch(len(tok))
    with torch.no_grad():
        _close(pre.model(ids[:1]).logits, ref(input_ids=ids[:1]).logits)
    assert main(["generate", "--checkpoint", str(tmp_path / "out"), "--prompt", "hello", "--max-new-tokens", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no 'text' tokenizer" in err and "--no-tokenizer" in err


def test_a_tokenizer_of_another_model_is_refused(converted, tmp_path: Path) -> None:
    """Tokenizer files that contradict config.json (another model's, or a vocabulary far smaller than the
    embedding) are one error naming the mismatch."""
    folder = _copy_folder(converted["llama"][2], tmp_path / "hf", skip=())
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "eos_token_id": 7}))
    with pytest.raises(AiaynError, match=r"the tokenizer contradicts config\.json \(eos_token_id 7: the tokenizer's "
                                         r"EOS is \d+\)"):
        from_hf(folder, tmp_path / "out")
    (folder / "config.json").write_text(json.dumps({**config, "eos_token_id": [7, config["eos_token_id"]]}))
    assert from_hf(folder, tmp_path / "out").is_dir()  # one of a list of EOS ids (as Llama 3 lists them)
    small = _copy_folder(converted["llama"][2], tmp_path / "small", skip=())
    (small / "config.json").write_text(json.dumps({**config, "vocab_size": 4 * config["vocab_size"]}))
    state = load_file(str(small / "model.safetensors"))
    for key in ("model.embed_tokens.weight", "lm_head.weight"):
        if key in state:
            state[key] = torch.cat([state[key]] * 4)
    from safetensors.torch import save_file

    save_file(state, str(small / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(AiaynError, match=r"tokens for a model of \d+ embedding rows; the tokenizer files are of "
                                         "another model"):
        from_hf(small, tmp_path / "out2")


def test_a_hub_name_offline_says_so_and_how_to_fix_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf_home" / "hub"))
    with pytest.raises(AiaynError) as e:
        from_hf("no-such-owner/no-such-model", tmp_path / "out")
    message = str(e.value)
    assert "not found in the local Hugging Face cache" in message and "could not be reached" in message
    assert "pass the folder's path" in message


def test_mixtral_settings_aiayn_cannot_hold_are_named(tmp_path: Path) -> None:
    from aiayn.hf.family import FAMILIES, family_for_hf

    mixtral = family_for_hf({"model_type": "mixtral"})
    with pytest.raises(AiaynError, match="num_experts_per_tok=1"):
        mixtral.config_from_hf({"model_type": "mixtral", "num_experts_per_tok": 1})
    with pytest.raises(AiaynError, match="router_jitter_noise"):
        mixtral.config_from_hf({"model_type": "mixtral", "router_jitter_noise": 0.1})
    moe = ModelConfig(**{**AIAYN_MODELS["mixtral"], "vocab_size": 20, "d_model": D, "n_heads": H, "n_layers": L})
    with pytest.raises(AiaynError, match="ffn='moe': LLaMA has 'dense'"):
        FAMILIES["llama"].config_to_hf(moe, {})
    with pytest.raises(AiaynError, match="moe_top_k=1"):
        mixtral.config_to_hf(ModelConfig(**{**moe.to_dict(), "moe_top_k": 1}), {})


class _HubHandler(http.server.BaseHTTPRequestHandler):
    """A local stand-in for the Hugging Face Hub: the model-info API and file downloads of one repository."""

    repo, sha, files = "", "0" * 40, {}  # type: ignore[var-annotated]
    requests: list[str] = []

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _file(self) -> bytes | None:
        prefix = f"/{self.repo}/resolve/"
        path = self.path.split("?")[0]
        if not path.startswith(prefix):
            return None
        name = path[len(prefix):].split("/", 1)[1]
        return self.files.get(name)

    def _send(self, body: bytes, content_type: str, head: bool, **headers: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _answer(self, head: bool) -> None:
        type(self).requests.append(f"{self.command} {self.path}")
        path = self.path.split("?")[0]
        if path.startswith(f"/api/models/{self.repo}/tree/"):  # the file listing
            tree = [{"type": "file", "path": f, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                    for f, b in sorted(self.files.items())]
            self._send(json.dumps(tree).encode(), "application/json", head)
            return
        if path.startswith(f"/api/models/{self.repo}"):  # the model's information
            info = {"id": self.repo, "sha": self.sha, "siblings": [{"rfilename": f} for f in sorted(self.files)]}
            self._send(json.dumps(info).encode(), "application/json", head)
            return
        body = self._file()
        if body is None:
            self.send_error(404)
            return
        etag = hashlib.sha256(body).hexdigest()
        self._send(body, "application/octet-stream", head, **{"X-Repo-Commit": self.sha, "ETag": f'"{etag}"'})

    def do_GET(self) -> None:  # noqa: N802
        self._answer(head=False)

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(head=True)


def test_a_hub_name_downloads_through_huggingface_hub(converted, tmp_path: Path) -> None:
    """``aiayn convert --from-hf OWNER/NAME`` fetches the folder with huggingface_hub (here from a local server given
    as HF_ENDPOINT) and converts it as the folder itself; a second conversion reads the local cache offline."""
    folder = converted["gpt2"][2]
    _HubHandler.repo, _HubHandler.sha = "tiny-org/tiny-gpt2", "a" * 40
    _HubHandler.files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    _HubHandler.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HubHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}",
           "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.pop("HF_HUB_OFFLINE", None)
    try:
        cmd = [sys.executable, "-m", "aiayn.cli.main", "convert", "--from-hf", "tiny-org/tiny-gpt2"]
        run = subprocess.run([*cmd, "--out", str(tmp_path / "out")], env=env, capture_output=True, text=True,
                             timeout=300)
        assert run.returncode == 0, run.stderr
        assert any("/resolve/" in r and "model.safetensors" in r for r in _HubHandler.requests)
    finally:
        server.shutdown()
    _same_checkpoint(tmp_path / "out", converted["gpt2"][3])
    offline = {**env, "HF_HUB_OFFLINE": "1"}  # the server is gone: the cache answers
    again = subprocess.run([*cmd, "--out", str(tmp_path / "again")], env=offline, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr
    _same_checkpoint(tmp_path / "again", converted["gpt2"][3])
