"""Converted transformers models: conversion time and memory, then batch-1 greedy decoding against transformers.

A random transformers model is saved with ``save_pretrained``, converted with ``aiayn.hf.from_hf`` and loaded with
``load_pretrained`` (accelerated for decoding, as the ``aiayn generate`` command runs it). Both then decode the same
prompt greedily for the same number of new tokens (aiayn with no stop id, transformers with
``min_new_tokens == max_new_tokens``), alternating runs, with aiayn's ``--int8`` load of the same checkpoint; a row
gives the median tokens/s of each, the ratios to transformers, whether the fp32 tokens are the same, and each
figure as a fraction of the host's memory-bandwidth limit: tokens/s over the read bandwidth (``roofline.py``) divided
by the bytes of weights a step reads at their stored width. The families (``--families``):

- ``gpt2``: ``GPT2LMHeadModel(GPT2Config())``, GPT-2 small (124M parameters, GELU tanh as GPT-2 has it);
- ``llama``: a LLaMA-architecture model of about that size (12 x 768, 12 query and 4 key/value heads, SwiGLU 2048,
  RMSNorm, RoPE, vocabulary 32000);
- ``mistral``: the same with a sliding window of 32 positions, shorter than prompt + new tokens, so that aiayn decodes
  with its rolling cache.

    .venv/bin/python bench/converted_gpt2.py             # all three, 16-token prompt, 64 new tokens, 5 runs
    .venv/bin/python bench/converted_gpt2.py --quick     # 2 layers x 128, 16 new tokens, 2 runs
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
import roofline  # noqa: E402

from aiayn.generate import generate  # noqa: E402
from aiayn.hf import from_hf, to_hf  # noqa: E402
from aiayn.pretrained import load_pretrained  # noqa: E402

COLUMNS = ["model", "from_hf_s", "to_hf_s", "peak_rss_gib", "prompt", "new_tokens", "aiayn_tok_s", "hf_tok_s",
           "ratio_vs_hf", "same_tokens", "int8_tok_s", "int8_ratio_vs_hf", "fraction_of_bound",
           "int8_fraction_of_bound", "hf_fraction_of_bound"]


FAMILIES = ("gpt2", "llama", "mistral")


def family_config(family: str, quick: bool) -> Any:
    """The transformers config of ``family`` (see the module docstring); ``quick``: 2 layers x 128."""
    from transformers import GPT2Config, LlamaConfig, MistralConfig

    if family == "gpt2":
        if quick:
            return GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000, n_positions=128, bos_token_id=999,
                              eos_token_id=999)
        return GPT2Config()
    size = (dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1000) if quick else
            dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                 num_key_value_heads=4, vocab_size=32000))
    if family == "llama":
        return LlamaConfig(**size, max_position_embeddings=512, bos_token_id=1, eos_token_id=2)
    return MistralConfig(**size, max_position_embeddings=512, sliding_window=32, bos_token_id=1, eos_token_id=2)


def save_word_tokenizer(folder: Path, vocab_size: int, bos_id: int, eos_id: int) -> None:
    """A word-level tokenizer of ``vocab_size`` words ``w0 .. wN`` (BOS and EOS at their ids) saved into ``folder`` as
    transformers saves one (``tokenizer.json`` and its config), so that the folder converts as a released one."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0", bos_token=f"w{bos_id}",
                            eos_token=f"w{eos_id}").save_pretrained(folder)


def bench_converted(hf_config: Any, prompt_len: int, new_tokens: int, runs: int, folder: Path,
                    read_gb_s: float) -> dict[str, Any]:
    """Convert a random transformers model of ``hf_config`` under ``folder`` and time batch-1 greedy decoding, fp32
    and ``--int8``, each also as a fraction of the bound that reading its weights at ``read_gb_s`` sets; one result
    row."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(hf_config).eval()
    hf.save_pretrained(folder / "hf")
    save_word_tokenizer(folder / "hf", hf_config.vocab_size, hf_config.bos_token_id, hf_config.eos_token_id)
    t0 = time.perf_counter()
    from_hf(folder / "hf", folder / "aiayn")
    t1 = time.perf_counter()
    to_hf(folder / "aiayn", folder / "hf-again")
    t2 = time.perf_counter()
    ours = load_pretrained(folder / "aiayn").model
    ours8 = load_pretrained(folder / "aiayn", int8=True).model
    eos = hf_config.eos_token_id
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, hf_config.vocab_size, (1, prompt_len), generator=g)
    prompt[prompt == eos] = 0
    out: dict[str, Any] = {}

    def run_ours() -> None:
        out["aiayn"] = generate(ours, prompt.tolist(), max_new_tokens=new_tokens, greedy=True, stop_ids=(),
                                pad_id=eos)

    def run_int8() -> None:
        out["int8"] = generate(ours8, prompt.tolist(), max_new_tokens=new_tokens, greedy=True, stop_ids=(),
                               pad_id=eos)

    def run_hf() -> None:
        with torch.inference_mode():
            out["hf"] = hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, num_beams=1,
                                    max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=eos)

    times = benchlib.alternate({"aiayn": run_ours, "aiayn int8": run_int8, "transformers": run_hf}, runs=runs,
                               warmup=1)
    t_ours, t_hf = benchlib.median(times["aiayn"]), benchlib.median(times["transformers"])
    t_int8 = benchlib.median(times["aiayn int8"])
    # tokens/s over the most that reading each step's weights allows (roofline.py; transformers reads fp32 weights)
    bound = {name: read_gb_s * 1e9 / roofline.weight_bytes_per_token(m) for name, m in (("fp32", ours),
                                                                                          ("int8", ours8))}
    hf_bytes = sum(p.numel() * p.element_size() for n, p in hf.named_parameters()
                   if p.dim() == 2 and not any(e in n for e in ("wte", "wpe", "embed_tokens", "lm_head")))
    head = hf.get_output_embeddings().weight  # read whole each step, tied to the embedding or not
    hf_bound = read_gb_s * 1e9 / (hf_bytes + head.numel() * head.element_size())
    got, want = out["aiayn"][0], out["hf"][0, prompt_len:].tolist()
    if len(got) != len(want):
        raise RuntimeError(f"output lengths differ: {len(got)} vs {len(want)}")
    n_params = sum(p.numel() for p in hf.parameters())
    window = getattr(hf_config, "sliding_window", None)
    name = f"{type(hf).__name__.removesuffix('ForCausalLM').removesuffix('LMHeadModel')} " \
        f"{hf_config.num_hidden_layers}x{hf_config.hidden_size} ({n_params / 1e6:.0f}M)" \
        + (f", window {window}" if window else "")
    return {"model": name,
            "from_hf_s": t1 - t0, "to_hf_s": t2 - t1, "peak_rss_gib": benchlib.peak_rss_mb() / 1024,
            "prompt": prompt_len, "new_tokens": new_tokens, "aiayn_tok_s": new_tokens / t_ours,
            "hf_tok_s": new_tokens / t_hf, "ratio_vs_hf": t_hf / t_ours,
            "same_tokens": sum(a == b for a, b in zip(got, want)) / len(want),
            "int8_tok_s": new_tokens / t_int8, "int8_ratio_vs_hf": t_hf / t_int8,
            "fraction_of_bound": new_tokens / t_ours / bound["fp32"],
            "int8_fraction_of_bound": new_tokens / t_int8 / bound["int8"],
            "hf_fraction_of_bound": new_tokens / t_hf / hf_bound, "read_gb_s": read_gb_s}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """CLI entry point: run, print the rows, write ``bench/results/converted_gpt2.json``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    benchlib.add_common_args(p)
    p.add_argument("--new-tokens", type=int, default=None)
    p.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    args = p.parse_args(argv)
    benchlib.setup(args.threads)
    t0 = time.perf_counter()
    runs, new = (args.runs or 2, args.new_tokens or 16) if args.quick else (args.runs or 5, args.new_tokens or 64)
    read_gb_s = roofline.read_bandwidth(runs, 1 << 26 if args.quick else roofline.SUM_BYTES) / 1e9
    rows = []
    for family in args.families:
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(bench_converted(family_config(family, args.quick), 16, new, runs, Path(tmp), read_gb_s))
    payload = {"rows": rows, "runs": runs, "threads": args.threads, "wall_s": time.perf_counter() - t0}
    print(f"converted models, batch-1 greedy, median of {runs} alternating runs")
    benchlib.report("converted_gpt2", payload, COLUMNS, args.quick)
    return payload


if __name__ == "__main__":
    main()
