"""Encoder-decoder beam search speed: aiayn ``translate`` vs HF ``MarianMTModel.generate`` vs CTranslate2.

All three run the paper's architecture (post-LN, ReLU, static sinusoidal positions, scaled and tied
embeddings) at the same sizes with beam 4 and length penalty 0.6, on the same random source batch. HF and
CTranslate2 share weights (the random Marian model is saved and converted with
``ctranslate2.converters.TransformersConverter``); aiayn has its own random weights (same shapes).

Every system makes exactly ``out_len + 1`` decoder steps: aiayn gets a budget of ``out_len`` tokens (then EOS
is forced) and EOS is masked before that; HF gets ``min_new_tokens=out_len, max_new_tokens=out_len + 1`` (EOS
forced last); CTranslate2 gets ``min_decoding_length = max_decoding_length = out_len + 1``.

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
    """A random aiayn encoder-decoder of ``size`` (paper: post-LN, ReLU, sinusoidal, tied), in eval mode."""
    cfg = ModelConfig.preset("paper-base", d_model=size.d_model, d_ff=size.d_ff, n_heads=size.n_heads,
                             n_layers=size.n_layers, vocab_size=size.vocab_size, max_len=512, dropout=0.0)
    return build_model(cfg).eval()


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


def convert_to_ct2(hf_model: Any, workdir: Path) -> Any:
    """Save ``hf_model`` in ``workdir``, convert it with CTranslate2's converter, load a Translator.

    The random model has no tokenizer, so the converter is given a minimal stand-in (the vocabulary only).
    Returns None when ctranslate2 is not installed.
    """
    try:
        import ctranslate2
        from ctranslate2.converters import TransformersConverter
    except ImportError:
        return None
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
    return ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type="float32", inter_threads=1,
                                  intra_threads=torch.get_num_threads())


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


def run_case(size: Seq2SeqSize, ours: nn.Module, hf: Any, ct2: Any, batch: int, src_len: int, out_len: int,
             runs: int, warmup: int = 1, beam: int = 4, alpha: float = 0.6) -> dict[str, Any]:
    """Time the systems on one batch size; returns one result row (sentences/s, ratios, output lengths)."""
    g = torch.Generator().manual_seed(batch)
    src = torch.randint(5, size.vocab_size - 2, (batch, src_len), generator=g)  # no special ids
    attn = torch.ones_like(src)
    ct2_src = [[f"t{i}" for i in row] for row in src.tolist()]
    out: dict[str, Any] = {}

    def run_ours() -> None:
        mask.reset()
        out["aiayn"] = translate(ours, src, beam_size=beam, alpha=alpha, max_len_a=0.0, max_len_b=out_len,
                                 bos_id=BOS, eos_id=EOS, pad_id=PAD)

    def run_hf() -> None:
        with torch.inference_mode():
            out["hf"] = hf.generate(src, attention_mask=attn, num_beams=beam, length_penalty=alpha,
                                    do_sample=False, min_new_tokens=out_len, max_new_tokens=out_len + 1,
                                    early_stopping=False)

    def run_ct2() -> None:
        out["ct2"] = ct2.translate_batch(ct2_src, beam_size=beam, length_penalty=alpha, max_batch_size=0,
                                         min_decoding_length=out_len + 1, max_decoding_length=out_len + 1,
                                         return_end_token=True)

    fns = {"aiayn": run_ours, "transformers": run_hf}
    if ct2 is not None:
        fns["ctranslate2"] = run_ct2
    mask = EosMask(ours.lm_head, EOS, out_len)
    with mask:
        times = benchlib.alternate(fns, runs=runs, warmup=warmup)
    lengths = {
        "aiayn": sorted({len(h[0].tokens) + 1 for h in out["aiayn"]}),  # + the forced EOS
        "transformers": [int(out["hf"].shape[1]) - 1],  # minus the decoder start token
    }
    if ct2 is not None:
        lengths["ctranslate2"] = sorted({len(r.hypotheses[0]) for r in out["ct2"]})
    med = {k: benchlib.median(v) for k, v in times.items()}
    row: dict[str, Any] = {
        "size": size.name, "batch": batch, "src_len": src_len, "steps": out_len + 1,
        "aiayn_sent_s": batch / med["aiayn"], "hf_sent_s": batch / med["transformers"],
        "ratio_vs_hf": med["transformers"] / med["aiayn"],
        "ct2_sent_s": batch / med["ctranslate2"] if ct2 is not None else float("nan"),
        "ratio_vs_ct2": med["ctranslate2"] / med["aiayn"] if ct2 is not None else float("nan"),
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
        with tempfile.TemporaryDirectory(prefix="aiayn-bench-ct2-") as tmp:
            ct2 = convert_to_ct2(hf, Path(tmp))
            for b in batches:
                rows.append(run_case(size, ours, hf, ct2, b, src_len, out_len, runs, warmup))
            del ct2
    return {"sizes": [asdict(s) for s in sizes], "runs": runs, "beam": 4, "alpha": 0.6, "rows": rows}


COLUMNS = ["size", "batch", "src_len", "steps", "aiayn_sent_s", "hf_sent_s", "ct2_sent_s", "ratio_vs_hf",
           "ratio_vs_ct2"]


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
