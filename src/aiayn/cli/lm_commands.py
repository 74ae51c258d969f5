"""Subcommands for decoder-only and encoder-only checkpoints: ``aiayn generate`` and ``aiayn classify``."""

from __future__ import annotations

import argparse
import sys

from aiayn.cli.commands import (
    _add_attention_arg,
    _add_load_args,
    _add_on_long_arg,
    _load,
    _read_input,
    _warn,
    command,
    write_attention,
)
from aiayn.cli.values import number, output_file, utf8_text, whole
from aiayn.errors import AiaynError, where
from aiayn.generate.inputs import check_lengths, check_unknown, input_name, is_blank


# ---------------------------------------------------------------------------------------------- generate
@command("generate", "Continue text prompts with a language model (tokens stream to stdout; stops at EOS). A prompt "
                     "longer than the model's context is cut to its last block_size // 2 tokens and named on stderr "
                     "(--on-long).")
def _generate(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True,
                   help="an lm checkpoint directory (e.g. runs/shakespeare-char/best)")
    p.add_argument("--prompt", action="append", default=None, type=utf8_text,
                   help="prompt text (repeat for a batch; default: one empty prompt, which starts from a "
                        "newline)")
    p.add_argument("--prompt-file", help="a UTF-8 file whose whole text is one prompt ('-' for stdin)")
    p.add_argument("--max-new-tokens", type=whole(1), default=200,
                   help="the most tokens to add per prompt, at least 1 (default 200)")
    p.add_argument("--temperature", type=number(0), default=0.8,
                   help="sampling temperature, >= 0 (default 0.8; 0 = greedy)")
    p.add_argument("--top-k", type=whole(1), default=None, help="sample among the k most likely tokens (k >= 1)")
    p.add_argument("--top-p", type=number(0, 1, open_low=True), default=None,
                   help="nucleus sampling: the smallest set with mass p, in (0, 1]")
    p.add_argument("--seed", type=whole(0), default=None, help="seed for reproducible samples (a whole number >= 0)")
    p.add_argument("--greedy", action="store_true", help="always take the most likely token")
    p.add_argument("--prefix-lm", action="store_true", help="attend bidirectionally within the prompt")
    _add_on_long_arg(p, "generate from the prompt's last block_size // 2 tokens")
    _add_attention_arg(p, "each prompt and its continuation (the text encoded again, its last block_size tokens)")
    _add_load_args(p)

    def run(args: argparse.Namespace) -> int:
        from aiayn.tasks.lm import generate_text  # lazy: loaded when the command runs
        from aiayn.tokenize.text_codec import codec_from_meta

        output_file(args.attention, "--attention")
        prompts = list(args.prompt or [])
        names = [f"prompt {i + 1}" for i in range(len(prompts))]
        if args.prompt_file:
            prompts.append(_read_prompt_file(args.prompt_file))
            names.append(f"prompt {len(prompts)} ({input_name(args.prompt_file)})")
        if not prompts:
            prompts, names = [""], ["prompt 1"]
        pre = _load(args)
        if pre.task != "lm":
            raise AiaynError(f"{args.checkpoint}: a {pre.task!r} checkpoint; generate needs a language model "
                             "(task lm, e.g. trained from recipes/shakespeare-char.toml)")
        codec = codec_from_meta(pre.tokenizers["text"], pre.meta)
        tok = codec.tokenizer
        encoded = [codec.encode(prompt) for prompt in prompts]
        context = min(pre.meta.get("block_size") or pre.config.max_len, pre.config.max_len)
        keep = max(context // 2, 1)  # what generate_text keeps of a full context (it slides by half blocks)
        _warn("generate", check_lengths(
            [len(ids) for ids in encoded], context - 1, args.on_long, names, fix="shorten the prompt",
            effect=f"the model's context holds {context} tokens, one of them for the next token, so generation "
                   f"starts from the prompt's last {keep} tokens only"))
        for name, ids in zip(names, encoded):
            if tok.unk_id in ids:
                print(f"aiayn generate: warning: {name} has characters the tokenizer does not know; "
                      "they become <unk>", file=sys.stderr)
        single = len(prompts) == 1

        def on_text(i: int, text: str) -> None:
            if single:
                sys.stdout.write(text)
                sys.stdout.flush()

        if single:
            sys.stdout.write(prompts[0])
            sys.stdout.flush()
        outs = generate_text(pre.model, codec, prompts, max_new_tokens=args.max_new_tokens,
                             block_size=pre.meta.get("block_size"), temperature=args.temperature,
                             top_k=args.top_k, top_p=args.top_p, greedy=args.greedy, seed=args.seed,
                             prefix_lm=args.prefix_lm, on_text=on_text)
        if single:
            sys.stdout.write("\n")
        else:
            for i, (prompt, out) in enumerate(zip(prompts, outs)):
                if i:
                    print("-" * 40)
                print(prompt + out)
        if args.attention:
            sys.stdout.flush()
            write_attention(args.attention, pre, [prompt + out for prompt, out in zip(prompts, outs)])
        return 0

    p.set_defaults(run=run)


def _read_prompt_file(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    from aiayn.data.lm import read_text  # lazy: loaded when the command runs

    return read_text(path)


# ---------------------------------------------------------------------------------------------- classify
@command("classify", "Classify texts (a file or stdin, one per line): prints label<TAB>probability per line, the "
                     "label by its name when the checkpoint has names ([data] label_names), else as in the training "
                     "file. A blank line gives a blank line; a text longer than the model takes is cut and named on "
                     "stderr (--on-long), and so is a text more than one in ten of whose tokens the tokenizer does "
                     "not know. With an image checkpoint, each line is an image file (PNG or .npy; -i IMAGE.png "
                     "classifies one), a square image of another size is resized.")
def _classify(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="a classification checkpoint directory")
    p.add_argument("--input", "-i", help="text file, one text per line (plain or .gz); default stdin. Image "
                                         "checkpoints: a file of image paths, one per line, or one .png/.npy image")
    p.add_argument("--batch-size", type=whole(1), default=128,
                   help="texts (or images) per forward pass (default 128)")
    _add_on_long_arg(p, "classify its first max_len - 1 tokens")
    _add_load_args(p)

    def run(args: argparse.Namespace) -> int:
        from aiayn.evaluate.predict import display_labels, predict_proba  # lazy: loaded when the command runs

        pre = _load(args)
        if pre.task == "image_classification":
            from aiayn.tasks.image_classification import classify_files  # lazy: loaded when the command runs

            for line in classify_files(pre, args.input, args.batch_size):
                print(line)
            return 0
        if pre.task != "classification" or "labels" not in pre.meta:
            raise AiaynError(f"{args.checkpoint}: a {pre.task!r} checkpoint; classify needs a classification "
                             "model (e.g. trained from recipes/sst2-scratch.toml)")
        tok = pre.tokenizers["text"]
        lines = _read_input(args.input)
        ids = tok.encode_batch(lines)
        keep = [i for i, (text, row) in enumerate(zip(lines, ids)) if not is_blank(text, row)]
        names = [where(input_name(args.input), i + 1) for i in keep]
        max_len = pre.meta.get("max_len", pre.config.max_len)
        _warn("classify", check_lengths(  # the model sees [BOS] text [EOS], cut to max_len
            [len(ids[i]) for i in keep], max_len - 2, args.on_long, names, fix="split the text",
            effect=f"only its first {max_len - 1} tokens are classified (the model takes {max_len} with the "
                   "start and end tokens)"))
        _warn("classify", check_unknown([ids[i] for i in keep], tok.unk_id, names))
        probs = predict_proba(pre.model, tok, [lines[i] for i in keep], max_len, args.batch_size)  # (N, C)
        labels = display_labels(pre.meta)
        best_p, best = probs.max(-1)  # (N,), (N,)
        out = [""] * len(lines)
        for i, p_, k in zip(keep, best_p.tolist(), best.tolist()):
            out[i] = f"{labels[k]}\t{p_:.4f}"
        for line in out:
            print(line)
        return 0

    p.set_defaults(run=run)
