"""``aiayn embed``: one vector per input line, from an embedding checkpoint (or any encoder or language model)."""

from __future__ import annotations

import argparse
import io
import json
import sys

import numpy as np

from aiayn.cli.commands import _add_load_args, _add_on_long_arg, _load, _read_input, _warn, command
from aiayn.cli.values import output_file, whole
from aiayn.errors import AiaynError, where
from aiayn.files import atomic_write_bytes, atomic_write_text
from aiayn.generate.inputs import check_lengths, check_unknown, input_name
from aiayn.tasks.embedding import POOLINGS, embed_ids, empty_warnings, encode_texts, long_effect, settings

FORMATS = (".npy", ".jsonl")


@command("embed", "Embed texts (a file or stdin, one per line): one vector per line, written as a .npy array (N, D) "
                  "or as JSON lines (one list of numbers per line; the default on stdout). Pooling and normalisation "
                  "are the checkpoint's (a converted sentence-transformers model's own; mean over the tokens for an "
                  "encoder, the last token for a language model) unless --pooling / --normalize say otherwise. A "
                  "blank line is embedded as the empty text (its framing tokens, e.g. [CLS] [SEP], as "
                  "sentence-transformers does), so row i is always line i; a line longer than the model takes is "
                  "cut and named on stderr (--on-long).")
def _embed(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True,
                   help="a checkpoint directory: task embedding (aiayn convert --from-hf of a sentence-transformers "
                        "folder, a BertModel, LlamaModel, MistralModel or Qwen2Model), or an lm, mlm or "
                        "classification checkpoint")
    p.add_argument("--input", "-i", help="text file, one text per line (plain or .gz); default stdin")
    p.add_argument("--output", "-o", metavar="FILE.npy|FILE.jsonl",
                   help="where to write the vectors: FILE.npy (a float32 array of N rows, numpy.load reads it) or "
                        "FILE.jsonl (one JSON list per line); default: JSON lines on stdout")
    p.add_argument("--batch-size", type=whole(1), default=32, help="texts per forward pass (default 32)")
    p.add_argument("--pooling", choices=POOLINGS, default=None,
                   help="how token vectors become one: mean (of the text's tokens, padding excluded), cls (the first "
                        "token), max (per dimension) or last (the last token); default: the checkpoint's")
    p.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None,
                   help="scale each vector to unit length (then a dot product is the cosine similarity); default: "
                        "the checkpoint's (a sentence-transformers Normalize module), else not")
    _add_on_long_arg(p, "embed its first max_len tokens, framing tokens included")
    _add_load_args(p)

    def run(args: argparse.Namespace) -> int:
        _check_output(args.output)
        pre = _load(args)
        s = settings(pre, args.pooling, args.normalize, args.checkpoint)
        lines = _read_input(args.input)
        ids, lengths = encode_texts(pre, lines, s)
        names = [where(input_name(args.input), i + 1) for i in range(len(lines))]
        _warn("embed", check_lengths(lengths, s.max_len, args.on_long, names, effect=long_effect(s),
                                     fix="split the text"))
        tok = pre.tokenizers["text"]
        _warn("embed", check_unknown(ids, tok.unk_id, names))
        _warn("embed", empty_warnings(ids, names))
        vectors = embed_ids(pre.model, ids, tok.pad_id, s.pooling, s.normalize, args.batch_size)  # (N, D)
        _write_vectors(args.output, vectors.numpy())
        if args.output not in (None, "-"):
            print(f"wrote {vectors.shape[0]} vectors of {vectors.shape[1]} numbers to {args.output}", file=sys.stderr)
        return 0

    p.set_defaults(run=run)


def _check_output(path: str | None) -> None:
    """Refuse, before any work, an ``--output`` that is not a writable .npy or .jsonl file."""
    output_file(path, "--output")
    if path not in (None, "-") and not path.endswith(FORMATS):
        raise AiaynError(f"--output {path}: write the vectors to a file ending in .npy (a numpy array) or .jsonl "
                         "(one JSON list per line)")


def _write_vectors(path: str | None, vectors) -> None:  # vectors: (N, D) float32 numpy array
    """Write the vectors to ``path`` (.npy or .jsonl, atomically) or as JSON lines to stdout."""
    if path is None or path == "-":
        for row in vectors.tolist():
            print(json.dumps(row))
        return
    if path.endswith(".npy"):
        buffer = io.BytesIO()
        np.save(buffer, vectors)
        atomic_write_bytes(path, buffer.getvalue())
    else:
        atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in vectors.tolist()))
