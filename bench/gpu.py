"""GPU benchmarks on one GPU in bf16: training throughput and MFU, greedy decoding and beam search, against
transformers with the same weights, and the peak memory of each.

- **train**: GPT-2 small (12 x 768, 12 heads, vocab 50257, context 1024), batch ``--batch`` sequences, forward +
  backward + fused AdamW under bf16 autocast (SDPA's flash kernels on CUDA): aiayn eager and ``torch.compile``d
  (``aiayn.train.parallel.compile_for_training``, as ``train.compile = true``) beside ``GPT2LMHeadModel`` eager and
  compiled, all holding the same weights; target tokens/s and MFU against the GPU's dense bf16 peak
  (``PEAK_BF16_TFLOPS``; ``--peak-tflops`` for another GPU), FLOPs per token from
  :func:`aiayn.models.stats.forward_flops_per_token` times 3.
- **greedy**: batch 1, a 16-token prompt and 128 new tokens of the same model (bf16 weights): aiayn ``generate``,
  eager and with its step compiled (``aiayn.accel.compile_decoding``: CUDA graphs on CUDA), against
  ``GPT2LMHeadModel.generate``; ``same_tokens`` checks that each produced transformers' tokens.
- **beam**: beam 4, batch 32, 20-token sources, 21 decoder steps at paper-base size (6 + 6 layers, 512 wide, vocab
  32000): aiayn ``translate`` against ``MarianMTModel.generate`` (random weights each; output lengths held equal).

Peak memory: ``torch.cuda.max_memory_allocated`` during each contender's runs (on the CPU, the process's peak RSS).
``--tiny`` runs everything at toy sizes in float32 on whatever device there is (the smoke test's setting). Prints a
table and writes ``bench/results/gpu.json`` (``bench/results/quick/gpu.json`` with ``--tiny``).

    .venv/bin/python bench/gpu.py             # on a CUDA machine
    .venv/bin/python bench/gpu.py --tiny      # anywhere, seconds
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
import generate_lm  # noqa: E402
import translate_beam  # noqa: E402

from aiayn.accel import compile_decoding  # noqa: E402
from aiayn.generate import generate, translate  # noqa: E402
from aiayn.models.stats import forward_flops_per_token  # noqa: E402
from aiayn.train.optim import build_optimizer  # noqa: E402
from aiayn.train.parallel import compile_for_training  # noqa: E402

#: dense bf16 tensor-core peak (TFLOP/s, without sparsity) by a name in ``torch.cuda.get_device_name()``
PEAK_BF16_TFLOPS = {"H200": 989.4, "H100 SXM": 989.4, "H100 PCIe": 756.0, "H100 NVL": 835.0, "H100": 989.4,
                    "A100": 312.0, "L40S": 362.0, "L4": 121.0, "A10G": 70.0, "A10": 125.0, "RTX 4090": 165.2}


COLUMNS = ["case", "contender", "tokens_per_s", "sentences_per_s", "mfu", "tflops", "peak_memory_mb", "same_tokens"]


@dataclass
class Settings:
    """The sizes of one benchmark run."""

    lm: generate_lm.LMSize
    context: int
    batch: int
    train_steps: int
    new_tokens: int
    prompt_len: int
    seq2seq: translate_beam.Seq2SeqSize
    beam_batch: int
    src_len: int
    runs: int


FULL = Settings(generate_lm.LMSize(n_layers=12, d_model=768, n_heads=12, vocab_size=50257, max_len=1024),
                context=1024, batch=8, train_steps=10, new_tokens=128, prompt_len=16,
                seq2seq=translate_beam.SIZES["paper-base"], beam_batch=32, src_len=20, runs=5)
TINY = Settings(generate_lm.LMSize(n_layers=2, d_model=32, n_heads=2, vocab_size=97, max_len=32),
                context=32, batch=2, train_steps=2, new_tokens=6, prompt_len=4,
                seq2seq=translate_beam.Seq2SeqSize("tiny", 32, 64, 2, 1, 101), beam_batch=3, src_len=5, runs=1)


def peak_tflops(device: torch.device, override: float | None = None) -> float | None:
    """The device's dense bf16 peak in TFLOP/s: ``override``, else from :data:`PEAK_BF16_TFLOPS` (None: unknown)."""
    if override is not None:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, value in PEAK_BF16_TFLOPS.items():
        if key in name:
            return value
    return None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _measure(fn: Callable[[], Any], device: torch.device, runs: int, warmup: int = 1) -> tuple[float, float | None]:
    """(median seconds of ``runs`` calls after ``warmup``, peak memory in MB during them: CUDA allocations, else
    None)."""
    for _ in range(warmup):
        fn()
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t)
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    return benchlib.median(times), peak


def _autocast(device: torch.device, bf16: bool):
    import contextlib

    return torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()


def train_rows(s: Settings, device: torch.device, bf16: bool, peak: float | None,
               compiled: bool = True) -> list[dict[str, Any]]:
    """Training tokens/s, MFU and peak memory of aiayn and GPT2LMHeadModel, eager and (``compiled``) compiled, same
    weights."""
    ours, hf = generate_lm.build_pair(s.lm, variant=None)
    ours, hf = ours.to(device).train(), hf.to(device).train()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, s.lm.vocab_size, (s.batch, s.context + 1), generator=g).to(device)
    inputs, labels = ids[:, :-1], ids[:, 1:]
    tokens = labels.numel()
    flops = 3 * forward_flops_per_token(ours.config, tgt_len=s.context) * tokens

    def aiayn_loss(model: Any) -> Callable[[], torch.Tensor]:
        def loss() -> torch.Tensor:
            hidden = model(inputs, compute_logits=False).hidden
            return model.lm_head.loss(hidden, labels, 0.0)[0] / tokens
        return loss

    def hf_loss(model: Any) -> Callable[[], torch.Tensor]:
        def loss() -> torch.Tensor:
            logits = model(inputs).logits
            return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten())
        return loss

    contenders = {"aiayn": (ours, aiayn_loss(ours)), "transformers": (hf, hf_loss(hf))}
    if compiled:
        compiled_ours, compiled_hf = copy.deepcopy(ours), copy.deepcopy(hf)
        compile_for_training(compiled_ours)
        contenders["aiayn-compiled"] = (compiled_ours, aiayn_loss(compiled_ours))
        contenders["transformers-compiled"] = (compiled_hf, hf_loss(torch.compile(compiled_hf)))
    rows = []
    for name, (model, loss_fn) in contenders.items():
        optimizer = build_optimizer(model, "adamw", lr=1e-4, weight_decay=0.0)  # fused where supported

        def step(loss_fn: Callable[[], torch.Tensor] = loss_fn, optimizer: Any = optimizer) -> None:
            optimizer.zero_grad(set_to_none=True)
            with _autocast(device, bf16):
                loss = loss_fn()
            loss.backward()
            optimizer.step()

        seconds, memory = _measure(step, device, s.train_steps, warmup=2)
        achieved = flops / seconds / 1e12
        rows.append({"case": "train", "contender": name, "tokens_per_s": tokens / seconds,
                     "tflops": achieved, "mfu": achieved / peak if peak else None, "peak_memory_mb": memory})
    return rows


def greedy_rows(s: Settings, device: torch.device, bf16: bool, compiled: bool = True) -> list[dict[str, Any]]:
    """Batch-1 greedy decoding tokens/s of aiayn ``generate`` (eager, and with ``compiled`` its step compiled:
    CUDA graphs on CUDA) and ``GPT2LMHeadModel.generate``, same weights."""
    ours, hf = generate_lm.build_pair(s.lm, variant=None)
    dtype = torch.bfloat16 if bf16 else torch.float32
    ours, hf = ours.to(device, dtype).eval(), hf.to(device, dtype).eval()
    compiled_ours = compile_decoding(copy.deepcopy(ours)) if compiled else None
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(5, s.lm.vocab_size - 1, (1, s.prompt_len), generator=g)
    out: dict[str, Any] = {}

    def run_ours() -> None:
        out["aiayn"] = generate(ours, prompt.tolist(), max_new_tokens=s.new_tokens, greedy=True, stop_ids=(),
                                pad_id=0)

    def run_hf() -> None:
        with torch.inference_mode():
            ids = prompt.to(device)
            out["transformers"] = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, num_beams=1,
                                              max_new_tokens=s.new_tokens, min_new_tokens=s.new_tokens,
                                              pad_token_id=s.lm.vocab_size - 1)

    def run_compiled() -> None:
        out["aiayn-compiled"] = generate(compiled_ours, prompt.tolist(), max_new_tokens=s.new_tokens, greedy=True,
                                         stop_ids=(), pad_id=0)

    rows = []
    contenders = [("aiayn", run_ours), ("transformers", run_hf)]
    if compiled_ours is not None:
        contenders.insert(1, ("aiayn-compiled", run_compiled))
    for name, fn in contenders:
        seconds, memory = _measure(fn, device, s.runs, warmup=2)
        rows.append({"case": "greedy", "contender": name, "tokens_per_s": s.new_tokens / seconds,
                     "peak_memory_mb": memory})
    hf_tokens = out["transformers"][0, -s.new_tokens:].tolist()
    for row in rows:
        name = row["contender"]
        tokens = hf_tokens if name == "transformers" else [int(t) for t in out[name][0]][-s.new_tokens:]
        row["same_tokens"] = tokens == hf_tokens
    return rows


def beam_rows(s: Settings, device: torch.device, bf16: bool) -> list[dict[str, Any]]:
    """Beam-4 translation sentences/s of aiayn ``translate`` and ``MarianMTModel.generate`` (equal output lengths)."""
    dtype = torch.bfloat16 if bf16 else torch.float32
    ours = translate_beam.reference_model(s.seq2seq).to(device, dtype)
    hf = translate_beam.marian_model(s.seq2seq).to(device, dtype)
    out_len = s.src_len + 1
    g = torch.Generator().manual_seed(2)
    src = torch.randint(5, s.seq2seq.vocab_size - 2, (s.beam_batch, s.src_len), generator=g).to(device)
    out: dict[str, Any] = {}

    def runner(name: str, model: Any) -> Callable[[], None]:
        mask = translate_beam.EosMask(model.lm_head, translate_beam.EOS, out_len)

        def run() -> None:
            mask.reset()
            with mask:
                out[name] = translate(model, src, beam_size=4, alpha=0.6, max_len_a=0.0, max_len_b=out_len,
                                      bos_id=translate_beam.BOS, eos_id=translate_beam.EOS, pad_id=translate_beam.PAD)
        return run

    def run_hf() -> None:
        with torch.inference_mode():
            out["transformers"] = hf.generate(src, attention_mask=torch.ones_like(src), num_beams=4,
                                              length_penalty=0.6, do_sample=False, min_new_tokens=out_len,
                                              max_new_tokens=out_len + 1, early_stopping=False)

    rows = []
    contenders = [("aiayn", runner("aiayn", ours)), ("transformers", run_hf)]
    for name, fn in contenders:
        seconds, memory = _measure(fn, device, s.runs)
        rows.append({"case": "beam4", "contender": name, "sentences_per_s": s.beam_batch / seconds,
                     "peak_memory_mb": memory})
    return rows


def run(tiny: bool = False, device_name: str = "auto", batch: int | None = None,
        peak_override: float | None = None, compiled: bool = True) -> dict[str, Any]:
    """Every case; returns the results (``rows`` plus the settings, device and peak)."""
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if device_name == "auto" else device_name)
    settings = copy.deepcopy(TINY if tiny else FULL)
    if batch is not None:
        settings.batch = batch
    bf16 = device.type == "cuda" and not tiny
    peak = peak_tflops(device, peak_override)
    torch.manual_seed(0)
    rows = train_rows(settings, device, bf16, peak, compiled) + greedy_rows(settings, device, bf16, compiled) \
        + beam_rows(settings, device, bf16)
    if device.type != "cuda":
        for row in rows:
            row["peak_memory_mb"] = benchlib.peak_rss_mb()  # the process's, not the contender's
    return {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "dtype": "bfloat16" if bf16 else "float32", "peak_bf16_tflops": peak, "tiny": tiny,
            "settings": asdict(settings), "rows": rows}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="toy sizes in float32, on any device (seconds)")
    parser.add_argument("--device", default="auto", help="cuda, cuda:N, cpu or auto (default)")
    parser.add_argument("--batch", type=int, default=None, help="training sequences per step (default 8)")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak, for MFU")
    parser.add_argument("--no-compile", action="store_true",
                        help="leave out the compiled contenders (training, and the compiled decoding step)")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default bench/results[/quick])")
    args = parser.parse_args(argv)
    result = run(args.tiny, args.device, args.batch, args.peak_tflops, compiled=not args.no_compile)
    print(benchlib.table(result["rows"], COLUMNS))
    path = benchlib.write_results("gpu", result, quick=args.tiny, out_dir=args.out)
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
