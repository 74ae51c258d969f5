"""``[train] adapter = "lora"``: a recipe fine-tunes a converted GPT-2 through LoRA adapters only, its checkpoints
load merged for decoding and export to transformers, and a resumed adapter run equals an uninterrupted one."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_finetune_converted import (  # noqa: E402, F401 (fixtures)
    _classification_recipe,
    _final_val,
    _lm_recipe,
    _translation_recipe,
    converted,
    one_thread,
)

from aiayn.checkpoint import read_state_dict  # noqa: E402
from aiayn.cli.main import main  # noqa: E402
from aiayn.errors import AiaynError  # noqa: E402
from aiayn.hf import to_hf  # noqa: E402
from aiayn.pretrained import load_pretrained, merge_adapter  # noqa: E402
from aiayn.tasks.lm import LMTask  # noqa: E402
from aiayn.tasks.registry import run_recipe  # noqa: E402
from aiayn.train.recipe import load_recipe  # noqa: E402

LORA = 'adapter = "lora"\nlora_rank = 4\nlora_alpha = 8.0\nlora_targets = ["attention", "ffn"]\n'


def test_a_lora_run_trains_only_its_adapters_and_loads_merged(tmp_path: Path, converted: dict[str, Path],  # noqa: F811
                                                               capsys: pytest.CaptureFixture) -> None:
    base = converted["gpt2"]
    recipe = _lm_recipe(tmp_path, base, name="lora", steps=6, lr=1e-2, train=LORA)
    before = LMTask(load_recipe(recipe)).evaluate()["loss"]
    run_recipe(recipe, [])
    said = capsys.readouterr()
    assert "LoRA: rank 4 adapters on 8 layers;" in said.out + said.err
    assert _final_val(tmp_path / "lora") < before - 0.02
    last = tmp_path / "lora" / "last"
    saved = load_pretrained(last)
    entry = saved.meta["adapter"]
    assert entry["kind"] == "lora" and len(entry["layers"]) == 8
    assert entry["base"]["checkpoint"] == str(base.resolve()) and len(entry["base"]["manifest_sha256"]) == 64
    own = read_state_dict(last)  # the adapters alone: the base is read from where the entry says
    assert own and all(".lora_A." in k or ".lora_B." in k for k in own)
    assert (last / "model.safetensors").stat().st_size < (base / "model.safetensors").stat().st_size / 4
    plain, merged = read_state_dict(base), saved.model.state_dict()
    adapted = tuple(entry["layers"])
    for key, value in plain.items():
        changed = not torch.equal(merged[key], value)
        assert changed == (key.endswith(".weight") and key.removesuffix(".weight") in adapted), key
    ids = torch.tensor([[5, 9, 12, 7, 3]])
    unmerged = load_pretrained(last, accel="none", merge=False)
    with torch.no_grad():  # the adapters apart give what they give folded in
        torch.testing.assert_close(unmerged.model(ids).logits, saved.model(ids).logits, atol=1e-5, rtol=1e-5)
    assert main(["merge-adapter", "--checkpoint", str(last), "--out", str(tmp_path / "merged")]) == 0
    plain_again = load_pretrained(tmp_path / "merged")
    assert "adapter" not in plain_again.meta and not any(".lora_" in k for k in read_state_dict(tmp_path / "merged"))
    with torch.no_grad():
        torch.testing.assert_close(plain_again.model(ids).logits, saved.model(ids).logits, atol=1e-6, rtol=1e-6)
    with pytest.raises(AiaynError, match="has no LoRA adapters"):
        merge_adapter(tmp_path / "merged", tmp_path / "merged-twice")
    hf_dir = to_hf(last, tmp_path / "hf", merged=True)
    hf = transformers.GPT2LMHeadModel.from_pretrained(hf_dir).eval()
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=ids).logits, saved.model(ids).logits, atol=1e-4, rtol=1e-4)


def test_an_adapter_checkpoint_goes_to_peft_and_back_and_decodes_on_its_base(
        tmp_path: Path, converted: dict[str, Path], capsys: pytest.CaptureFixture) -> None:  # noqa: F811
    peft = pytest.importorskip("peft")
    base = converted["gpt2"]
    run_recipe(_lm_recipe(tmp_path, base, name="lora", steps=4, lr=1e-2, train=LORA), [])
    last = tmp_path / "lora" / "last"
    ids = torch.tensor([[5, 9, 12, 7, 3]])
    want = load_pretrained(last).model(ids).logits.detach()
    assert main(["convert", "--to-hf", str(last), "--out", str(tmp_path / "peft")]) == 0
    assert "wrote the PEFT adapter folder" in capsys.readouterr().out
    hf_base = transformers.GPT2LMHeadModel.from_pretrained(to_hf(base, tmp_path / "hf-base")).eval()
    in_peft = peft.PeftModel.from_pretrained(hf_base, str(tmp_path / "peft")).eval()
    with torch.no_grad():
        torch.testing.assert_close(in_peft(input_ids=ids).logits, want, atol=1e-5, rtol=1e-5)
    assert main(["convert", "--from-hf", str(tmp_path / "peft"), "--base", str(base), "--out",
                 str(tmp_path / "back")]) == 0
    back = load_pretrained(tmp_path / "back")
    torch.testing.assert_close(back.model(ids).logits.detach(), want, atol=1e-5, rtol=1e-5)
    capsys.readouterr()
    assert main(["convert", "--from-hf", str(tmp_path / "peft"), "--out", str(tmp_path / "nobase")]) == 2
    assert "name the aiayn checkpoint of the model it adapts with --base" in capsys.readouterr().err
    # --adapter on a decoding command: the same tokens as the adapter checkpoint alone
    common = ["--prompt", "the dog", "--greedy", "--max-new-tokens", "8"]
    assert main(["generate", "--checkpoint", str(last), *common]) == 0
    alone = capsys.readouterr().out
    assert main(["generate", "--checkpoint", str(base), "--adapter", str(last), *common]) == 0
    assert capsys.readouterr().out == alone
    with pytest.raises(AiaynError, match="a PEFT adapter folder; make it an aiayn adapter checkpoint first"):
        load_pretrained(base, adapter=tmp_path / "peft")


def test_an_adapter_on_a_moved_missing_or_other_base_is_one_error(tmp_path: Path,
                                                                   converted: dict[str, Path]) -> None:  # noqa: F811
    shutil.copytree(converted["gpt2"], tmp_path / "base")
    run_recipe(_lm_recipe(tmp_path, tmp_path / "base", name="lora", steps=2, lr=1e-2, train=LORA), [])
    last = tmp_path / "lora" / "last"
    want = load_pretrained(last).model(torch.tensor([[5, 9, 12]])).logits.detach()
    (tmp_path / "base").rename(tmp_path / "moved")
    with pytest.raises(AiaynError, match=r"adapt the base checkpoint .*base, which is not there; pass the base's new"):
        load_pretrained(last)
    moved = load_pretrained(tmp_path / "moved", adapter=last)
    torch.testing.assert_close(moved.model(torch.tensor([[5, 9, 12]])).logits.detach(), want)
    assert main(["merge-adapter", "--checkpoint", str(last), "--base", str(tmp_path / "moved"), "--out",
                 str(tmp_path / "merged")]) == 0
    with pytest.raises(AiaynError, match="trained on a base whose manifest.json has SHA-256 .* another model"):
        load_pretrained(tmp_path / "merged", adapter=last)
    with pytest.raises(AiaynError, match="has no LoRA adapters .* --adapter takes the checkpoint of a run"):
        load_pretrained(tmp_path / "moved", adapter=tmp_path / "merged")


def test_a_resumed_lora_run_equals_an_uninterrupted_one(tmp_path: Path,
                                                        converted: dict[str, Path]) -> None:  # noqa: F811
    base = converted["gpt2"]
    straight = _lm_recipe(tmp_path, base, name="straight", steps=6, lr=1e-2, train=LORA)
    stopped = _lm_recipe(tmp_path, base, name="stopped", steps=6, lr=1e-2, train=LORA)
    run_recipe(straight, [])
    run_recipe(stopped, ["train.max_steps=3"])
    run_recipe(stopped, [], resume=True)
    a, b = read_state_dict(tmp_path / "straight" / "last"), read_state_dict(tmp_path / "stopped" / "last")
    assert a.keys() == b.keys() and any(".lora_B." in k for k in a)
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("family", ["bart", "bert"])
def test_lora_runs_of_a_translation_model_and_a_classifier_load_in_peft_with_their_logits(
        family: str, tmp_path: Path, converted: dict[str, Path]) -> None:  # noqa: F811
    peft = pytest.importorskip("peft")
    make = _translation_recipe if family == "bart" else _classification_recipe
    head = 'lora_trainable = ["cls_head"]\n' if family == "bert" else ""
    run_recipe(make(tmp_path, converted[family], name="lora", steps=3, lr=1e-2, train=LORA + head), [])
    last = tmp_path / "lora" / "last"
    saved = load_pretrained(last, accel="none", merge=False)  # as PEFT computes: the adapters apart
    own = read_state_dict(last)
    assert any(k.startswith("cls_head.") for k in own) == (family == "bert")
    assert all(".lora_" in k or k.startswith("cls_head.") for k in own)
    to_hf(last, tmp_path / "peft")
    hf_cls = transformers.BartForConditionalGeneration if family == "bart" else \
        transformers.BertForSequenceClassification
    hf = peft.PeftModel.from_pretrained(hf_cls.from_pretrained(converted[f"{family}-hf"]), str(tmp_path / "peft"))
    ids = torch.tensor([[0, 5, 9, 12, 7, 2]]) if family == "bart" else torch.tensor([[3, 8, 9, 12, 7, 4]])
    with torch.no_grad():
        if family == "bart":
            tgt = torch.tensor([[2, 0, 7, 9]])
            want, got = hf.eval()(input_ids=ids, decoder_input_ids=tgt).logits, saved.model(ids, tgt).logits
        else:
            want, got = hf.eval()(input_ids=ids).logits, saved.model(ids, task="classify").logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_lora_targets_that_match_nothing_are_one_error(tmp_path: Path,
                                                       converted: dict[str, Path]) -> None:  # noqa: F811
    recipe = _lm_recipe(tmp_path, converted["gpt2"], name="bad", steps=2,
                        train='adapter = "lora"\nlora_targets = ["c_attn"]\n')
    with pytest.raises(AiaynError, match=r"\[train\] lora_targets: no linear layer matches.*qkv_proj"):
        run_recipe(recipe, [])
    with pytest.raises(AiaynError, match=r"\[train\] lora_rank: a LoRA rank of 999 does not fit"):
        run_recipe(_lm_recipe(tmp_path, converted["gpt2"], name="bad-rank", steps=2,
                              train='adapter = "lora"\nlora_rank = 999\n'), [])
    with pytest.raises(AiaynError, match="adapter"):
        run_recipe(_lm_recipe(tmp_path, converted["gpt2"], name="bad2", steps=2, train='adapter = "dora"\n'), [])
