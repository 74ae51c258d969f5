"""The two CPU training kernels aiayn replaces, against torch's own, at the shapes of the training benches.

- Dropout: :func:`aiayn.nn.dropout.dropout` (through the native kernel where it is built) and its PyTorch path
  (``dropout_multiplier``: a multiplier from 64-bit words, four uniforms each) vs ``torch.nn.functional.dropout``,
  forward only, on an activation of ``rows x 4 * d_model``.
- The fused projection + loss (:func:`aiayn.train.fused_loss.linear_label_smoothed_nll`, forward + backward) with
  chunks of 64 and 512 rows (512 is the CPU default) and with one large chunk (the accelerator default); and with
  512-row chunks under bf16 autocast (``loss_512_rows_bf16``: its matmuls in bf16).
- The output layer's forward product, ``h @ W.T`` at (rows, d_model) x (vocab, d_model): torch's BLAS
  (``logits_blas``) against :func:`aiayn.native.panel_linear_once` (``logits_native``, the weight packed in the call),
  which training takes there on AVX2 CPUs (:func:`aiayn.nn.cpu_gemm.native_forward_applies`); and the 512-row fused
  loss with that product on BLAS (``loss_512_rows_blas``). NaN where the native kernels are not built.
- Causal self-attention forward + backward at the setup's (batch, heads, length, head width), bf16 inputs:
  torch's flash kernel in bf16 (what autocast runs) against :func:`aiayn.nn.attention.scaled_dot_product_attention`,
  which trains in float32 on CPU (``attn_bf16_aiayn``), and the float32 kernel on float32 inputs.
- Attention over few keys, fp32 forward + backward, by key count (16 to 128; batch x length fixed at 8192 tokens,
  8 heads of 64): torch's flash kernel against :func:`aiayn.nn.short_attention.attention` (two matmuls, an
  additive mask, a softmax), causal and with padding (a third of the examples 5 keys short): the second table,
  which sets ``short_attention.MAX_KEYS``.

Alternating runs, median of ``--runs`` (default 7), milliseconds. ``loss_512_rows_faults``: the minor page faults
of one default-chunk call as a training step makes it (the gradients set to None first, as ``zero_grad`` does),
median of 3 after the timing: the fresh memory the call takes from the kernel.

    .venv/bin/python bench/cpu_train_kernels.py
    .venv/bin/python bench/cpu_train_kernels.py --quick
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

from aiayn import native  # noqa: E402
from aiayn.nn import cpu_gemm, short_attention  # noqa: E402
from aiayn.nn.attention import scaled_dot_product_attention  # noqa: E402
from aiayn.nn.dropout import dropout, multiplier_dropout  # noqa: E402
from aiayn.train.fused_loss import linear_label_smoothed_nll  # noqa: E402

# (name, rows, d_model, vocab, attention (batch, heads, length, head width)): tiny Multi30k recipe, paper-base,
# GPT-2 small (8 x 128 tokens)
SHAPES = [("tiny-multi30k", 4096, 128, 8000, (256, 4, 16, 32)), ("paper-base", 512, 512, 32000, (16, 8, 32, 64)),
          ("gpt2-small", 1024, 768, 50257, (8, 12, 128, 64))]
QUICK_SHAPES = [("quick", 256, 64, 1000, (8, 2, 16, 32))]
CHUNKS = {"loss_64_rows": 64, "loss_512_rows": 512, "loss_one_chunk": 1 << 30}
#: key counts of the few-keys attention table (batch = TOKENS // keys); quick: smaller
KEY_COUNTS, TOKENS, QUICK_KEY_COUNTS, QUICK_TOKENS = (16, 32, 64, 128), 8192, (16, 32), 256


BF16_KEYS = ("loss_512_rows_bf16", "attn_bf16_torch", "attn_bf16_aiayn")  # timed only with bf16
NATIVE_KEYS = ("logits_native", "loss_512_rows_blas")  # timed only where the native kernels are built


@contextlib.contextmanager
def blas_forward() -> Iterator[None]:
    """Within the block, training's output-layer forward product stays on BLAS (no shape qualifies for
    :func:`aiayn.nn.cpu_gemm.native_forward_applies`)."""
    kept, cpu_gemm.NATIVE_FORWARD_MIN_OUT = cpu_gemm.NATIVE_FORWARD_MIN_OUT, 1 << 62
    try:
        yield
    finally:
        cpu_gemm.NATIVE_FORWARD_MIN_OUT = kept


def time_shape(name: str, n: int, d: int, v: int, attn: tuple[int, int, int, int], runs: int,
               bf16: bool = True) -> dict:
    """The kernels at one shape: ``n`` rows (tokens) of width ``d``, vocabulary ``v``, attention of shape ``attn``
    (B, H, T, Dh); one result row (the bf16 timings, ``BF16_KEYS``, NaN unless ``bf16``)."""
    x = torch.randn(n, 4 * d)  # (n, 4D) an FFN-sized activation
    h = torch.randn(n, d, requires_grad=True)  # (n, D)
    w = (torch.randn(v, d) * 0.05).requires_grad_()  # (V, D)
    y = torch.randint(1, v, (n,))  # (n,)
    qkv32 = [torch.randn(attn).requires_grad_() for _ in range(3)]  # (B, H, T, Dh) each
    qkv16 = [t.detach().bfloat16().requires_grad_() for t in qkv32]

    def loss(chunk: int, bf16: bool = False) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = linear_label_smoothed_nll(h, w, y, 0.1, ignore_vocab_id=0, chunk_rows=min(chunk, n))[0]
        out.backward()

    def loss_blas() -> None:
        with blas_forward():
            loss(CHUNKS["loss_512_rows"])

    logits = torch.empty(n, v)  # (n, V), as the fused loss's kept buffer
    hd, wd = h.detach(), w.detach()

    def attention(qkv: list[torch.Tensor], ours: bool) -> None:
        out = (scaled_dot_product_attention(*qkv, is_causal=True)[0] if ours
               else F.scaled_dot_product_attention(*qkv, is_causal=True))
        out.backward(torch.ones_like(out))

    fns = {"dropout_aiayn": lambda: dropout(x, 0.1), "dropout_multiplier": lambda: multiplier_dropout(x, 0.1),
           "dropout_torch": lambda: F.dropout(x, 0.1, True)}
    fns.update({k: (lambda c=c: loss(c)) for k, c in CHUNKS.items()})
    fns["loss_512_rows_bf16"] = lambda: loss(CHUNKS["loss_512_rows"], bf16=True)
    fns["logits_blas"] = lambda: torch.mm(hd, wd.T, out=logits)
    if native.library() is not None:
        fns["logits_native"] = lambda: native.panel_linear_once(hd, wd, out=logits)
        fns["loss_512_rows_blas"] = loss_blas
    fns.update({"attn_fp32": lambda: attention(qkv32, False), "attn_bf16_torch": lambda: attention(qkv16, False),
                "attn_bf16_aiayn": lambda: attention(qkv16, True)})
    if not bf16:
        fns = {k: f for k, f in fns.items() if k not in BF16_KEYS}
    times = benchlib.alternate(fns, runs=runs, warmup=1)
    row = {"shape": name, "rows": n, "d_model": d, "vocab": v,
           **{f"{k}_ms": float("nan") for k in BF16_KEYS + NATIVE_KEYS}}
    row.update({f"{k}_ms": 1e3 * benchlib.median(t) for k, t in times.items()})
    faults = []
    for _ in range(3):
        h.grad = w.grad = None
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        loss(CHUNKS["loss_512_rows"])
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    row["loss_512_rows_faults"] = benchlib.median(faults)
    row["dropout_speedup"] = row["dropout_torch_ms"] / row["dropout_aiayn_ms"]
    row["loss_512_vs_one_chunk"] = row["loss_one_chunk_ms"] / row["loss_512_rows_ms"]
    row["attn_bf16_speedup"] = row["attn_bf16_torch_ms"] / row["attn_bf16_aiayn_ms"]
    row["logits_native_speedup"] = row["logits_blas_ms"] / row["logits_native_ms"]
    row["loss_native_speedup"] = row["loss_512_rows_blas_ms"] / row["loss_512_rows_ms"]
    row["native_forward_in_training"] = cpu_gemm.native_forward_applies(hd, wd)
    return row


def time_few_keys_attention(keys: int, tokens: int, runs: int) -> list[dict]:
    """Forward + backward of (tokens // keys, 8, keys, 64) fp32 self-attention, causal and with padding, through
    torch's flash kernel and through :func:`aiayn.nn.short_attention.attention`; one result row per mask."""
    b, h, dh = max(tokens // keys, 3), 8, 64
    qkv = [torch.randn(b, h, keys, dh).requires_grad_() for _ in range(3)]  # (B, H, S, Dh) each
    grad = torch.randn(b, h, keys, dh)  # a dense gradient, as a linear layer's backward hands attention
    lengths = torch.full((b,), keys)
    lengths[::3] = keys - 5
    pad = (torch.arange(keys)[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, S)
    rows = []
    for kind in ("causal", "padding"):
        mask, causal = (None, True) if kind == "causal" else (pad, False)

        def flash(mask: torch.Tensor | None = mask, causal: bool = causal) -> None:
            F.scaled_dot_product_attention(*qkv, attn_mask=mask, is_causal=causal).backward(grad)

        def two_matmuls(mask: torch.Tensor | None = mask, causal: bool = causal) -> None:
            short_attention.attention(*qkv, mask, None, 0.0, causal, dh**-0.5).backward(grad)

        times = benchlib.alternate({"flash": flash, "two_matmuls": two_matmuls}, runs=runs, warmup=1)
        row = {"keys": keys, "batch": b, "mask": kind,
               **{f"{k}_ms": 1e3 * benchlib.median(t) for k, t in times.items()}}
        row["two_matmuls_speedup"] = row["flash_ms"] / row["two_matmuls_ms"]
        row["served_by_two_matmuls"] = keys <= short_attention.MAX_KEYS
        rows.append(row)
    return rows


def bench_kernels(quick: bool = False, runs: int = 7, bf16: bool = True) -> dict:
    """Time both kernels at each shape (the bf16 ones only when ``bf16``), and the few-keys attention at each key
    count; returns the JSON payload (``rows``: one per shape; ``attention_rows``: one per key count and mask)."""
    rows = [time_shape(*shape, runs=runs, bf16=bf16) for shape in (QUICK_SHAPES if quick else SHAPES)]
    key_counts, tokens = (QUICK_KEY_COUNTS, QUICK_TOKENS) if quick else (KEY_COUNTS, TOKENS)
    attention_rows = [r for keys in key_counts for r in time_few_keys_attention(keys, tokens, runs)]
    return {"runs": runs, "quick": quick, "rows": rows, "attention_rows": attention_rows}


COLUMNS = ["shape", "rows", "d_model", "vocab", "dropout_aiayn_ms", "dropout_multiplier_ms", "dropout_torch_ms",
           "dropout_speedup",
           "loss_64_rows_ms", "loss_512_rows_ms", "loss_one_chunk_ms", "loss_512_vs_one_chunk", "loss_512_rows_faults",
           "loss_512_rows_bf16_ms", "attn_fp32_ms", "attn_bf16_torch_ms", "attn_bf16_aiayn_ms", "attn_bf16_speedup",
           "logits_blas_ms", "logits_native_ms", "logits_native_speedup", "loss_512_rows_blas_ms",
           "loss_native_speedup", "native_forward_in_training"]

ATTENTION_COLUMNS = ["keys", "batch", "mask", "flash_ms", "two_matmuls_ms", "two_matmuls_speedup",
                     "served_by_two_matmuls"]


def main(argv: list[str] | None = None) -> dict:
    """CLI entry point: run, print the table, write ``bench/results/cpu_train_kernels.json``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    benchlib.add_common_args(p, runs=7)
    benchlib.add_bf16_arg(p)
    args = p.parse_args(argv)
    benchlib.setup(args.threads)
    t0 = time.perf_counter()
    payload = bench_kernels(args.quick, runs=args.runs or (2 if args.quick else 7), bf16=benchlib.wants_bf16(args.bf16))
    payload["wall_s"] = time.perf_counter() - t0
    print(benchlib.table(payload["attention_rows"], ATTENTION_COLUMNS))
    benchlib.report("cpu_train_kernels", payload, COLUMNS, args.quick)
    return payload


if __name__ == "__main__":
    main()
