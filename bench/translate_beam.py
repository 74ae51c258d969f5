"""Encoder-decoder beam search speed: aiayn ``translate`` vs HF ``MarianMTModel.generate`` vs CTranslate2.

All three run the paper's architecture (post-LN, ReLU, static sinusoidal positions, scaled and tied
embeddings) at the same sizes with beam 4 and length penalty 0.6, on the same random source batch. HF and
CTranslate2 share weights (the random Marian model is saved and converted with
``ctranslate2.converters.TransformersConverter``); aiayn has its own random weights (same shapes).

aiayn's contenders are the models ``load_pretrained`` gives users: the reference model accelerated for decoding
(:func:`aiayn.accel.accelerate`; ``AIAYN_ACCEL=none`` in the environment times the reference instead).

Each system also runs in int8: aiayn's opt-in int8 inference (:func:`aiayn.accel.quantize_int8`, ``--int8`` on the
command line) against CTranslate2 with ``compute_type="int8"``; int8 rows compare only with int8 rows (and with
transformers in fp32, which has no one-call int8 path for Marian's attention here).

And in bf16: aiayn's ``--dtype bfloat16`` (``aiayn.nn.precision.cast_for_inference``: the whole model in bf16,
then accelerated: every linear layer prepacked for oneDNN's bf16 kernels) against transformers' Marian model loaded
in bf16 (``dtype=torch.bfloat16``), same weights. CTranslate2 has no bf16 on CPU (its CPU compute types are int8, int16
and float32), so ``bf16_ratio_vs_ct2_fastest`` compares aiayn's bf16 with CTranslate2's fastest run of any
compute type and thread setting, int8 included. On a CPU without native bf16 matmuls (no AVX512-BF16 / AMX)
bf16 is slower than fp32 for every system.

Every system makes exactly ``out_len + 1`` decoder steps: aiayn gets a budget of ``out_len`` tokens (then EOS
is forced) and EOS is masked before that; HF gets ``min_new_tokens=out_len, max_new_tokens=out_len + 1`` (EOS
forced last); CTranslate2 gets ``min_decoding_length = max_decoding_length = out_len + 1``.

CTranslate2 runs in two thread settings, in fp32 and in int8 alike: like aiayn, one batch on all ``--threads``
threads (``intra_threads``), and as CTranslate2 recommends for throughput, ``--threads`` workers of one thread each
(``inter_threads``) with the batch split into that many parts (``max_batch_size``; at batch 1 this is simply one
thread). Which is faster depends on the host: on a 2-core Intel Xeon host (2026-11-23) the split setting
was 2.3x faster at batch 32 and one thread 4x faster at batch 1, so ``ratio_vs_ct2_best_config`` (and
``int8_ratio_vs_ct2_int8_best_config``) compares aiayn with the faster of the two; ``ratio_vs_ct2`` (and
``int8_ratio_vs_ct2_int8``) keeps the all-threads comparison.

A last timed entry, ``matmul-floor``, runs only the decoder's per-step linear layers and the output layer on
batch x beam rows for the same number of steps (:func:`benchlib.matmul_floor`): ``fp32_bound_vs_hf`` =
transformers' time / that floor is the most an fp32 implementation of these matmuls *through F.linear* could gain
over transformers (the encoder, attention and search are not even counted). aiayn's oneDNN-prepacked output layer
(:mod:`aiayn.accel.cpu.packed`) is faster than ``F.linear``, so at batch 32 its share of the floor is not a bound on
aiayn.

Each library runs in its own subprocess (``rounds`` turns of all of them, ``runs`` timed decodes per turn after a
warm-up): in one process, CTranslate2's threads alive beside torch's slowed aiayn's decode 4x,
and that process's order of contenders would decide the result. A library's variants (aiayn fp32, int8, bf16 and
the matmul floor; transformers fp32 and bf16; CTranslate2's four settings) share its child one after another, each
model freed before the next is built: a child per variant spent more of the suite starting interpreters and
importing libraries than decoding.

    .venv/bin/python bench/translate_beam.py          # multi30k and paper-base sizes, batch 1 and 32
    .venv/bin/python bench/translate_beam.py --quick
    .venv/bin/python bench/translate_beam.py --sizes multi30k --batches 16 --threads 1   # per core
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
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


def reference_model(size: Seq2SeqSize) -> nn.Module:
    """A random aiayn encoder-decoder of ``size`` (paper: post-LN, ReLU, sinusoidal, tied): the reference core's
    modules, in eval mode."""
    cfg = ModelConfig.preset("paper-base", d_model=size.d_model, d_ff=size.d_ff, n_heads=size.n_heads,
                             n_layers=size.n_layers, vocab_size=size.vocab_size, max_len=512, dropout=0.0)
    return build_model(cfg).eval()


def aiayn_model(size: Seq2SeqSize, variant: str = "float32") -> nn.Module:
    """:func:`reference_model` as ``load_pretrained`` gives it to users for decoding: accelerated, after its int8
    copy (``variant`` "int8") or bf16 cast ("bfloat16") where asked (:func:`benchlib.for_decoding`)."""
    return benchlib.for_decoding(reference_model(size), variant)


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


def save_and_convert(hf_model: Any, workdir: Path) -> bool:
    """Save ``hf_model`` to ``workdir/marian`` and convert it with CTranslate2's converter to ``workdir/ct2``.

    The random model has no tokenizer, so the converter is given a minimal stand-in (the vocabulary only).
    Returns False (nothing converted) when ctranslate2 is not installed.
    """
    hf_dir, ct2_dir = workdir / "marian", workdir / "ct2"
    hf_model.save_pretrained(hf_dir)
    try:
        from ctranslate2.converters import TransformersConverter
    except ImportError:
        return False
    vocab = {tok: i for i, tok in enumerate(marian_vocab(hf_model.config.vocab_size))}

    class _VocabOnly:
        eos_token, unk_token, bos_token = "</s>", "<unk>", None

        def get_vocab(self) -> dict[str, int]:
            return vocab

    class _Converter(TransformersConverter):
        def load_tokenizer(self, *args: Any, **kwargs: Any) -> Any:
            return _VocabOnly()

    _Converter(str(hf_dir)).convert(str(ct2_dir), force=True)
    return True


def convert_to_ct2(hf_model: Any, workdir: Path) -> dict[str, Any]:
    """:func:`save_and_convert`, then load a CTranslate2 ``Translator`` per compute type in this process.

    Returns ``{"float32": Translator, "int8": Translator}``, or ``{}`` when ctranslate2 is not installed.
    """
    if not save_and_convert(hf_model, workdir):
        return {}
    return {kind: load_contender(f"ctranslate2-{kind}", None, workdir) for kind in ("float32", "int8")}


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


CONTENDERS = ("aiayn", "aiayn-int8", "aiayn-bf16", "transformers", "transformers-bf16", "ctranslate2-float32",
              "ctranslate2-float32-parallel", "ctranslate2-int8", "ctranslate2-int8-parallel", "matmul-floor")


def make_runner(name: str, model: Any, size: Seq2SeqSize, batch: int, out_len: int, out: dict[str, Any],
                beam: int = 4, alpha: float = 0.6, src_len: int = 20) -> Any:
    """A zero-argument callable: one decode of contender ``name`` on the benchmark's random (batch, src_len) source.

    ``model`` is what the contender runs (an aiayn model, a Marian model, a CTranslate2 ``Translator``, or for
    ``matmul-floor`` the fp32 aiayn model whose decoder linears are timed). aiayn runs must be called inside
    their :class:`EosMask`, kept in ``out[name + "-mask"]``. The decode's output goes to ``out[name]``.
    """
    g = torch.Generator().manual_seed(batch)
    src = torch.randint(5, size.vocab_size - 2, (batch, src_len), generator=g)  # no special ids
    if name.startswith("aiayn"):
        mask = out[f"{name}-mask"] = EosMask(model.lm_head, EOS, out_len)

        def run_aiayn() -> None:
            mask.reset()
            out[name] = translate(model, src, beam_size=beam, alpha=alpha, max_len_a=0.0, max_len_b=out_len,
                                  bos_id=BOS, eos_id=EOS, pad_id=PAD)
        return run_aiayn
    if name.startswith("transformers"):
        attn = torch.ones_like(src)

        def run_hf() -> None:
            with torch.inference_mode():
                out[name] = model.generate(src, attention_mask=attn, num_beams=beam, length_penalty=alpha,
                                           do_sample=False, min_new_tokens=out_len, max_new_tokens=out_len + 1,
                                           early_stopping=False)
        return run_hf
    if name.startswith("ctranslate2"):
        ct2_src = [[f"t{i}" for i in row] for row in src.tolist()]
        # "-parallel": the batch split into one part per worker (CTranslate2's inter_threads), each on one thread
        parts = model.num_translators if name.endswith("-parallel") else 1
        max_batch = -(-batch // parts) if parts > 1 else 0

        def run_ct2() -> None:
            out[name] = model.translate_batch(ct2_src, beam_size=beam, length_penalty=alpha, max_batch_size=max_batch,
                                              min_decoding_length=out_len + 1, max_decoding_length=out_len + 1,
                                              return_end_token=True)
        return run_ct2
    if name == "matmul-floor":
        # the decoder's per-step linears (cross-attention K/V are projected once per sentence) and the output layer
        return benchlib.matmul_floor(benchlib.step_linears(model.decoder, skip=("kv_proj",))
                                     + [model.lm_head.proj.weight.detach()], batch * beam, out_len + 1)
    raise ValueError(f"unknown contender {name!r}; one of {CONTENDERS}")


def output_lengths(name: str, output: Any) -> list[int]:
    """The distinct output lengths (tokens incl. EOS / the forced last step) of one contender's decode."""
    if name.startswith("aiayn"):
        return sorted({len(h[0].tokens) + 1 for h in output})
    if name.startswith("transformers"):
        return [int(output.shape[1]) - 1]  # minus the decoder start token
    if name.startswith("ctranslate2"):
        return sorted({len(r.hypotheses[0]) for r in output})
    return []


def summarize(size: Seq2SeqSize, batch: int, out_len: int, times: dict[str, list[float]],
              lengths: dict[str, list[int]], src_len: int = 20) -> dict[str, Any]:
    """One result row (sentences/s, ratios, output lengths) from each contender's run times at one batch size."""
    med = {k: benchlib.median(v) for k, v in times.items()}
    best = {k: min(v) for k, v in times.items()}  # best-of-N: host steal time only ever slows a run down
    nan = float("nan")
    ct2_f32, ct2_i8 = med.get("ctranslate2-float32", nan), med.get("ctranslate2-int8", nan)

    def ct2_best(kind: str) -> float:  # the faster of CTranslate2's two thread settings
        configs = [med[k] for k in (f"ctranslate2-{kind}", f"ctranslate2-{kind}-parallel") if k in med]
        return min(configs) if configs else nan

    return {
        "size": size.name, "batch": batch, "src_len": src_len, "steps": out_len + 1,
        "aiayn_sent_s": batch / med["aiayn"], "hf_sent_s": batch / med["transformers"],
        "ratio_vs_hf": med["transformers"] / med["aiayn"],
        "ct2_sent_s": batch / ct2_f32, "ratio_vs_ct2": ct2_f32 / med["aiayn"],
        "best_ratio_vs_ct2": best.get("ctranslate2-float32", nan) / best["aiayn"],
        "ct2_parallel_sent_s": batch / med.get("ctranslate2-float32-parallel", nan),
        "ratio_vs_ct2_best_config": ct2_best("float32") / med["aiayn"],
        "aiayn_int8_sent_s": batch / med["aiayn-int8"], "ct2_int8_sent_s": batch / ct2_i8,
        "int8_ratio_vs_hf": med["transformers"] / med["aiayn-int8"],
        "int8_ratio_vs_ct2_int8": ct2_i8 / med["aiayn-int8"],
        "ct2_int8_parallel_sent_s": batch / med.get("ctranslate2-int8-parallel", nan),
        "int8_ratio_vs_ct2_int8_best_config": ct2_best("int8") / med["aiayn-int8"],
        "aiayn_bf16_sent_s": batch / med.get("aiayn-bf16", nan),
        "hf_bf16_sent_s": batch / med.get("transformers-bf16", nan),
        "bf16_ratio_vs_hf_bf16": med.get("transformers-bf16", nan) / med.get("aiayn-bf16", nan),
        "bf16_ratio_vs_hf": med["transformers"] / med.get("aiayn-bf16", nan),
        "bf16_ratio_vs_ct2_fastest": min(ct2_best("float32"), ct2_best("int8")) / med.get("aiayn-bf16", nan),
        "floor_ms_per_step": 1e3 * med["matmul-floor"] / (out_len + 1),
        "fp32_bound_vs_hf": med["transformers"] / med["matmul-floor"],
        "out_lengths": lengths, "times": times,
    }


def load_contender(name: str, size: Seq2SeqSize | None, workdir: Path) -> Any:
    """Build contender ``name``'s model in this process: aiayn's from the seed, the peers' from ``workdir``
    (the Marian model saved and converted by :func:`save_and_convert`)."""
    if name in ("aiayn", "aiayn-int8", "aiayn-bf16", "matmul-floor"):
        assert size is not None
        torch.manual_seed(0)
        return aiayn_model(size, {"aiayn-int8": "int8", "aiayn-bf16": "bfloat16"}.get(name, "float32"))
    if name.startswith("transformers"):
        from transformers import MarianMTModel

        dtype = torch.bfloat16 if name.endswith("-bf16") else torch.float32
        return MarianMTModel.from_pretrained(workdir / "marian", dtype=dtype).eval()
    import ctranslate2

    threads = torch.get_num_threads()
    if name.endswith("-parallel"):  # CTranslate2's throughput setting: `threads` workers of one thread each
        inter, intra = threads, 1
    else:  # one batch on all threads, as aiayn runs it
        inter, intra = 1, threads
    return ctranslate2.Translator(str(workdir / "ct2"), device="cpu", compute_type=name.split("-")[1],
                                  inter_threads=inter, intra_threads=intra)


def time_contender(name: str, size: Seq2SeqSize, batches: list[int], workdir: Path, runs: int, warmup: int = 1,
                   src_len: int = 20, out_len: int = 20) -> dict[str, Any]:
    """Time only contender ``name`` (this process holds no other system): ``runs`` decodes per batch size after
    ``warmup``. Returns ``{batch: {"times": [s, ...], "lengths": [...]}}`` (batch as a string, for JSON)."""
    model = load_contender(name, size, workdir)
    result = {}
    for batch in batches:
        out: dict[str, Any] = {}
        fn = make_runner(name, model, size, batch, out_len, out, src_len=src_len)
        mask = out.get(f"{name}-mask")
        with mask if mask is not None else contextlib.nullcontext():
            times = benchlib.alternate({name: fn}, runs=runs, warmup=warmup)[name]
        result[str(batch)] = {"times": times, "lengths": output_lengths(name, out.get(name))}
    return result


def time_group(names: list[str], size: Seq2SeqSize, batches: list[int], workdir: Path, runs: int,
               warmup: int = 1, src_len: int = 20, out_len: int = 20) -> dict[str, Any]:
    """:func:`time_contender` for each of ``names`` in turn, each model freed before the next is built (so only
    one system is alive at a time). Returns ``{name: time_contender's result}``."""
    result = {}
    for name in names:
        result[name] = time_contender(name, size, batches, workdir, runs, warmup, src_len, out_len)
        gc.collect()
    return result


def contender_groups(names: list[str]) -> list[list[str]]:
    """``names`` split by the library that runs them (aiayn and the matmul floor on torch alone, transformers,
    CTranslate2), in their order: each group shares one child process, since a library's own variants share its
    thread pool anyway, while two libraries' pools alive in one process disturb each other."""
    def library(name: str) -> str:
        return "aiayn" if name == "matmul-floor" else name.split("-")[0]

    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(library(name), []).append(name)
    return list(groups.values())


def child(names: list[str], size: Seq2SeqSize, batches: list[int], workdir: Path, runs: int, threads: int,
          warmup: int = 1, src_len: int = 20, out_len: int = 20) -> dict[str, Any]:
    """Run :func:`time_group` in a fresh interpreter (so no other library's threads share the process)."""
    spec = {"size": asdict(size), "batches": batches, "workdir": str(workdir), "runs": runs, "warmup": warmup,
            "src_len": src_len, "out_len": out_len}
    cmd = [sys.executable, __file__, "--child", ",".join(names), "--spec", json.dumps(spec),
           "--threads", str(threads)]
    return benchlib.run_json_child(cmd)


DEFAULT_BATCHES = (1, 32)


def bench_translate(sizes: list[Seq2SeqSize] | None = None, batches: tuple[int, ...] = DEFAULT_BATCHES,
                    src_len: int = 20, out_len: int = 20, rounds: int = 2, runs: int = 3, warmup: int = 1,
                    threads: int = benchlib.THREADS, bf16: bool = True) -> dict[str, Any]:
    """The whole benchmark over sizes x batch sizes (the bf16 contenders only when ``bf16``). Each contender runs in
    its library's subprocess (:func:`contender_groups`), ``rounds`` times in turn (aiayn, its int8 and bf16 and
    the matmul floor; transformers in fp32 and bf16; CTranslate2 fp32 and int8; then again), ``runs`` timed
    decodes per batch size each time after one warm-up: ``rounds * runs`` times per median.
    Returns the JSON payload.
    """
    sizes = sizes or list(SIZES.values())
    rows = []
    for size in sizes:
        torch.manual_seed(0)
        reference_model(size)  # the Marian weights come after it in the seed's stream, as they always have
        hf = marian_model(size)
        with tempfile.TemporaryDirectory(prefix="aiayn-bench-ct2-") as tmp:
            has_ct2 = save_and_convert(hf, Path(tmp))
            names = [n for n in CONTENDERS if (has_ct2 or not n.startswith("ctranslate2"))
                     and (bf16 and benchlib.has_bf16_inference() or not n.endswith("-bf16"))]
            del hf
            got: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
            for _ in range(rounds):
                for group in contender_groups(names):
                    for name, res in child(group, size, list(batches), Path(tmp), runs, threads, warmup,
                                           src_len, out_len).items():
                        got[name].append(res)
        for b in batches:
            times = {n: [t for r in got[n] for t in r[str(b)]["times"]] for n in names}
            lengths = {n: got[n][0][str(b)]["lengths"] for n in names if n != "matmul-floor"}
            rows.append(summarize(size, b, out_len, times, lengths, src_len))
    return {"sizes": [asdict(s) for s in sizes], "rounds": rounds, "runs_per_round": runs, "isolated": True,
            "beam": 4, "alpha": 0.6, "rows": rows}


COLUMNS = ["size", "batch", "src_len", "steps", "aiayn_sent_s", "hf_sent_s", "ct2_sent_s", "ratio_vs_hf",
           "ratio_vs_ct2", "best_ratio_vs_ct2", "ct2_parallel_sent_s", "ratio_vs_ct2_best_config",
           "aiayn_int8_sent_s", "ct2_int8_sent_s", "int8_ratio_vs_hf", "int8_ratio_vs_ct2_int8",
           "ct2_int8_parallel_sent_s", "int8_ratio_vs_ct2_int8_best_config", "aiayn_bf16_sent_s", "hf_bf16_sent_s",
           "bf16_ratio_vs_hf_bf16", "bf16_ratio_vs_hf", "bf16_ratio_vs_ct2_fastest", "floor_ms_per_step",
           "fp32_bound_vs_hf"]


def results_name(batches: tuple[int, ...], threads: int) -> str:
    """The results file's stem: ``translate_beam`` for the default batches and threads, else one naming both."""
    if batches == DEFAULT_BATCHES and threads == benchlib.THREADS:
        return "translate_beam"
    return f"translate_beam-batch{'-'.join(map(str, batches))}-threads{threads}"


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    """CLI entry point: run, print the table, write ``bench/results/translate_beam.json``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    benchlib.add_common_args(p, runs=None)  # --quick: multi30k size only, 2 rounds
    p.add_argument("--runs", type=int, default=None,
                   help="timed decodes per turn after a warm-up (default 3; 2 with --quick)")
    p.add_argument("--sizes", nargs="+", choices=list(SIZES), default=None)
    p.add_argument("--rounds", type=int, default=None, help="turns of every contender's subprocess (default 2)")
    p.add_argument("--batches", nargs="+", type=int, default=None,
                   help="sentences per decode (default 1 and 32); other batch sizes or --threads write "
                        "translate_beam-batch<N>[-<N>...]-threads<T>.json")
    benchlib.add_bf16_arg(p)
    p.add_argument("--child", metavar="CONTENDER[,CONTENDER...]", help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    batches = tuple(args.batches or DEFAULT_BATCHES)
    if min(batches) < 1:
        p.error(f"--batches {' '.join(map(str, batches))}: give positive numbers of sentences")
    benchlib.setup(args.threads)
    if args.child:
        spec = json.loads(args.spec)
        names = args.child.split(",")
        if unknown := [n for n in names if n not in CONTENDERS]:
            p.error(f"--child {args.child}: unknown contender(s) {unknown}; each one of {CONTENDERS}")
        print(json.dumps(time_group(names, Seq2SeqSize(**spec["size"]), spec["batches"], Path(spec["workdir"]),
                                    spec["runs"], spec["warmup"], spec["src_len"], spec["out_len"])))
        return None
    t0 = time.perf_counter()
    names = args.sizes or (["multi30k"] if args.quick else list(SIZES))
    payload = bench_translate([SIZES[n] for n in names], batches=batches,
                              rounds=args.rounds or 2, runs=args.runs or (2 if args.quick else 3),
                              threads=args.threads, bf16=benchlib.wants_bf16(args.bf16))
    payload["wall_s"] = time.perf_counter() - t0
    print(f"beam-4 translation (alpha 0.6), each library in its own process; median of {payload['rounds']} rounds "
          f"x {payload['runs_per_round']} runs; sentences/s")
    print(benchlib.table(payload["rows"], COLUMNS))
    for r in payload["rows"]:
        print(f"  {r['size']} batch {r['batch']}: output lengths incl. EOS/last step {r['out_lengths']}")
    path = benchlib.write_results(results_name(batches, args.threads), payload, quick=args.quick)
    print(f"written {path} ({payload['wall_s']:.0f} s)")
    return payload


if __name__ == "__main__":
    main()
