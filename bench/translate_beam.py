"""Encoder-decoder beam search speed: aiayn ``translate`` vs HF ``MarianMTModel.generate`` vs CTranslate2.

All three run the paper's architecture (post-LN, ReLU, static sinusoidal positions, scaled and tied
embeddings) at the same sizes with beam 4 and length penalty 0.6, on the same random source batch. HF and
CTranslate2 share weights (the random Marian model is saved and converted with
``ctranslate2.converters.TransformersConverter``); aiayn has its own random weights (same shapes).

Each system also runs in int8: aiayn's opt-in int8 inference (``aiayn.nn.quantize``, ``--int8`` on the command
line) against CTranslate2 with ``compute_type="int8"``; int8 rows compare only with int8 rows (and with
transformers in fp32, which has no one-call int8 path for Marian's attention here).

Every system makes exactly ``out_len + 1`` decoder steps: aiayn gets a budget of ``out_len`` tokens (then EOS
is forced) and EOS is masked before that; HF gets ``min_new_tokens=out_len, max_new_tokens=out_len + 1`` (EOS
forced last); CTranslate2 gets ``min_decoding_length = max_decoding_length = out_len + 1``.

A last timed entry, ``matmul-floor``, runs only the decoder's per-step linear layers and the output layer on
batch x beam rows for the same number of steps (:func:`benchlib.matmul_floor`): ``fp32_bound_vs_hf`` =
transformers' time / that floor is the most any fp32 implementation of these matmuls could gain over
transformers (the encoder, attention and search are not even counted).

    .venv/bin/python bench/translate_beam.py          # multi30k and paper-base sizes, batch 1 and 32
    .venv/bin/python bench/translate_beam.py --quick
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

from aiayn import ModelConfig, build_model  # noqa: E402
from aiayn.generate import translate  # noqa: E402
from aiayn.nn.layout import column_major_linears  # noqa: E402
from aiayn.nn.quantize import quantize_int8  # noqa: E402

PAD, BOS, EOS = 0, 1, 2  # aiayn's special ids


@dataclass
class Seq2SeqSize:
    """Shape of a benchmarked encoder-decoder."""

    name: str
    d_model: int
    d_ff: int
    n_heads: int
    n_layers: int  # encoder and decoder each
    vocab_size: int


SIZES = {
    "multi30k": Seq2SeqSize("multi30k", 256, 1024, 4, 3, 8000),
    "paper-base": Seq2SeqSize("paper-base", 512, 2048, 8, 6, 32000),
}


def aiayn_model(size: Seq2SeqSize) -> nn.Module:
    """A random aiayn encoder-decoder of ``size`` (paper: post-LN, ReLU, sinusoidal, tied), in eval mode,
    with the inference weight layout ``load_pretrained`` gives users (:mod:`aiayn.nn.layout`)."""
    cfg = ModelConfig.preset("paper-base", d_model=size.d_model, d_ff=size.d_ff, n_heads=size.n_heads,
                             n_layers=size.n_layers, vocab_size=size.vocab_size, max_len=512, dropout=0.0)
    return column_major_linears(build_model(cfg).eval())


def marian_model(size: Seq2SeqSize) -> Any:
    """A random HF ``MarianMTModel`` of ``size``: EOS id 0, pad / decoder start id V-1 (Marian's layout)."""
    from transformers import MarianConfig, MarianMTModel

    v = size.vocab_size
    cfg = MarianConfig(vocab_size=v, d_model=size.d_model, encoder_layers=size.n_layers,
                       decoder_layers=size.n_layers, encoder_attention_heads=size.n_heads,
                       decoder_attention_heads=size.n_heads, encoder_ffn_dim=size.d_ff,
                       decoder_ffn_dim=size.d_ff, activation_function="relu", scale_embedding=True,
                       max_position_embeddings=512, pad_token_id=v - 1, decoder_start_token_id=v - 1,
                       eos_token_id=0, forced_eos_token_id=0, dropout=0.0, attention_dropout=0.0,
                       activation_dropout=0.0)
    return MarianMTModel(cfg).eval()


def marian_vocab(v: int) -> list[str]:
    """Token strings for a Marian-layout vocabulary of size ``v``: </s>=0, <unk>=1, ..., <pad>=v-1."""
    return ["</s>", "<unk>", *(f"t{i}" for i in range(2, v - 1)), "<pad>"]


def convert_to_ct2(hf_model: Any, workdir: Path) -> dict[str, Any]:
    """Save ``hf_model`` in ``workdir``, convert it with CTranslate2's converter, load a Translator per type.

    The random model has no tokenizer, so the converter is given a minimal stand-in (the vocabulary only).
    Returns ``{"float32": Translator, "int8": Translator}``, or ``{}`` when ctranslate2 is not installed.
    """
    try:
        import ctranslate2
        from ctranslate2.converters import TransformersConverter
    except ImportError:
        return {}
    v = hf_model.config.vocab_size
    vocab = {tok: i for i, tok in enumerate(marian_vocab(v))}

    class _VocabOnly:
        eos_token, unk_token, bos_token = "</s>", "<unk>", None

        def get_vocab(self) -> dict[str, int]:
            return vocab

    class _Converter(TransformersConverter):
        def load_tokenizer(self, *args: Any, **kwargs: Any) -> Any:
            return _VocabOnly()

    hf_dir, ct2_dir = workdir / "marian", workdir / "ct2"
    hf_model.save_pretrained(hf_dir)
    _Converter(str(hf_dir)).convert(str(ct2_dir), force=True)
    return {kind: ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type=kind, inter_threads=1,
                                         intra_threads=torch.get_num_threads()) for kind in ("float32", "int8")}


class EosMask:
    """Context manager: the first ``n_calls`` calls of ``head`` after :meth:`reset` get -inf at ``eos_id``.

    This holds aiayn's decoding to a fixed output length (like HF's min-length logits processor): EOS can only
    be chosen at the step where ``translate`` forces it. Costs one in-place write per step.
    """

    def __init__(self, head: nn.Module, eos_id: int, n_calls: int) -> None:
        self.head, self.eos_id, self.n_calls, self.calls = head, eos_id, n_calls, 0
        self._handle: Any = None

    def reset(self) -> None:
        """Start counting calls again (call before each decoding run)."""
        self.calls = 0

    def _hook(self, _module: nn.Module, _inputs: Any, logits: Tensor) -> Tensor:
        if self.calls < self.n_calls:
            logits[..., self.eos_id] = float("-inf")
        self.calls += 1
        return logits

    def __enter__(self) -> EosMask:
        self._handle = self.head.register_forward_hook(self._hook)
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.remove()


def run_case(size: Seq2SeqSize, ours: nn.Module, ours_int8: nn.Module, hf: Any, ct2: dict[str, Any], batch: int,
             src_len: int, out_len: int, runs: int, warmup: int = 1, beam: int = 4,
             alpha: float = 0.6) -> dict[str, Any]:
    """Time the systems on one batch size; returns one result row (sentences/s, ratios, output lengths)."""
    g = torch.Generator().manual_seed(batch)
    src = torch.randint(5, size.vocab_size - 2, (batch, src_len), generator=g)  # no special ids
    attn = torch.ones_like(src)
    ct2_src = [[f"t{i}" for i in row] for row in src.tolist()]
    out: dict[str, Any] = {}

    def run_aiayn(name: str, model: nn.Module, mask: EosMask) -> Any:
        def run() -> None:
            mask.reset()
            out[name] = translate(model, src, beam_size=beam, alpha=alpha, max_len_a=0.0, max_len_b=out_len,
                                  bos_id=BOS, eos_id=EOS, pad_id=PAD)
        return run

    def run_hf() -> None:
        with torch.inference_mode():
            out["hf"] = hf.generate(src, attention_mask=attn, num_beams=beam, length_penalty=alpha,
                                    do_sample=False, min_new_tokens=out_len, max_new_tokens=out_len + 1,
                                    early_stopping=False)

    def run_ct2(kind: str) -> Any:
        def run() -> None:
            out[f"ctranslate2-{kind}"] = ct2[kind].translate_batch(
                ct2_src, beam_size=beam, length_penalty=alpha, max_batch_size=0, min_decoding_length=out_len + 1,
                max_decoding_length=out_len + 1, return_end_token=True)
        return run

    masks = [EosMask(ours.lm_head, EOS, out_len), EosMask(ours_int8.lm_head, EOS, out_len)]
    fns = {"aiayn": run_aiayn("aiayn", ours, masks[0]), "aiayn-int8": run_aiayn("aiayn-int8", ours_int8, masks[1]),
           "transformers": run_hf}
    for kind in ct2:
        fns[f"ctranslate2-{kind}"] = run_ct2(kind)
    # the decoder's per-step linears (cross-attention K/V are projected once per sentence) and the output layer
    fns["matmul-floor"] = benchlib.matmul_floor(benchlib.step_linears(ours.decoder, skip=("kv_proj",))
                                                + [ours.lm_head.proj.weight.detach()], batch * beam, out_len + 1)
    with masks[0], masks[1]:
        times = benchlib.alternate(fns, runs=runs, warmup=warmup)
    lengths = {name: sorted({len(h[0].tokens) + 1 for h in out[name]}) for name in ("aiayn", "aiayn-int8")}
    lengths["transformers"] = [int(out["hf"].shape[1]) - 1]  # minus the decoder start token
    for kind in ct2:
        lengths[f"ctranslate2-{kind}"] = sorted({len(r.hypotheses[0]) for r in out[f"ctranslate2-{kind}"]})
    med = {k: benchlib.median(v) for k, v in times.items()}
    nan = float("nan")
    ct2_f32, ct2_i8 = med.get("ctranslate2-float32", nan), med.get("ctranslate2-int8", nan)
    row: dict[str, Any] = {
        "size": size.name, "batch": batch, "src_len": src_len, "steps": out_len + 1,
        "aiayn_sent_s": batch / med["aiayn"], "hf_sent_s": batch / med["transformers"],
        "ratio_vs_hf": med["transformers"] / med["aiayn"],
        "ct2_sent_s": batch / ct2_f32, "ratio_vs_ct2": ct2_f32 / med["aiayn"],
        "aiayn_int8_sent_s": batch / med["aiayn-int8"], "ct2_int8_sent_s": batch / ct2_i8,
        "int8_ratio_vs_hf": med["transformers"] / med["aiayn-int8"],
        "int8_ratio_vs_ct2_int8": ct2_i8 / med["aiayn-int8"],
        "floor_ms_per_step": 1e3 * med["matmul-floor"] / (out_len + 1),
        "fp32_bound_vs_hf": med["transformers"] / med["matmul-floor"],
        "out_lengths": lengths, "times": times,
    }
    return row


def bench_translate(sizes: list[Seq2SeqSize] | None = None, batches: tuple[int, ...] = (1, 32),
                    src_len: int = 20, out_len: int = 20, runs: int = 5, warmup: int = 1) -> dict[str, Any]:
    """The whole benchmark over sizes x batch sizes. Returns the JSON payload."""
    sizes = sizes or list(SIZES.values())
    rows = []
    for size in sizes:
        torch.manual_seed(0)
        ours, hf = aiayn_model(size), marian_model(size)
        ours_int8 = quantize_int8(ours)
        with tempfile.TemporaryDirectory(prefix="aiayn-bench-ct2-") as tmp:
            ct2 = convert_to_ct2(hf, Path(tmp))
            for b in batches:
                rows.append(run_case(size, ours, ours_int8, hf, ct2, b, src_len, out_len, runs, warmup))
            del ct2
    return {"sizes": [asdict(s) for s in sizes], "runs": runs, "beam": 4, "alpha": 0.6, "rows": rows}


COLUMNS = ["size", "batch", "src_len", "steps", "aiayn_sent_s", "hf_sent_s", "ct2_sent_s", "ratio_vs_hf",
           "ratio_vs_ct2", "aiayn_int8_sent_s", "ct2_int8_sent_s", "int8_ratio_vs_hf", "int8_ratio_vs_ct2_int8",
           "floor_ms_per_step", "fp32_bound_vs_hf"]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """CLI entry point: run, print the table, write ``bench/results/translate_beam.json``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    benchlib.add_common_args(p)  # --quick: multi30k size only, 3 runs
    p.add_argument("--sizes", nargs="+", choices=list(SIZES), default=None)
    args = p.parse_args(argv)
    benchlib.setup(args.threads)
    t0 = time.perf_counter()
    names = args.sizes or (["multi30k"] if args.quick else list(SIZES))
    payload = bench_translate([SIZES[n] for n in names], runs=args.runs or (3 if args.quick else 5))
    payload["wall_s"] = time.perf_counter() - t0
    print(f"beam-4 translation (alpha 0.6), median of {payload['runs']} alternating runs; sentences/s")
    print(benchlib.table(payload["rows"], COLUMNS))
    for r in payload["rows"]:
        print(f"  {r['size']} batch {r['batch']}: output lengths incl. EOS/last step {r['out_lengths']}")
    path = benchlib.write_results("translate_beam", payload, quick=args.quick)
    print(f"written {path} ({payload['wall_s']:.0f} s)")
    return payload


if __name__ == "__main__":
    main()
