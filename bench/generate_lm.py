"""Decoder-only greedy generation speed: aiayn ``generate`` vs transformers ``GPT2LMHeadModel.generate``.

Same GPT-2-like architecture (pre-LN, learned positions, GELU, tied embeddings), the same weights (copied from
the HF model into aiayn), the same prompts and exactly the same number of new tokens: aiayn runs with no stop
id, HF with ``min_new_tokens == max_new_tokens``. Runs alternate; we report the median tokens/s and the ratio.
aiayn's contenders are the models ``load_pretrained`` gives users: accelerated for decoding
(:func:`aiayn.accel.accelerate`; ``AIAYN_ACCEL=none`` in the environment times the reference instead).
A third contender is aiayn's opt-in int8 inference (:func:`aiayn.accel.quantize_int8`, ``--int8`` on the command
line) on the same weights: its ratio is against transformers in fp32, and ``int8_same_tokens`` is the fraction of its
greedy tokens equal to the fp32 model's. A fourth timed entry, ``matmul-floor``, runs only the model's linear
layers for the same number of steps (:func:`benchlib.matmul_floor`); ``fp32_bound_vs_hf`` = transformers' time /
that floor is the most any fp32 implementation of these matmuls could gain over transformers.
In bf16, aiayn's ``--dtype bfloat16`` (``aiayn.nn.precision.cast_for_inference``: the whole model in bf16, then
accelerated: every linear layer prepacked for oneDNN's bf16 kernels) runs against ``GPT2LMHeadModel`` cast to bf16,
same weights: ``bf16_ratio_vs_hf_bf16``; ``bf16_same_tokens`` is the fraction of its greedy tokens equal to aiayn's
fp32 ones.

    .venv/bin/python bench/generate_lm.py            # 6 layers x 384, batch 1 and 16, 16 + 128 tokens
    .venv/bin/python bench/generate_lm.py --quick
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

from aiayn import ModelConfig, build_model  # noqa: E402
from aiayn.generate import generate  # noqa: E402
from aiayn.models import DecoderModel  # noqa: E402


@dataclass
class LMSize:
    """Shape of the benchmarked decoder (GPT-2-like)."""

    n_layers: int = 6
    d_model: int = 384
    n_heads: int = 6
    vocab_size: int = 50257
    max_len: int = 1024


def build_pair(size: LMSize, seed: int = 0, variant: str | None = "float32") -> tuple[DecoderModel, Any]:
    """A random HF GPT-2 and an aiayn decoder holding the same weights, both in eval mode; the aiayn one as
    ``load_pretrained`` gives it for decoding in ``variant`` (:func:`benchlib.for_decoding`: accelerated, int8 or
    bf16), or with ``variant`` None the reference core's modules."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    hf_cfg = GPT2Config(vocab_size=size.vocab_size, n_positions=size.max_len, n_embd=size.d_model,
                        n_layer=size.n_layers, n_head=size.n_heads, activation_function="gelu",
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, pad_token_id=size.vocab_size - 1,
                        eos_token_id=size.vocab_size - 1, bos_token_id=size.vocab_size - 1)
    hf = GPT2LMHeadModel(hf_cfg).eval()
    cfg = ModelConfig.preset("gpt2-small", n_layers=size.n_layers, d_model=size.d_model, n_heads=size.n_heads,
                             d_ff=4 * size.d_model, vocab_size=size.vocab_size, max_len=size.max_len,
                             dropout=0.0, norm_eps=hf_cfg.layer_norm_epsilon, **benchlib.exact_gelu())
    ours = build_model(cfg).eval()
    copy_gpt2_weights(hf, ours)
    if variant is not None:
        ours = benchlib.for_decoding(ours, variant)
    return ours, hf  # type: ignore[return-value]


@torch.no_grad()
def copy_gpt2_weights(hf: Any, ours: DecoderModel) -> None:
    """Copy a ``GPT2LMHeadModel``'s weights into an aiayn decoder (Conv1D weights are transposed)."""
    t = hf.transformer
    ours.embed.weight.copy_(t.wte.weight)
    ours.decoder.abs_pos.weight.weight.copy_(t.wpe.weight)
    for blk, layer in zip(t.h, ours.decoder.layers):
        pairs = [(blk.attn.c_attn, layer.self_attn.qkv_proj), (blk.attn.c_proj, layer.self_attn.out_proj),
                 (blk.mlp.c_fc, layer.ffn.w_in), (blk.mlp.c_proj, layer.ffn.w_out)]
        for conv, lin in pairs:
            lin.weight.copy_(conv.weight.t())
            lin.bias.copy_(conv.bias)
        for ln, norm in ((blk.ln_1, layer.self_res.norm), (blk.ln_2, layer.ffn_res.norm)):
            norm.weight.copy_(ln.weight)
            norm.bias.copy_(ln.bias)
    ours.decoder.final_norm.weight.copy_(t.ln_f.weight)
    ours.decoder.final_norm.bias.copy_(t.ln_f.bias)


def run_case(ours: DecoderModel, ours_int8: Any, hf: Any, batch: int, prompt_len: int, new_tokens: int, runs: int,
             warmup: int = 1, ours_bf16: DecoderModel | None = None, hf_bf16: Any = None) -> dict[str, Any]:
    """Time the generators on one (batch, prompt, new tokens) case; returns one result row.

    The bf16 pair (``ours_bf16``, ``hf_bf16``) is timed only when both are given."""
    vocab = ours.config.vocab_size
    g = torch.Generator().manual_seed(batch)
    prompts = torch.randint(5, vocab - 1, (batch, prompt_len), generator=g)
    attn = torch.ones_like(prompts)
    prompt_lists = prompts.tolist()
    out: dict[str, Any] = {}

    def run_ours() -> None:
        out["ours"] = generate(ours, prompt_lists, max_new_tokens=new_tokens, greedy=True, stop_ids=(),
                               pad_id=0)

    def run_ours_int8() -> None:
        out["int8"] = generate(ours_int8, prompt_lists, max_new_tokens=new_tokens, greedy=True, stop_ids=(),
                               pad_id=0)

    def hf_runner(model: Any, key: str) -> Any:
        def run_hf() -> None:
            with torch.inference_mode():
                out[key] = model.generate(prompts, attention_mask=attn, do_sample=False, num_beams=1,
                                          max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                          pad_token_id=vocab - 1)
        return run_hf

    def run_ours_bf16() -> None:
        out["bf16"] = generate(ours_bf16, prompt_lists, max_new_tokens=new_tokens, greedy=True, stop_ids=(),
                               pad_id=0)

    floor = benchlib.matmul_floor(benchlib.step_linears(ours), batch, new_tokens)
    fns = {"aiayn": run_ours, "aiayn-int8": run_ours_int8, "transformers": hf_runner(hf, "hf"), "matmul-floor": floor}
    bf16 = ours_bf16 is not None and hf_bf16 is not None
    if bf16:
        fns |= {"aiayn-bf16": run_ours_bf16, "transformers-bf16": hf_runner(hf_bf16, "hf-bf16")}
    times = benchlib.alternate(fns, runs=runs, warmup=warmup)
    ours_tokens = torch.tensor(out["ours"])
    hf_tokens = out["hf"][:, prompt_len:]
    if ours_tokens.shape != hf_tokens.shape:
        raise RuntimeError(f"output lengths differ: {tuple(ours_tokens.shape)} vs {tuple(hf_tokens.shape)}")
    t_ours, t_hf = benchlib.median(times["aiayn"]), benchlib.median(times["transformers"])
    t_int8, t_floor = benchlib.median(times["aiayn-int8"]), benchlib.median(times["matmul-floor"])
    n = batch * new_tokens
    nan = float("nan")
    t_bf16 = benchlib.median(times["aiayn-bf16"]) if bf16 else nan
    t_hf_bf16 = benchlib.median(times["transformers-bf16"]) if bf16 else nan
    return {
        "batch": batch, "prompt": prompt_len, "new_tokens": new_tokens,
        "aiayn_tok_s": n / t_ours, "hf_tok_s": n / t_hf, "ratio_vs_hf": t_hf / t_ours,
        "aiayn_ms_per_step": 1e3 * t_ours / new_tokens, "hf_ms_per_step": 1e3 * t_hf / new_tokens,
        "same_tokens": float((ours_tokens == hf_tokens).float().mean()),
        "aiayn_int8_tok_s": n / t_int8, "int8_ratio_vs_hf": t_hf / t_int8,
        "int8_same_tokens": float((torch.tensor(out["int8"]) == ours_tokens).float().mean()),
        "floor_ms_per_step": 1e3 * t_floor / new_tokens, "fp32_bound_vs_hf": t_hf / t_floor,
        "aiayn_bf16_tok_s": n / t_bf16, "hf_bf16_tok_s": n / t_hf_bf16, "bf16_ratio_vs_hf_bf16": t_hf_bf16 / t_bf16,
        "bf16_ratio_vs_hf": t_hf / t_bf16,
        "bf16_same_tokens": float((torch.tensor(out["bf16"]) == ours_tokens).float().mean()) if bf16 else nan,
        "times_aiayn": times["aiayn"], "times_aiayn_int8": times["aiayn-int8"], "times_hf": times["transformers"],
        "times_floor": times["matmul-floor"], "times_aiayn_bf16": times.get("aiayn-bf16", []),
        "times_hf_bf16": times.get("transformers-bf16", []),
    }


def bench_generate(size: LMSize | None = None, batches: tuple[int, ...] = (1, 16), prompt_len: int = 16,
                   new_tokens: int = 128, runs: int = 5, warmup: int = 1, bf16: bool = True) -> dict[str, Any]:
    """The whole benchmark: build the pair once, time every batch size (the bf16 pair only when ``bf16``).
    Returns the JSON payload."""
    size = size or LMSize()
    reference, hf = build_pair(size, variant=None)
    ours_int8 = benchlib.for_decoding(reference, "int8")  # a copy
    ours = benchlib.for_decoding(copy.deepcopy(reference))
    ours_bf16 = benchlib.for_decoding(reference, "bfloat16") if bf16 else None  # in place: reference's last use
    hf_bf16 = copy.deepcopy(hf).to(torch.bfloat16) if bf16 else None
    rows = [run_case(ours, ours_int8, hf, b, prompt_len, new_tokens, runs, warmup, ours_bf16, hf_bf16)
            for b in batches]
    return {"size": asdict(size), "runs": runs, "rows": rows}


COLUMNS = ["batch", "prompt", "new_tokens", "aiayn_tok_s", "hf_tok_s", "ratio_vs_hf", "aiayn_ms_per_step",
           "hf_ms_per_step", "same_tokens", "aiayn_int8_tok_s", "int8_ratio_vs_hf", "int8_same_tokens",
           "floor_ms_per_step", "fp32_bound_vs_hf", "aiayn_bf16_tok_s", "hf_bf16_tok_s", "bf16_ratio_vs_hf_bf16",
           "bf16_ratio_vs_hf", "bf16_same_tokens"]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """CLI entry point: run, print the table, write ``bench/results/generate_lm.json``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    benchlib.add_common_args(p)  # --quick: 2 layers, 32 new tokens, 3 runs
    p.add_argument("--new-tokens", type=int, default=None)
    benchlib.add_bf16_arg(p)
    args = p.parse_args(argv)
    benchlib.setup(args.threads)
    t0 = time.perf_counter()
    bf16 = benchlib.wants_bf16(args.bf16)
    if args.quick:
        payload = bench_generate(LMSize(n_layers=2), new_tokens=args.new_tokens or 32, runs=args.runs or 3, bf16=bf16)
    else:
        payload = bench_generate(new_tokens=args.new_tokens or 128, runs=args.runs or 5, bf16=bf16)
    payload["wall_s"] = time.perf_counter() - t0
    print(f"greedy generation, GPT-2-like {payload['size']}, median of {payload['runs']} alternating runs")
    benchlib.report("generate_lm", payload, COLUMNS, args.quick)
    return payload


if __name__ == "__main__":
    main()
