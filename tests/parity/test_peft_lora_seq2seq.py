"""LoRA adapters equal Hugging Face PEFT's on the encoder and encoder-decoder families: a tiny random BERT
classifier, T5 (v1.0 and v1.1), BART and Marian, converted to aiayn, adapted there (non-zero B, as if trained; the
BERT classifier's head trained too) and loaded in PEFT, and adapted in PEFT and loaded in aiayn, give the same logits
within 1e-5."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_hf_convert_seq2seq import _hf_load, _save, _source  # noqa: E402

from aiayn.hf import from_hf  # noqa: E402
from aiayn.hf.peft import load_peft, save_peft  # noqa: E402
from aiayn.nn.lora import add_lora, lora_layers, merge_lora  # noqa: E402
from aiayn.pretrained import load_pretrained  # noqa: E402

#: family -> (aiayn's converter family, transformers' modules to adapt in PEFT, PEFT's task type)
FAMILIES = {"bert-classifier": ("bert-classifier", ["query", "key", "value", "dense"], "SEQ_CLS"),
            "t5-v1.0": ("t5", ["q", "k", "v", "o", "wi", "wo"], "SEQ_2_SEQ_LM"),
            "t5-v1.1": ("t5", ["q", "v", "wi_0", "wi_1"], "SEQ_2_SEQ_LM"),
            "bart": ("bart", ["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"], "SEQ_2_SEQ_LM"),
            "marian": ("marian", ["q_proj", "v_proj", "fc1"], "SEQ_2_SEQ_LM")}


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path, object]]:
    out = {}
    for family in FAMILIES:
        root = tmp_path_factory.mktemp(family)
        _save(family, root / "hf")
        out[family] = (root / "hf", from_hf(root / "hf", root / "aiayn"),
                       transformers.AutoTokenizer.from_pretrained(str(root / "hf")))
    return out


def _logits(family: str, model: nn.Module, ids: Tensor, mask: Tensor, hf: bool) -> Tensor:
    """The model's logits for a right-padded batch (transformers' call or aiayn's)."""
    tgt = ids[:, :5].clone()
    tgt[:, 0] = 0
    with torch.no_grad():
        if family.startswith("bert"):
            return (model(input_ids=ids, attention_mask=mask.long()).logits if hf
                    else model(ids, is_token=mask, task="classify").logits)
        return (model(input_ids=ids, attention_mask=mask.long(), decoder_input_ids=tgt).logits if hf
                else model(ids, tgt).logits)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_an_adapter_trained_in_aiayn_loads_in_peft_with_the_same_logits(
        family: str, bases: dict, tmp_path: Path) -> None:
    folder, checkpoint, tok = bases[family]
    pre = load_pretrained(checkpoint, accel="none")
    model = pre.model
    trainable = ("cls_head",) if family.startswith("bert") else ()
    names = add_lora(model, rank=4, alpha=8, targets=["attention", "ffn"], trainable=trainable)
    assert any("cross_attn" in n for n in names) or family.startswith("bert")
    torch.manual_seed(2)
    with torch.no_grad():
        for layer in lora_layers(model).values():
            layer.lora_B.weight.normal_(0.0, 0.3)  # as if trained: a non-zero update
        for name, p in model.named_parameters():
            if name.startswith(trainable or ("-",)):
                p.add_(torch.randn_like(p) * 0.1)
    save_peft(model, pre.config, FAMILIES[family][0], tmp_path / "adapter")
    adapted = peft.PeftModel.from_pretrained(_hf_load(folder, family), str(tmp_path / "adapter")).eval()
    ids, mask = _source(tok, (9, 6, 3))
    want = _logits(family, adapted, ids, mask, hf=True)
    with adapted.disable_adapter():
        assert (want - _logits(family, adapted, ids, mask, hf=True)).abs().max() > 1e-2  # the adapter matters
    torch.testing.assert_close(_logits(family, model, ids, mask, hf=False), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_peft_adapter_loads_in_aiayn_with_the_same_logits_and_merges(
        family: str, bases: dict, tmp_path: Path) -> None:
    folder, checkpoint, tok = bases[family]
    converter, targets, task = FAMILIES[family]
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets, lora_dropout=0.0, task_type=task)
    adapted = peft.get_peft_model(_hf_load(folder, family), config).eval()
    torch.manual_seed(3)
    with torch.no_grad():
        for name, p in adapted.named_parameters():
            if "lora_B" in name or "modules_to_save" in name:
                p.add_(torch.randn_like(p) * 0.3)
    adapted.save_pretrained(str(tmp_path / "adapter"))
    pre = load_pretrained(checkpoint, accel="none")
    assert load_peft(pre.model, pre.config, converter, tmp_path / "adapter")
    ids, mask = _source(tok, (9, 6, 3))
    want = _logits(family, adapted, ids, mask, hf=True)
    torch.testing.assert_close(_logits(family, pre.model, ids, mask, hf=False), want, atol=1e-5, rtol=0)
    merged = merge_lora(pre.model)
    assert not lora_layers(merged)
    torch.testing.assert_close(_logits(family, merged, ids, mask, hf=False), want, atol=1e-5, rtol=0)
