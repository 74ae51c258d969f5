"""``aiayn inspect``: the attention explorer for a checkpoint, served locally, as an offline HTML file, or as PNGs."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from aiayn.cli.commands import _add_load_args, _load, command
from aiayn.cli.values import number, output_file, utf8_text, whole
from aiayn.errors import AiaynError
from aiayn.output_folder import PICTURES, check_output_folder

#: what the explorer shows when no input is given, by task
EXAMPLES = {"translation": "A man is riding a bicycle.", "lm": "To be, or not to be",
            "classification": "a gripping, beautifully acted film", "mlm": "the cat sat on the mat"}


@command("inspect", "Look inside a checkpoint: its attention (head and model views, alignment, masks, positions, "
                    "per-head statistics) and its output for one input, in a local explorer (the default), an "
                    "offline HTML file (--html) or PNG pictures (--png).")
def _inspect(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="a checkpoint directory (trained, or converted from "
                                                       "Hugging Face with aiayn convert)")
    given = p.add_mutually_exclusive_group()
    given.add_argument("--text", type=utf8_text, help="the input: a source sentence, a prompt, or a text to classify")
    given.add_argument("-i", "--input", help="a UTF-8 file whose first non-blank line is the input; for an image "
                                             "checkpoint, the image (PNG or .npy)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--html", metavar="OUT", help="write one self-contained HTML file (works offline) and exit")
    out.add_argument("--png", metavar="DIR", help="write the views as PNG pictures into DIR and exit: a new or "
                                                  "empty folder, or one an earlier --png wrote (its pictures are "
                                                  "replaced); never the checkpoint, nor a folder inside or around it")
    p.add_argument("--overwrite", action="store_true",
                   help="with --png: also write into a folder that holds other things (pictures of the same names "
                        "are replaced; nothing else there is changed or removed)")
    p.add_argument("--beam", type=whole(1), default=None,
                   help="translation: beam width, at most the target vocabulary's size (default the checkpoint's; 1 "
                        "is greedy)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to serve on (default 127.0.0.1, this machine only; another address makes the "
                        "explorer and the model reachable from the network). Requests must name the server by a "
                        "loopback name or this address, come from its own page (Origin) and post JSON; others are "
                        "refused (docs/inspect.md)")
    p.add_argument("--port", type=whole(0, 65535), default=8000,
                   help="port to serve on (default 8000; 0: any free port, named when serving starts)")
    p.add_argument("--timeout", type=number(0, open_low=True), default=60.0,
                   help="seconds one input may run when served (default 60)")
    _add_load_args(p)

    def run(args: argparse.Namespace) -> int:
        from aiayn.inspect import inspect_text, write_html  # lazy: loaded when the command runs

        if args.png:  # refuse a folder before the model is loaded
            check_output_folder(args.png, PICTURES, overwrite=args.overwrite, sources=[args.checkpoint])
        output_file(args.html, "--html")
        pre = _load(args)
        tgt = pre.tokenizers.get("tgt")
        if args.beam is not None and tgt is not None and args.beam > tgt.vocab_size:
            raise AiaynError(f"--beam {args.beam}: more than the {tgt.vocab_size} tokens of the target vocabulary; "
                             f"give a beam of at most {tgt.vocab_size}")
        image = pre.config.input == "patches"
        if image:
            from aiayn.inspect.image import inspect_image  # lazy: loaded when the command runs

            if not (args.input or args.text):
                raise AiaynError(f"{args.checkpoint}: reads images; give the image to inspect with -i IMAGE.png")
            record = inspect_image(pre, args.input or args.text)
        else:
            text = args.text if args.text is not None else _first_line(args.input) if args.input else None
            if text is None:
                text = _example(pre)
            record = inspect_text(pre, text, beam=args.beam, steps=not args.png)  # a step-through for the page
        if args.html:
            print(f"wrote {write_html(record, args.html)}")
            return 0
        if args.png:
            from aiayn.inspect.image import image_pictures  # lazy: loaded when the command runs
            from aiayn.inspect.pictures import save_pictures

            files = save_pictures(record, args.png, overwrite=args.overwrite, sources=[args.checkpoint],
                                  more=image_pictures if image else None)
            print(f"wrote {len(files)} pictures into {args.png}")
            return 0
        from aiayn.inspect.server import Limits, serve  # lazy: loaded when the command runs
        from aiayn.local_server import is_loopback

        if not is_loopback(args.host):
            print(f"aiayn inspect: warning: serving on {args.host}: anyone who reaches this address can run the "
                  "model", file=sys.stderr)
        serve(pre, record, args.host, args.port, Limits(timeout=args.timeout),  # the URL once the port is ours
              on_ready=lambda url: print(f"aiayn inspect: the explorer is at {url} (Ctrl-C stops it)", flush=True))
        return 0

    p.set_defaults(run=run)


def _example(pre: Any) -> str:
    """What the explorer shows without an input: the task's example, or, where the checkpoint's vocabulary does not
    know all of its words (the demo's synthetic grammar), the first of the demo's sentences that it knows whole."""
    from aiayn.demos.translation import DEMO_SENTENCES  # lazy: the demo loads the trainer

    candidates = [EXAMPLES.get(pre.task, "the cat sat on the mat")]
    if pre.task == "translation":
        candidates += DEMO_SENTENCES
    tok = pre.tokenizers.get("src") or pre.tokenizers.get("text")
    for text in candidates:
        ids = tok.encode(text)
        if tok.unk_id is None or tok.unk_id not in ids:
            return text
    return candidates[0]


def _first_line(path: str) -> str:
    """The first non-blank line of a UTF-8 file (an AiaynError naming the file otherwise)."""
    from aiayn.data.text_io import read_lines  # lazy: loaded when the command runs

    for line in read_lines(path):
        if line.strip():
            return line
    raise AiaynError(f"{path}: no non-blank line; write the input on the first line")
