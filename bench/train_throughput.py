"""Training throughput (forward + backward + Adam step) at equal shapes, with MFU and peak memory.

- Encoder-decoder, paper-base (512/2048/8, 6+6, vocab 32000), batch 16 x 32 source / 32 target tokens:
  aiayn vs ``torch.nn.Transformer`` (+ shared embeddings, sinusoidal positions, tied output layer) vs
  transformers ``MarianMTModel`` (the same post-LN/ReLU/sinusoidal architecture).
- Decoder-only, GPT-2-small (768/3072/12, 12 layers, vocab 50257), batch 8 x 128: aiayn vs
  ``GPT2LMHeadModel``.
- Encoder-decoder at the tiny Multi30k recipe's size (128/256/4, 4+4, vocab 8000, dropout 0.3), batch 256 x 16
  / 16 (about the recipe's 4096-token batches): the same three.

"aiayn" is the model as ``aiayn train`` trains it: the reference core accelerated for training
(:func:`aiayn.accel.accelerate`; ``AIAYN_ACCEL=none`` in the environment times the reference instead).
"aiayn-reference" is the reference core alone (``--accel none``: plain ``nn.Linear``, torch's attention kernels, the
loss from the whole logits tensor): the ratio says what the CPU accelerator buys a training step.

Dropout 0.1 (0.3 for the tiny setup) on embeddings and residual branches everywhere, none on attention weights or the
FFN hidden layer (torch.nn.Transformer's built-in attention/activation dropouts are switched off to match). Loss:
token cross-entropy over all positions, each library's own way (the peers: logits, then ``F.cross_entropy``; aiayn:
its trainer's ``model.lm_head.loss`` on the hidden states, the fused projection + loss of
:mod:`aiayn.accel.cpu.fused_loss` once accelerated); optimizer: ``torch.optim.Adam`` with the fused kernel for everyone
(transformers' Trainer uses it by default). Runs alternate (one step per run).

MFU = 3 * ``aiayn.models.stats.forward_flops_per_token`` * tokens/s / measured fp32 matmul FLOP/s (a 2048^3
matmul through each library at hand, MKL and oneDNN, timed in the same alternating rounds so it sees the same load;
the peak is the fastest of those products, since the median of a few 80 ms products swung from 175 to 211 GFLOP/s
with the host's load and a low denominator inflates every MFU; ``median_matmul_gflops`` records the median); tokens
are target tokens. Peak memory: each configuration trains 2 steps in its own
subprocess, which reports its VmHWM (peak RSS) and the increase over the RSS right after the imports; these run
after all timing, two at a time (a process's peak RSS is its own, whatever runs beside it).

``--dtype bfloat16`` runs every implementation with mixed precision (forward and loss under
``torch.autocast("cpu", bfloat16)``, float32 weights, gradients and Adam), and MFU against a bf16 2048^3 matmul
(on CPUs with AMX, several times the fp32 peak). aiayn's fused projection + loss follows autocast, and on CPU its
attention trains in float32 (torch's CPU flash kernel is slower in bf16 with a backward); the peers run as they are.

    .venv/bin/python bench/train_throughput.py
    .venv/bin/python bench/train_throughput.py --dtype bfloat16
    .venv/bin/python bench/train_throughput.py --quick
    .venv/bin/python bench/train_throughput.py --setups seq2seq-paper-base --batch 64   # 2048 target tokens a step
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
import matmul_peak  # noqa: E402

from aiayn import ModelConfig, build_model  # noqa: E402
from aiayn.models import forward_flops_per_token  # noqa: E402
from aiayn.nn.positions import sinusoidal_table  # noqa: E402

DROPOUT = 0.1
ABLATION = "aiayn-reference"  # aiayn against itself (its reference core), not a peer: --no-ablation leaves it out

# name -> (config overrides, batch, src_len, tgt_len, implementations); "quick" variants are tiny
SETUPS: dict[str, dict[str, Any]] = {
    "seq2seq-paper-base": dict(preset="paper-base", cfg=dict(vocab_size=32000), batch=16, src=32, tgt=32,
                               impls=("aiayn", ABLATION, "torch.nn.Transformer", "transformers-marian")),
    # the exact GELU, as the transformers peer is built (gpt2_for)
    "lm-gpt2-small": dict(preset="gpt2-small", cfg=dict(activation="gelu", **benchlib.exact_gelu()), batch=8, src=0,
                          tgt=128, impls=("aiayn", ABLATION, "transformers-gpt2")),
    # the tiny Multi30k recipe's model (post-LN here, as the peers), dropout 0.3, ~4096 target tokens per step
    "seq2seq-multi30k-tiny": dict(preset="paper-base", cfg=dict(vocab_size=8000, d_model=128, n_heads=4, d_ff=256,
                                                                n_layers=4, dropout=0.3), batch=256, src=16, tgt=16,
                                  impls=("aiayn", ABLATION, "torch.nn.Transformer", "transformers-marian")),
}
QUICK_CFG = dict(d_model=128, d_ff=512, n_heads=4, n_layers=2)


def model_config(setup: str, quick: bool = False, overrides: dict[str, Any] | None = None) -> ModelConfig:
    """The aiayn config of a setup (shrunk when ``quick``, then overridden); every peer is built to match."""
    s = SETUPS[setup]
    over = {"dropout": DROPOUT, **s["cfg"], **(QUICK_CFG if quick else {})}
    if quick:
        over["vocab_size"] = 4000
    return ModelConfig.preset(s["preset"], **{**over, **(overrides or {})})


def setup_shape(setup: str, shape: dict[str, int] | None = None) -> dict[str, int]:
    """Batch size and source/target lengths of a setup, with overrides (``src`` stays 0 for decoder-only)."""
    s = SETUPS[setup]
    out = {"batch": s["batch"], "src": s["src"], "tgt": s["tgt"], **(shape or {})}
    if not s["src"]:
        out["src"] = 0
    return out


class TorchSeq2Seq(nn.Module):
    """``torch.nn.Transformer`` with the paper's embeddings: shared, scaled by sqrt(D), sinusoidal positions,
    output layer tied to the embedding. Only residual and embedding dropout, like aiayn's default."""

    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(c.vocab_size, c.d_model, padding_idx=c.pad_id)
        with torch.no_grad():  # the paper's N(0, d^-1/2), as aiayn; nn.Embedding's N(0, 1) would make the tied
            self.embed.weight.normal_(0.0, c.d_model**-0.5)  # logits so peaked that softmax underflows to
            self.embed.weight[c.pad_id].zero_()  # denormals, and the backward matmuls crawl
        self.register_buffer("pe", sinusoidal_table(c.max_len, c.d_model), persistent=False)
        self.scale = math.sqrt(c.d_model)
        self.drop = nn.Dropout(c.dropout)
        self.core = nn.Transformer(c.d_model, c.n_heads, c.encoder_layers, c.n_layers, c.d_ff, c.dropout,
                                   batch_first=True, norm_first=False, layer_norm_eps=c.norm_eps)
        for layer in [*self.core.encoder.layers, *self.core.decoder.layers]:
            layer.dropout.p = 0.0  # FFN hidden dropout off
            layer.self_attn.dropout = 0.0  # attention-weight dropout off
            if hasattr(layer, "multihead_attn"):
                layer.multihead_attn.dropout = 0.0
        self.out = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.out.weight = self.embed.weight

    def _emb(self, ids: Tensor) -> Tensor:
        return self.drop(self.embed(ids) * self.scale + self.pe[: ids.shape[1]])  # (B, T, D)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """src (B, S), tgt (B, T) -> logits (B, T, V)."""
        t = tgt.shape[1]
        causal = nn.Transformer.generate_square_subsequent_mask(t, device=tgt.device)
        h = self.core(self._emb(src), self._emb(tgt), tgt_mask=causal, tgt_is_causal=True)
        return self.out(h)


def marian_for(c: ModelConfig) -> nn.Module:
    """A transformers ``MarianMTModel`` with aiayn config ``c``'s shapes (post-LN, ReLU, static sinusoids)."""
    from transformers import MarianConfig, MarianMTModel

    v = c.vocab_size
    cfg = MarianConfig(vocab_size=v, d_model=c.d_model, encoder_layers=c.encoder_layers,
                       decoder_layers=c.n_layers, encoder_attention_heads=c.n_heads,
                       decoder_attention_heads=c.n_heads,
                       encoder_ffn_dim=c.d_ff, decoder_ffn_dim=c.d_ff, activation_function="relu",
                       scale_embedding=True, max_position_embeddings=c.max_len, pad_token_id=v - 1,
                       decoder_start_token_id=v - 1, eos_token_id=0, dropout=c.dropout, attention_dropout=0.0,
                       activation_dropout=0.0)
    return MarianMTModel(cfg)


def gpt2_for(c: ModelConfig) -> nn.Module:
    """A transformers ``GPT2LMHeadModel`` with aiayn config ``c``'s shapes (exact GELU, as aiayn's)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=c.vocab_size, n_positions=c.max_len, n_embd=c.d_model, n_layer=c.n_layers,
                     n_head=c.n_heads, n_inner=c.d_ff, activation_function="gelu", resid_pdrop=c.dropout,
                     embd_pdrop=c.dropout, attn_pdrop=0.0, bos_token_id=c.vocab_size - 1,
                     eos_token_id=c.vocab_size - 1)
    return GPT2LMHeadModel(cfg)


def build_step(setup: str, impl: str, quick: bool = False, seed: int = 0, cfg: dict[str, Any] | None = None,
               shape: dict[str, int] | None = None, dtype: str = "float32") -> tuple[Callable[[], float], int]:
    """Build one implementation of a setup and return (``step()`` -> loss, target tokens per step).

    Each ``step()`` is one training step on a fixed random batch: forward, loss, backward, Adam, zero_grad.
    ``cfg`` and ``shape`` override the setup's model config and its batch/src/tgt sizes (for smoke tests).
    ``dtype`` "bfloat16" runs forward and loss under ``torch.autocast`` (float32 weights and optimizer), as
    aiayn's trainer does with ``train.dtype: bfloat16`` and transformers' Trainer with ``bf16=True``.
    """
    s, c = setup_shape(setup, shape), model_config(setup, quick, cfg)
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    b, v = s["batch"], c.vocab_size
    tgt = torch.randint(5, v - 2, (b, s["tgt"] + 1), generator=g)
    tgt_in, labels = tgt[:, :-1], tgt[:, 1:]  # (B, T) each
    src = torch.randint(5, v - 2, (b, s["src"]), generator=g) if s["src"] else None
    forward: Callable[[], Tensor]
    loss_fn: Callable[[], Tensor] | None = None
    if impl in ("aiayn", ABLATION):  # aiayn's trainer path: hidden states, then the head's loss
        model = build_model(c)
        if impl == "aiayn":
            benchlib.for_training(model)  # as the trainer does (older revisions, timed by ab_revisions.py: built so)
        hidden = ((lambda **kw: model(src, tgt_in, compute_logits=False, **kw)) if src is not None
                  else (lambda **kw: model(tgt_in, compute_logits=False, **kw)))
        summed = benchlib.training_loss(model, hidden, labels)  # (B, T) labels

        def loss_fn() -> Tensor:
            return summed() / labels.numel()
    elif impl == "torch.nn.Transformer":
        model = TorchSeq2Seq(c)
        forward = lambda: model(src, tgt_in)  # noqa: E731
    elif impl == "transformers-marian":
        model = marian_for(c)
        mask = torch.ones_like(src)
        forward = lambda: model(input_ids=src, attention_mask=mask,  # noqa: E731
                                decoder_input_ids=tgt_in).logits
    elif impl == "transformers-gpt2":
        model = gpt2_for(c)
        forward = lambda: model(input_ids=tgt_in).logits  # noqa: E731
    else:
        raise ValueError(f"unknown implementation {impl!r}")
    if loss_fn is None:
        def loss_fn() -> Tensor:
            logits = forward()  # (B, T, V)
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
    model.train()
    # the fused Adam kernel for everyone: transformers' Trainer defaults to it (adamw_torch_fused, torch >= 2.8)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)

    def step() -> float:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
            loss = loss_fn()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step, b * s["tgt"]


def measure_memory(setup: str, impl: str, quick: bool, dtype: str = "float32",
                   batch: int | None = None) -> dict[str, float]:
    """Peak RSS of 2 training steps of one configuration (``batch`` sequences a step instead of the setup's own),
    measured in a fresh subprocess."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--memory-worker", setup, impl,
           "--threads", str(torch.get_num_threads()), "--dtype", dtype]
    if batch is not None:
        cmd += ["--batch", str(batch)]
    if quick:
        cmd.append("--quick")
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        print(f"memory worker {setup}/{impl} failed:\n{res.stderr[-2000:]}", file=sys.stderr)
        return {"peak_rss_mb": float("nan"), "delta_rss_mb": float("nan")}
    return json.loads(res.stdout.strip().splitlines()[-1])


def _memory_worker(setup: str, impl: str, quick: bool, dtype: str, batch: int | None = None) -> None:
    if impl.startswith("transformers"):
        import transformers  # noqa: F401  (imported before the baseline, like torch)
    base = benchlib.current_rss_mb()
    step, _ = build_step(setup, impl, quick, dtype=dtype, shape=None if batch is None else {"batch": batch})
    for _ in range(2):
        step()
    peak = benchlib.peak_rss_mb()
    print(json.dumps({"peak_rss_mb": peak, "delta_rss_mb": peak - base}))


def bench_train(setups: list[str] | None = None, quick: bool = False, runs: int = 5, warmup: int = 1,
                memory: bool = True, peak_flops: float | None = None, cfg: dict[str, Any] | None = None,
                shape: dict[str, int] | None = None, dtype: str = "float32", ablation: bool = True) -> dict[str, Any]:
    """The whole benchmark. Returns the JSON payload (rows: one per setup x implementation; aiayn against its own
    reference core, ``aiayn-reference``, only when ``ablation``).

    ``cfg`` / ``shape`` override every setup's model config and sizes (smoke tests; with ``memory`` only a
    ``shape`` that sets nothing but ``batch``).
    ``peak_flops`` fixes the MFU denominator instead of timing a matmul (1024^3 when ``quick``, else 2048^3; in
    ``dtype``, so bf16 MFU is against the bf16 matmul peak). ``dtype`` "bfloat16": every implementation under
    autocast (see :func:`build_step`).
    """
    if memory and shape and set(shape) - {"batch"}:
        raise ValueError(f"shape {shape}: the memory subprocesses take only a batch size; pass memory=False")
    setups = setups or list(SETUPS)
    n = 1024 if quick else 2048
    products = matmul_peak.matmul_products(n, getattr(torch, dtype))
    rows = []
    for setup in setups:
        impls, s, c = SETUPS[setup]["impls"], setup_shape(setup, shape), model_config(setup, quick, cfg)
        impls = tuple(i for i in impls if ablation or i != ABLATION)
        steps, tokens = {}, 0
        for impl in impls:
            steps[impl], tokens = build_step(setup, impl, quick, cfg=cfg, shape=shape, dtype=dtype)
        if peak_flops is None:
            steps.update(products)
        times = benchlib.alternate(steps, runs=runs, warmup=warmup)
        peak = peak_flops or matmul_peak.peak_flops(n, times, fastest=True)[0]
        median_peak = peak_flops or matmul_peak.peak_flops(n, times)[0]
        flops_tok = 3 * forward_flops_per_token(c, src_len=s["src"], tgt_len=s["tgt"])
        t_ours = benchlib.median(times["aiayn"])
        for impl in impls:
            t = benchlib.median(times[impl])
            row: dict[str, Any] = {
                "setup": setup, "impl": impl, "dtype": dtype, "batch": s["batch"], "src": s["src"], "tgt": s["tgt"],
                "tok_s": tokens / t, "step_ms": 1e3 * t, "aiayn_speedup": t / t_ours,
                "mfu": flops_tok * tokens / t / peak, "peak_gflops": peak / 1e9,
                "median_matmul_gflops": median_peak / 1e9, "times": times[impl],
            }
            rows.append(row)
        del steps
    if memory:  # after all timing, two workers at a time: a peak RSS is its own process's, whatever runs beside it
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            peaks = list(pool.map(lambda r: measure_memory(r["setup"], r["impl"], quick, dtype,
                                                           batch=(shape or {}).get("batch")), rows))
        for row, peak in zip(rows, peaks):
            row.update(peak)
    return {"runs": runs, "quick": quick, "dtype": dtype, "rows": rows}


COLUMNS = ["setup", "impl", "dtype", "batch", "src", "tgt", "tok_s", "step_ms", "aiayn_speedup", "mfu", "peak_gflops",
           "peak_rss_mb", "delta_rss_mb"]


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    """CLI entry point: run, print the table, write ``bench/results/train_throughput.json``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    benchlib.add_common_args(p)  # --quick: tiny models (2 layers x 128), 3 runs
    p.add_argument("--setups", nargs="+", choices=list(SETUPS), default=None)
    p.add_argument("--no-memory", action="store_true", help="skip the per-configuration memory subprocesses")
    p.add_argument("--no-ablation", action="store_true", help=f"leave out {ABLATION} (aiayn against its own "
                   "reference core, without the CPU accelerator); run_all.py passes it")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="bfloat16: every implementation under torch.autocast, MFU against the bf16 matmul peak; "
                        "results go to train_throughput_bfloat16.json")
    benchlib.add_batch_arg(p, "train_throughput[_bfloat16]-batch<N>.json")
    p.add_argument("--memory-worker", nargs=2, metavar=("SETUP", "IMPL"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    benchlib.setup(args.threads)
    if args.memory_worker:
        _memory_worker(*args.memory_worker, args.quick, args.dtype, args.batch)
        return None
    t0 = time.perf_counter()
    payload = bench_train(args.setups, quick=args.quick, runs=args.runs or (3 if args.quick else 5),
                          memory=not args.no_memory, dtype=args.dtype, ablation=not args.no_ablation,
                          shape=None if args.batch is None else {"batch": args.batch})
    payload["wall_s"] = time.perf_counter() - t0
    print(f"training throughput (fwd+bwd+Adam, {args.dtype}), median of {payload['runs']} alternating steps; "
          f"MFU vs the fastest {args.dtype} matmul FLOP/s measured in the same rounds (peak_gflops)")
    name = "train_throughput" if args.dtype == "float32" else f"train_throughput_{args.dtype}"
    name += "" if args.batch is None else f"-batch{args.batch}"
    benchlib.report(name, payload, COLUMNS, args.quick)
    return payload


if __name__ == "__main__":
    main()
