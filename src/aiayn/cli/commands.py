"""Subcommands of ``aiayn``. Each registers ``setup(parser)`` that adds its arguments and sets ``run``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from aiayn.checkpoint import periodic_checkpoints, write_average
from aiayn.cli.values import device_name, number, output_file, whole
from aiayn.config import ModelConfig
from aiayn.errors import AiaynError, where
from aiayn.generate.inputs import ON_LONG, check_lengths, check_unknown, input_name, is_blank
from aiayn.generate.translate import DECODE_DEFAULTS, max_output_length, source_ids, source_limit
from aiayn.models.build import build_model
from aiayn.pretrained import load_pretrained, refuse_run_folder
from aiayn.threads import announce_threads

REGISTRY: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {}


def command(name: str, help_text: str):
    """Register a subcommand's parser setup."""
    def register(setup: Callable[[argparse.ArgumentParser], None]):
        REGISTRY[name] = (help_text, setup)
        return setup
    return register


def _read_input(path: str | None) -> list[str]:
    """The lines of ``path`` (plain or .gz), or of stdin for ``None`` and ``-``, without their line ends."""
    if path is None or path == "-":
        return [line.rstrip("\n").removesuffix("\r") for line in sys.stdin]
    from aiayn.data.text_io import read_lines  # lazy: loaded when the command runs

    return read_lines(path)


def _add_decode_args(p: argparse.ArgumentParser, batch_help: str = "sentences decoded together (default 64)") -> None:
    """``--beam``, ``--alpha``, ``--batch-size``: beam search settings of translate and evaluate."""
    p.add_argument("--beam", type=whole(1), default=None,
                   help="beam size, at most the target vocabulary's size (default: the checkpoint's [decode] beam, "
                        "else 4)")
    p.add_argument("--alpha", type=number(0), default=None,
                   help="GNMT length penalty alpha, >= 0 (default: the checkpoint's [decode] alpha, else 0.6)")
    p.add_argument("--batch-size", type=whole(1), default=64, help=batch_help)


def _add_on_long_arg(p: argparse.ArgumentParser, what: str) -> None:
    """``--on-long``: what an input longer than the model takes does (see :mod:`aiayn.generate.inputs`)."""
    p.add_argument("--on-long", choices=ON_LONG, default="warn",
                   help=f"an input longer than the model takes: warn (default: {what}, and a warning on stderr "
                        "names the input, its length in tokens and the model's limit), error (stop before decoding "
                        "anything, exit 2) or truncate (cut without a warning)")


def _warn(command: str, messages: list[str]) -> None:
    """Print warnings on stderr as ``aiayn COMMAND: warning: ...``."""
    for m in messages:
        print(f"aiayn {command}: warning: {m}", file=sys.stderr)


def _add_load_args(p: argparse.ArgumentParser) -> None:
    """``--device``, ``--int8``, ``--dtype`` and ``--adapter``: how an inference command loads its checkpoint (see
    :func:`_load`)."""
    p.add_argument("--device", default="auto",
                   help="cpu, cuda, cuda:N or auto (default: cuda if available; cpu with --int8)")
    p.add_argument("--int8", action="store_true",
                   help="CPU inference with int8 linear layers: a quarter of the weight bytes, faster decoding for "
                        "models 256 wide and up; outputs close to but not equal to fp32")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                   help="inference precision of the whole model (default float32). bfloat16: faster on CPUs with "
                        "native bf16 (AVX512-BF16/AMX) and on GPUs, outputs close to fp32's; float16: CUDA only")
    p.add_argument("--adapter", default=None, metavar="DIR",
                   help="the checkpoint of a LoRA run ([train] adapter = \"lora\") on the base --checkpoint: its "
                        "adapters are folded in at load (the base model's speed); the base is checked against the one "
                        "they were trained on (a PEFT folder: aiayn convert --from-hf DIR --base BASE first)")


def _add_attention_arg(p: argparse.ArgumentParser, what: str) -> None:
    """``--attention OUT.json``: the attention weights of the output, as ``aiayn inspect`` records them."""
    p.add_argument("--attention", metavar="OUT.json",
                   help=f"also write the attention weights of {what} (every layer and head, read in one pass over "
                        "the output; docs/inspect.md) to this JSON file")


def write_attention(path: str, pre: Any, texts: list[str], **options: Any) -> None:
    """Write ``{"records": [...]}`` to ``path``: one full-precision inspection record per text (None for a blank
    one; :func:`aiayn.inspect.inspect_text`)."""
    from aiayn.data.text_io import atomic_write_text  # lazy: loaded when the command runs
    from aiayn.inspect import inspect_text

    records = [inspect_text(pre, t, digits=None, **options) if t.strip() else None for t in texts]
    atomic_write_text(path, json.dumps({"records": records}))
    print(f"wrote the attention of {sum(r is not None for r in records)} input(s) to {path}", file=sys.stderr)


def _add_ensemble_checkpoint_arg(p: argparse.ArgumentParser) -> None:
    """``--checkpoint DIR``, repeatable: several checkpoints decode as an ensemble (see :func:`_load_ensemble`)."""
    p.add_argument("--checkpoint", required=True, action="append",
                   help="checkpoint directory (e.g. runs/demo/best); give it more than once to decode with an "
                        "ensemble (the mean of the models' next-token distributions; same tokenizers needed)")


def _load(args: argparse.Namespace, directory: str | None = None):
    """Load ``--checkpoint`` (or ``directory``) on ``--device`` (``auto`` means the CPU with ``--int8``),
    int8-quantized or cast to ``--dtype`` if asked, with ``--adapter``'s adapters folded in."""
    from aiayn.devices import pick_device  # lazy: loaded when the command runs

    device = "cpu" if args.int8 and args.device == "auto" else device_name(args.device)
    loaded = load_pretrained(directory or args.checkpoint, pick_device(device), int8=args.int8, dtype=args.dtype,
                             adapter=getattr(args, "adapter", None))
    announce_threads()  # the start-up thread choice, said once the checkpoint loaded
    return loaded


def _load_ensemble(args: argparse.Namespace) -> list:
    """Load every ``--checkpoint`` (a list, see :func:`_add_ensemble_checkpoint_arg`) with :func:`_load`.

    Several checkpoints must be of one task, with the same tokenizers and the same lower-casing.
    """
    dirs = args.checkpoint
    if len(dirs) > 1 and getattr(args, "adapter", None):
        raise AiaynError("--adapter adapts one base checkpoint; give one --checkpoint with it (or merge each "
                         "adapter first: aiayn merge-adapter)")
    loaded = [_load(args, d) for d in dirs]
    first = loaded[0]
    for d, pre in zip(dirs[1:], loaded[1:]):
        if pre.task != first.task:
            raise AiaynError(f"{d}: a {pre.task!r} checkpoint, but {dirs[0]} is {first.task!r}; "
                             "an ensemble needs checkpoints of one task")
        if ({r: t.to_dict() for r, t in pre.tokenizers.items()}
                != {r: t.to_dict() for r, t in first.tokenizers.items()}):
            raise AiaynError(f"{d}: its tokenizers differ from those of {dirs[0]}; an ensemble needs models "
                             "trained with the same tokenizer files (same data and tokenizer settings)")
        if bool(pre.meta.get("lowercase")) != bool(first.meta.get("lowercase")):
            raise AiaynError(f"{d}: lowercase={bool(pre.meta.get('lowercase'))} but {dirs[0]} has "
                             f"lowercase={bool(first.meta.get('lowercase'))}; an ensemble needs models trained "
                             "alike")
    return loaded


# ---------------------------------------------------------------------------------------------- train
@command("train", "Train a model from a recipe (TOML), with section.key=value overrides. Ctrl-C, SIGTERM, SIGHUP "
                  "and SIGUSR1 save the last whole step to train.out_dir/last and print the command that continues "
                  "the run (exit status 128 + the signal's number).")
def _train(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", help="recipe file, e.g. recipes/multi30k-en-de.toml")
    p.add_argument("overrides", nargs="*", help="overrides such as train.max_steps=200 model.d_model=256")
    p.add_argument("--resume", action="store_true", help="continue the run in train.out_dir from its last/ checkpoint")
    p.add_argument("--nproc", type=whole(1), default=1, metavar="N",
                   help="data-parallel training on N processes of this machine, launched by torch.distributed.run "
                        "(CPU: gloo, the cores shared out; CUDA: NCCL, one GPU each; train.parallel picks ddp or "
                        "fsdp); each optimizer step then takes N x train.accum batches, as one process with "
                        "train.accum multiplied by N would (default 1). Several machines: torchrun -m aiayn train "
                        "(docs/distributed.md)")
    p.add_argument("--data-dir", metavar="DIR", default=None,
                   help="read every [data] file from DIR by its file name (data kept elsewhere, or a stand-in of the "
                        "same layout: aiayn data standin wmt14)")
    p.add_argument("--dry-run", action="store_true",
                   help="check a translation recipe end to end and plan its run, writing nothing: validate, read the "
                        "data, train the tokenizer in memory, build the model, print its parameters by part, tokens "
                        "per step and memory per rank, time a few steps on this device and estimate the time of "
                        "train.max_steps and the GPU-hours on named GPUs")
    p.add_argument("--dry-run-steps", type=whole(0), default=3, metavar="N",
                   help="with --dry-run: optimizer steps timed after one warm-up step (default 3; 0: none)")
    p.add_argument("--dry-run-tokens", type=whole(1), default=None, metavar="T",
                   help="with --dry-run: padded tokens a side per micro-batch of the timed steps (default: the "
                        "recipe's on CUDA, 256 on the CPU)")

    def run(args: argparse.Namespace) -> int:
        from aiayn.tasks.registry import run_recipe  # lazy: loaded when the command runs

        if args.dry_run:
            return _dry_run(args)
        if args.nproc == 1:
            run_recipe(args.recipe, args.overrides, resume=args.resume, data_dir=args.data_dir)
            return 0
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise AiaynError("--nproc cannot be used inside a torchrun launch; give torchrun --nproc-per-node")
        from aiayn.program import RESUME_COMMAND_VAR, command  # lazy: loaded when the command runs
        from aiayn.train.distributed import launch

        # the ranks get --accel and --threads through the environment (AIAYN_ACCEL, OMP_NUM_THREADS), and the
        # command that resumes the run as the user would type it
        again = command("train", args.recipe, *args.overrides, "--nproc", str(args.nproc), "--resume")
        data = ["--data-dir", args.data_dir] if args.data_dir else []
        launch(args.nproc, ["train", args.recipe, *args.overrides, *data, *(["--resume"] if args.resume else [])],
               env={RESUME_COMMAND_VAR: again})
        return 0

    p.set_defaults(run=run)


def _dry_run(args: argparse.Namespace) -> int:
    """``aiayn train RECIPE --dry-run``: the recipe checked and its run planned (aiayn.tasks.dry_run)."""
    from aiayn.tasks.dry_run import dry_run, format_report  # lazy: loaded when the command runs

    if args.resume or args.nproc != 1:
        raise AiaynError("--dry-run plans a new run in this process; leave out --resume and --nproc")
    started = time.time()
    result = dry_run(args.recipe, args.overrides, data_dir=args.data_dir, steps=args.dry_run_steps,
                     step_tokens=args.dry_run_tokens)
    print(format_report(result, time.time() - started), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------- translate
@command("translate", "Translate sentences (a file or stdin, one per line) with beam search. A blank line gives a "
                      "blank line; a line longer than the model takes is cut and named on stderr (--on-long), and so "
                      "is a line more than one in ten of whose tokens the tokenizer does not know.")
def _translate(p: argparse.ArgumentParser) -> None:
    _add_ensemble_checkpoint_arg(p)
    p.add_argument("--input", "-i", help="source file (plain or .gz); default stdin")
    p.add_argument("--output", "-o", help="output file; default stdout")
    _add_decode_args(p)
    p.add_argument("--n-best", type=whole(1), default=1,
                   help="print the n best translations, separated by ' ||| ' (at most the beam size)")
    _add_on_long_arg(p, "translate its first max_len tokens")
    _add_attention_arg(p, "each line's translation")
    _add_load_args(p)

    def run(args: argparse.Namespace) -> int:
        output_file(args.output, "--output")
        output_file(args.attention, "--attention")
        loaded = _load_ensemble(args)
        if loaded[0].task != "translation":
            raise AiaynError(f"{args.checkpoint[0]}: a {loaded[0].task!r} checkpoint; translate needs a translation "
                             "model")
        if args.attention and len(loaded) > 1:
            raise AiaynError("--attention reads one model's attention; give one --checkpoint")
        lines = _read_input(args.input)
        outs = _translate_lines(loaded, args, lines, n_best=args.n_best, source=args.input)
        text = [o if isinstance(o, str) else " ||| ".join(o) for o in outs]
        _write_output(args.output, text)
        if args.attention:
            lower = [x.lower() for x in lines] if loaded[0].meta.get("lowercase") else lines
            write_attention(args.attention, loaded[0], lower, beam=args.beam, alpha=args.alpha)
        return 0

    p.set_defaults(run=run)


def _translate_lines(loaded: list, args: argparse.Namespace, lines: list[str], n_best: int = 1,
                     source: str | None = None, command_name: str = "translate") -> list:
    """Translate ``lines`` (read from ``source``; None: stdin) with the loaded translation checkpoint(s) (several:
    an ensemble), lower-cased if the models were trained so, with ``--beam``/``--alpha``/``--batch-size`` or the
    checkpoint's [decode] defaults.

    A blank line becomes an empty string without a model call. Lines longer than the model's ``max_len`` (counting
    a pretrained vocabulary's framing tokens, :func:`~aiayn.generate.translate.source_ids`) follow
    ``--on-long`` (warnings and errors name ``source:line``), and lines more than 10% of whose tokens are unknown to
    the tokenizer are warned about.
    """
    from aiayn.tasks.translation import translate_texts  # lazy: loaded when the command runs

    pre = loaded[0]
    if pre.meta.get("lowercase"):
        lines = [x.lower() for x in lines]
    checkpoint = (getattr(args, "checkpoint", None) or ["checkpoint"])[0]
    dec = _decode_settings(pre.meta.get("decode", {}), args, pre.tokenizers["tgt"].vocab_size, n_best, checkpoint)
    models = [x.model for x in loaded]
    src_tok = pre.tokenizers["src"]
    a, b = dec["max_len_a"], dec["max_len_b"]
    ids = src_tok.encode_batch(lines)
    keep = [i for i, (text, row) in enumerate(zip(lines, ids)) if not is_blank(text, row)]
    name = input_name(source)
    names = [where(name, i + 1) for i in keep]
    limit = source_limit(models)
    cap = max_output_length(models, limit, a, b)
    _warn(command_name, check_lengths(
        [len(source_ids(src_tok, lines[i])) for i in keep], limit, getattr(args, "on_long", "warn"), names,
        fix="split the line",
        effect=f"only its first {limit} tokens are translated, and the translation has at most {cap} tokens"))
    _warn(command_name, check_unknown([ids[i] for i in keep], src_tok.unk_id, names))
    outs = translate_texts(models, src_tok, pre.tokenizers["tgt"], [lines[i] for i in keep],
                           beam=dec["beam"], alpha=dec["alpha"], max_len_a=a, max_len_b=b,
                           batch_size=args.batch_size, n_best=n_best,
                           forced_bos_id=_forced_bos_id(dec, pre.tokenizers["tgt"].vocab_size, checkpoint))
    result: list = [""] * len(lines)
    for i, out in zip(keep, outs):
        result[i] = out
    return result


def _decode_settings(saved: dict, args: argparse.Namespace, vocab_size: int, n_best: int,
                     checkpoint: str) -> dict:
    """The beam search settings: ``--beam``/``--alpha`` over the checkpoint's ``decode`` entry (``saved``) over the
    defaults, each checked: the beam (at most ``vocab_size``, the target vocabulary's size) and ``--n-best``
    (``n_best``, at most the beam).

    Raises:
        AiaynError: naming the option, or ``config.json``'s key, and the fix.
    """
    from aiayn.train.recipe import section_problems  # lazy: loaded when the command runs

    if not isinstance(saved, dict):
        saved = {"decode": saved}  # reported below as an unknown key
    problems = section_problems({k: v for k, v in saved.items() if k != "forced_bos_id"}, DECODE_DEFAULTS, "decode")
    if problems:
        raise AiaynError(f"{Path(checkpoint) / 'config.json'}: {problems[0]}; correct the file or retrain")
    dec = {**DECODE_DEFAULTS, **saved}
    if getattr(args, "beam", None) is not None:
        dec["beam"] = args.beam
    if getattr(args, "alpha", None) is not None:
        dec["alpha"] = args.alpha
    flag = "--beam" if getattr(args, "beam", None) is not None else f"{checkpoint}'s decode.beam"
    if dec["beam"] > vocab_size:
        raise AiaynError(f"{flag} {dec['beam']}: more than the {vocab_size} tokens of the target vocabulary; give a "
                         f"beam of at most {vocab_size}")
    if n_best > dec["beam"]:
        raise AiaynError(f"--n-best {n_best}: more than the beam ({dec['beam']}) keeps; lower --n-best or raise "
                         "--beam")
    return dec


def _forced_bos_id(dec: dict, size: int, checkpoint: str) -> int | None:
    """The checkpoint's ``decode.forced_bos_id`` (a token every translation begins with), checked against the
    target vocabulary's ``size``."""
    forced = dec.get("forced_bos_id")
    if forced is not None and (not isinstance(forced, int) or isinstance(forced, bool) or not 0 <= forced < size):
        raise AiaynError(f"{Path(checkpoint) / 'config.json'}: decode.forced_bos_id = {forced!r} is not a token id "
                         f"of the target vocabulary (0 to {size - 1}); correct it or remove the key")
    return forced


def _write_output(path: str | None, lines: list[str]) -> None:
    if path is None or path == "-":
        for line in lines:
            print(line)
        return
    from aiayn.data.text_io import write_lines  # lazy: loaded when the command runs

    write_lines(path, lines)


# ---------------------------------------------------------------------------------------------- evaluate
@command("evaluate", "Score a checkpoint on a file: sacreBLEU/chrF (translation; --src/--ref; source lines too long "
                     "for the model or mostly unknown to the tokenizer are named on stderr, as by translate), "
                     "perplexity and bits per character (lm; --data; strided windows, --batch-size of them per forward "
                     "pass, a progress bar on stderr), accuracy/P/R/F1/confusion matrix (classification and image "
                     "classification; --data).")
def _evaluate(p: argparse.ArgumentParser) -> None:
    _add_ensemble_checkpoint_arg(p)
    p.add_argument("--src", help="source file (translation)")
    p.add_argument("--ref", help="reference file (translation)")
    p.add_argument("--data", help="text file or folder (lm), label<TAB>text TSV/CSV (classification), or a "
                                  "folder of class-named image subfolders or sklearn-digits (image classification: "
                                  "the checkpoint's held-out digits)")
    p.add_argument("--context", type=whole(2), default=None,
                   help="lm: window length in tokens, at least 2 (default: block size)")
    p.add_argument("--stride", type=whole(1), default=None,
                   help="lm: window step, below the context (default: context // 2)")
    p.add_argument("--hyp-out", help="also write the translations here")
    p.add_argument("--paper-bleu", metavar="LANG", default=None,
                   help="translation: also report BLEU as the paper reports WMT 2014 (tokenized, cased; with "
                        "tensor2tensor's compound splitting when LANG, the target language, is de)")
    _add_decode_args(p, batch_help="sentences decoded together (translation), texts or images (classification) or "
                                   "context windows (lm) per forward pass (default 64)")
    _add_load_args(p)

    def run(args: argparse.Namespace) -> int:
        output_file(args.hyp_out, "--hyp-out")
        loaded = _load_ensemble(args)
        pre = loaded[0]
        if pre.task == "translation":
            return _evaluate_translation(loaded, args)
        if pre.task not in ("lm", "classification", "image_classification"):
            raise AiaynError(f"{args.checkpoint[0]}: evaluation of {pre.task!r} checkpoints is not supported")
        if len(loaded) > 1:
            raise AiaynError(f"ensembles are evaluated for translation only; give one --checkpoint for a {pre.task} "
                             "model")
        if not args.data:
            raise AiaynError(f"evaluating a {pre.task} checkpoint needs --data FILE")
        from aiayn.evaluate.run import evaluate_classifier, evaluate_lm  # lazy: loaded when the command runs

        if pre.task == "lm":
            result = evaluate_lm(pre, args.data, context=args.context, stride=args.stride,
                                 batch_size=args.batch_size, progress=True)
        elif pre.task == "image_classification":
            from aiayn.tasks.image_classification import evaluate_images  # lazy: loaded when the command runs

            result = evaluate_images(pre, args.data, batch_size=args.batch_size)
            print(result.pop("confusion_text", ""))
        else:
            result = evaluate_classifier(pre, args.data, batch_size=args.batch_size)
            print(result.pop("confusion_text", ""))
        print(json.dumps(result, indent=2, default=str))
        return 0

    p.set_defaults(run=run)


def _evaluate_translation(loaded: list, args: argparse.Namespace) -> int:
    from aiayn.data.text_io import read_lines  # lazy: loaded when the command runs
    from aiayn.evaluate.bleu import corpus_bleu, corpus_chrf, tokenized_lowercase_bleu

    if not args.src or not args.ref:
        raise AiaynError("translation evaluation needs --src FILE and --ref FILE")
    src, ref = read_lines(args.src), read_lines(args.ref)
    if not src:
        raise AiaynError(f"{args.src}: the file is empty; give the source sentences to translate and score, one per "
                         "line")
    if len(src) != len(ref):
        raise AiaynError(f"{args.src} has {len(src)} lines but {args.ref} has {len(ref)}; they must be aligned")
    hyps = _translate_lines(loaded, args, src, source=args.src, command_name="evaluate")
    if args.hyp_out:
        _write_output(args.hyp_out, hyps)
    bleu, tok_bleu, chrf = corpus_bleu(hyps, ref), tokenized_lowercase_bleu(hyps, ref), corpus_chrf(hyps, ref)
    result = {"sacrebleu": round(bleu.score, 2), "sacrebleu_signature": bleu.signature,
              "tokenized_lowercase_bleu": round(tok_bleu.score, 2), "tokenized_signature": tok_bleu.signature,
              "chrf": round(chrf.score, 2), "chrf_signature": chrf.signature, "sentences": len(src),
              "checkpoints": [str(c) for c in args.checkpoint]}
    if args.paper_bleu:
        from aiayn.evaluate.paper_bleu import paper_and_sacrebleu  # lazy: loaded when the command runs

        result.update(paper_and_sacrebleu(hyps, ref, args.paper_bleu))
    print(json.dumps(result, indent=2))
    return 0


# ---------------------------------------------------------------------------------------------- demo
@command("demo", "Offline demos: 'translation' (default; a synthetic En->De grammar) or 'copy'.")
def _demo(p: argparse.ArgumentParser) -> None:
    p.add_argument("which", nargs="?", default="translation", choices=["translation", "copy"])
    p.add_argument("--out", default=None, help="output directory (default runs/demo or runs/copy)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--steps", type=whole(1), default=None,
                   help="training steps (default 1400 for translation, 400 for copy); the demos are bounded by steps, "
                        "not minutes, so their result does not depend on the machine's speed")

    def run(args: argparse.Namespace) -> int:
        if args.steps is not None and args.steps < 1:
            raise AiaynError(f"--steps must be at least 1, got {args.steps}")
        if args.which == "copy":
            from aiayn.demos.copy_task import run_copy_demo  # lazy: loaded when the command runs

            metrics = run_copy_demo(args.out or "runs/copy", steps=args.steps or 400, seed=args.seed)
            if metrics["exact_match"] < 1.0:
                print(f"aiayn demo copy: held-out exact match {metrics['exact_match']:.1%}, below the 100% the demo "
                      f"needs; more steps (--steps {2 * (args.steps or 400)}) usually get there", file=sys.stderr)
                return 1
            return 0
        from aiayn.demos.translation import STEPS, run_translation_demo, shortfall  # lazy: loaded when the command runs

        metrics = run_translation_demo(args.out or "runs/demo", seed=args.seed, max_steps=args.steps or STEPS)
        why = shortfall(metrics)
        if why:
            print(f"aiayn demo: {why}", file=sys.stderr)
            return 1
        return 0

    p.set_defaults(run=run)


# ---------------------------------------------------------------------------------------------- average
@command("average", "Average the weights of checkpoints (the paper's last-N averaging) into a new checkpoint.")
def _average(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoints", nargs="*", help="checkpoint directories to average (or use --run/--last)")
    p.add_argument("--run", dest="run_dir", metavar="DIR",
                   help="a training run's out_dir: average its periodic step-N checkpoints")
    p.add_argument("--last", type=whole(1), default=None, help="with --run: only the last N of them (default all)")
    p.add_argument("--out", required=True,
                   help="directory to write the averaged checkpoint to: a new or empty folder, or an aiayn "
                        "checkpoint (its files are replaced); never one of the checkpoints averaged")
    p.add_argument("--overwrite", action="store_true",
                   help="also write into a folder that holds other things: the checkpoint's files replace those of "
                        "the same names, and nothing else there is changed or removed")

    def run(args: argparse.Namespace) -> int:
        if bool(args.run_dir) == bool(args.checkpoints):
            raise AiaynError("give either checkpoint directories or --run DIR (with --last N), not both or neither")
        if args.last is not None and not args.run_dir:
            raise AiaynError("--last needs --run DIR")
        dirs = [Path(c) for c in args.checkpoints]
        for d in dirs:
            refuse_run_folder(d)
        if args.run_dir:
            if args.last is not None and args.last < 1:
                raise AiaynError(f"--last must be at least 1, got {args.last}")
            dirs = periodic_checkpoints(args.run_dir)
            if not dirs:
                raise AiaynError(f"{args.run_dir}: no step-N checkpoints; pass a run's out_dir (train.save_every > 0)")
            dirs = dirs[-args.last:] if args.last else dirs
            if args.last and len(dirs) < args.last:
                print(f"aiayn average: only {len(dirs)} step-N checkpoints in {args.run_dir}; averaging all of them",
                      file=sys.stderr)
        out = write_average(dirs, args.out, overwrite=args.overwrite)
        print(f"averaged {len(dirs)} checkpoints ({dirs[0].name} .. {dirs[-1].name}) into {out}")
        return 0

    p.set_defaults(run=run)


# ---------------------------------------------------------------------------------------------- data
@command("data", "Datasets: 'aiayn data download multi30k --dest DIR' fetches Multi30k, 'aiayn data download wmt14 "
                 "--pair en-de --dest DIR' the WMT 2014 training corpora (sha256-checked) and newstest2013/2014 "
                 "(through sacrebleu); 'aiayn data standin wmt14 --pair en-de --dest DIR' writes a small offline "
                 "stand-in of the WMT folder's layout.")
def _data(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["download", "standin"])
    p.add_argument("dataset", choices=["multi30k", "wmt14"])
    p.add_argument("--dest", default=None,
                   help="destination folder (default data/multi30k, data/wmt14-PAIR, or for standin "
                        "data/wmt14-PAIR-standin)")
    p.add_argument("--pair", choices=["en-de", "en-fr"], default="en-de", help="wmt14: the language pair")
    p.add_argument("--base-url", default=None, help="mirror URL (http(s):// or file://) holding the same files")
    p.add_argument("--checksums", metavar="FILE", default=None,
                   help="wmt14 with --base-url: a sha256sum listing of the mirror's archives, when it holds other "
                        "files than statmt.org's")
    p.add_argument("--pairs", type=whole(10), default=2000, help="standin: training sentence pairs (default 2000)")

    def run(args: argparse.Namespace) -> int:
        if args.action == "standin":
            if args.dataset != "wmt14":
                raise AiaynError("aiayn data standin writes a stand-in of wmt14 only; for multi30k use the real data")
            from aiayn.data.wmt14_standin import write_standin  # lazy: loaded when the command runs

            paths = write_standin(args.pair, Path(args.dest or f"data/wmt14-{args.pair}-standin"), n_train=args.pairs)
        elif args.dataset == "wmt14":
            from aiayn.data.wmt14 import download_wmt14, read_checksums  # lazy: loaded when the command runs

            sums = read_checksums(Path(args.checksums)) if args.checksums else None
            paths = download_wmt14(args.pair, Path(args.dest or f"data/wmt14-{args.pair}"), base_url=args.base_url,
                                   checksums=sums)
        else:
            from aiayn.data.download import download_multi30k  # lazy: loaded when the command runs

            paths = download_multi30k(Path(args.dest or "data/multi30k"), base_url=args.base_url)
        for path in paths:
            print(path)
        return 0

    p.set_defaults(run=run)


# ---------------------------------------------------------------------------------------------- check
@command("check", "Check on this machine that a model computes what it should: cached == uncached decoding, batched "
                  "== single, accelerated == reference (train and decode, with and without native kernels), "
                  "accumulated == one batch, resume == uninterrupted (a tiny run). Prints the accelerator's kernels in "
                  "use and the largest differences; exits 1 if any check fails.")
def _check(p: argparse.ArgumentParser) -> None:
    which = p.add_mutually_exclusive_group()
    which.add_argument("--checkpoint", help="a checkpoint directory (e.g. runs/demo/best)")
    which.add_argument("--preset", help="a model preset, randomly initialized (default: tiny); see "
                                        "aiayn.ModelConfig.preset")
    p.add_argument("--arch", choices=["encoder", "decoder", "encoder-decoder"], default=None,
                   help="with --preset: the architecture (default: the preset's)")
    p.add_argument("--no-resume", action="store_true", help="skip the resume check (it trains a tiny model twice)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N or auto")

    def run(args: argparse.Namespace) -> int:
        from aiayn.check import format_report, kernels_in_use, run_checks  # lazy: loaded when the command runs
        from aiayn.devices import pick_device

        device = pick_device(device_name(args.device))
        if args.checkpoint:
            # the reference; the checks accelerate copies of it
            model = load_pretrained(args.checkpoint, device, accel="none").model
            what = args.checkpoint
        else:
            name = args.preset or "tiny"
            config = ModelConfig.preset(name, **({"arch": args.arch} if args.arch else {}))
            torch.manual_seed(0)
            model = build_model(config).to(device)
            what = f"preset {name} ({config.arch}, random weights)"
        print(f"aiayn check: {what} on {device}; accelerator: {os.environ.get('AIAYN_ACCEL', 'auto')}")
        for purpose, used in kernels_in_use(model, os.environ.get("AIAYN_ACCEL")).items():
            print(f"  in use to {purpose}: {used}")
        rows = run_checks(model, resume=not args.no_resume, accel_setting=os.environ.get("AIAYN_ACCEL"))
        print(format_report(rows))
        return 0 if all(r.passed for r in rows) else 1

    p.set_defaults(run=run)
