"""LoRA adapters equal Hugging Face PEFT's: trained-looking adapters (random, non-zero B) put on a tiny random
GPT-2, LLaMA and Qwen2 in aiayn and loaded in PEFT, and the other way round, give the same logits; merging equals
the unmerged adapter; an adapter for another base is one clear error."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_hf_convert import HF_CLASSES, _eager, _hf_config  # noqa: E402

from aiayn import AiaynError  # noqa: E402
from aiayn.hf import from_hf  # noqa: E402
from aiayn.hf.peft import load_peft, save_peft  # noqa: E402
from aiayn.nn.lora import add_lora, lora_layers, merge_lora  # noqa: E402
from aiayn.pretrained import load_pretrained  # noqa: E402

VOCAB = 97
TARGETS = {"gpt2": ["c_attn", "c_proj", "c_fc"],
           "llama": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
           "qwen2": ["q_proj", "k_proj", "v_proj", "o_proj"]}


def _base(family: str, folder: Path) -> tuple[torch.nn.Module, Path]:
    """A random transformers model saved in ``folder`` (weights only) and its aiayn conversion."""
    cfg = _eager(_hf_config(family, VOCAB, 1, 2))
    torch.manual_seed(0)
    model = getattr(transformers, HF_CLASSES[family])(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    model.save_pretrained(folder / "hf")
    return model, from_hf(folder / "hf", folder / "aiayn", tokenizer=False)


def _ids() -> torch.Tensor:
    return torch.randint(3, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("family", list(TARGETS))
def test_an_adapter_trained_in_aiayn_loads_in_peft_with_the_same_logits(family: str, tmp_path: Path) -> None:
    hf, checkpoint = _base(family, tmp_path)
    pre = load_pretrained(checkpoint, accel="none")
    model = pre.model
    targets = ["attention", "ffn"] if family != "qwen2" else ["attention"]
    add_lora(model, rank=4, alpha=8, targets=targets)
    torch.manual_seed(2)
    with torch.no_grad():
        for layer in lora_layers(model).values():
            layer.lora_B.weight.normal_(0.0, 0.3)  # as if trained: a non-zero update
    save_peft(model, pre.config, family, tmp_path / "adapter")
    adapted = peft.PeftModel.from_pretrained(hf, str(tmp_path / "adapter")).eval()
    ids = _ids()
    with torch.no_grad():
        want = adapted(input_ids=ids).logits
        got = model(ids).logits
        with adapted.disable_adapter():
            assert (want - adapted(input_ids=ids).logits).abs().max() > 1e-2  # the adapter matters
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", list(TARGETS))
def test_a_peft_adapter_loads_in_aiayn_with_the_same_logits_and_merges(family: str, tmp_path: Path) -> None:
    hf, checkpoint = _base(family, tmp_path)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS[family], lora_dropout=0.0,
                             fan_in_fan_out=family == "gpt2", task_type="CAUSAL_LM")
    adapted = peft.get_peft_model(hf, config).eval()
    torch.manual_seed(3)
    with torch.no_grad():
        for name, p in adapted.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.3)
    adapted.save_pretrained(str(tmp_path / "adapter"))
    pre = load_pretrained(checkpoint, accel="none")
    names = load_peft(pre.model, pre.config, family, tmp_path / "adapter")
    assert names
    ids = _ids()
    with torch.no_grad():
        want = adapted(input_ids=ids).logits
        got = pre.model(ids).logits
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        merged = merge_lora(pre.model)
        assert not lora_layers(merged)
        torch.testing.assert_close(merged(ids).logits, want, atol=1e-5, rtol=1e-5)


def test_an_adapter_for_another_base_or_without_a_match_is_one_error(tmp_path: Path) -> None:
    hf, checkpoint = _base("llama", tmp_path)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj"], task_type="CAUSAL_LM")
    peft.get_peft_model(hf, config).save_pretrained(str(tmp_path / "adapter"))
    small = load_pretrained(checkpoint, accel="none")
    with pytest.raises(AiaynError, match="peft_type"):
        (tmp_path / "adapter" / "adapter_config.json").write_text('{"peft_type": "IA3"}')
        load_peft(small.model, small.config, "llama", tmp_path / "adapter")
    hf2, checkpoint2 = _base("gpt2", tmp_path / "other")
    config2 = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], fan_in_fan_out=True, task_type="CAUSAL_LM")
    peft.get_peft_model(hf2, config2).save_pretrained(str(tmp_path / "gpt2-adapter"))
    with pytest.raises(AiaynError, match="does not map"):
        load_peft(small.model, small.config, "llama", tmp_path / "gpt2-adapter")
    with pytest.raises(ValueError, match="no linear layer matches the LoRA targets"):
        add_lora(small.model, targets=["c_attn"])
