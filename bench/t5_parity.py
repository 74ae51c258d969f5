"""How far converted T5 logits are from transformers' at a real model's size: T5 v1.0 and v1.1 shaped as t5-small /
t5-v1_1-small (8 + 8 layers, 512 wide, 6 heads of 64, vocab 32,128), transformers' own random initialisation, the
same weights converted by ``aiayn.hf.from_hf``; teacher-forced logits of 2 sources x 20 tokens, 12 target tokens,
in float32, with the reference core (``accel none``) and accelerated. Prints the largest absolute difference, the
largest logit and their ratio.

    .venv/bin/python bench/t5_parity.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
import transformers

from aiayn.hf import from_hf
from aiayn.pretrained import load_pretrained


def measure(version: str) -> list[tuple[str, float, float]]:
    """(accel, max |difference|, max |logit|) for T5 ``version`` ("v1.0" or "v1.1")."""
    torch.manual_seed(0)
    v1_1 = version == "v1.1"
    cfg = transformers.T5Config(vocab_size=32128, d_model=512, d_kv=64, d_ff=1024 if v1_1 else 2048, num_layers=8,
                                num_decoder_layers=8, num_heads=6, dropout_rate=0.0, decoder_start_token_id=0,
                                pad_token_id=0, eos_token_id=1, feed_forward_proj="gated-gelu" if v1_1 else "relu",
                                tie_word_embeddings=not v1_1)
    cfg._attn_implementation = "eager"
    model = transformers.T5ForConditionalGeneration(cfg).eval()
    src = torch.randint(2, 32000, (2, 20))
    tgt = torch.randint(2, 32000, (2, 12))
    tgt[:, 0] = 0
    with torch.no_grad():
        want = model(input_ids=src, decoder_input_ids=tgt).logits
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(Path(tmp) / "hf")
        checkpoint = from_hf(Path(tmp) / "hf", Path(tmp) / "aiayn", tokenizer=False)
        for accel in ("none", "auto"):
            pre = load_pretrained(checkpoint, accel=accel)
            with torch.no_grad():
                got = pre.model(src, tgt).logits
            rows.append((accel, (got - want).abs().max().item(), want.abs().max().item()))
    return rows


def main() -> None:
    for version in ("v1.0", "v1.1"):
        for accel, diff, largest in measure(version):
            print(f"T5 {version} accel {accel:4s}: max |difference| {diff:.2e}, max |logit| {largest:.1f}, "
                  f"relative {diff / largest:.1e}")


if __name__ == "__main__":
    main()
