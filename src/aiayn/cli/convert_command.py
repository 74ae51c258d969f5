"""``aiayn convert``: Hugging Face transformers folders to aiayn checkpoints and back."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from aiayn.cli.commands import command
from aiayn.errors import AiaynError


@command("convert", "Convert a Hugging Face transformers model (a folder, or a Hub name: from the local cache, else "
                    "downloaded) into an aiayn checkpoint (--from-hf), or an aiayn checkpoint into a transformers "
                    "folder (--to-hf).")
def _convert(p: argparse.ArgumentParser) -> None:
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--from-hf", metavar="PATH_OR_NAME",
                       help="a transformers model folder (config.json, weights, tokenizer files) or a Hub name")
    which.add_argument("--to-hf", metavar="CHECKPOINT", help="an aiayn checkpoint directory")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="the folder to write: an aiayn checkpoint (--from-hf) or a transformers folder (--to-hf); "
                        "a new or empty folder, or the output of an earlier conversion of the same direction (its "
                        "files are replaced); never the source, nor a folder inside or around it")
    p.add_argument("--no-tokenizer", action="store_true",
                   help="--from-hf: convert the weights alone, for a folder without tokenizer files (commands that "
                        "need a tokenizer then say it is missing)")
    p.add_argument("--overwrite", action="store_true",
                   help="also write into a folder that holds other things: the conversion's files replace those of "
                        "the same names, and nothing else there is changed or removed")
    p.add_argument("--base", metavar="CHECKPOINT",
                   help="--from-hf of a PEFT LoRA folder (adapter_config.json): the aiayn checkpoint of the model it "
                        "adapts; writes an aiayn adapter checkpoint (--checkpoint BASE --adapter OUT decodes with it)")
    p.add_argument("--merged", action="store_true",
                   help="--to-hf of a LoRA run's checkpoint: the whole model with the adapters folded in (default: "
                        "the adapters alone, as a PEFT folder for PeftModel.from_pretrained on the exported base)")

    def run(args: argparse.Namespace) -> int:
        from aiayn.hf import from_hf, from_peft, to_hf  # lazy: loaded when the command runs

        if args.from_hf and (Path(args.from_hf) / "adapter_config.json").is_file():
            if not args.base:
                raise AiaynError(f"{args.from_hf}: a PEFT adapter folder; name the aiayn checkpoint of the model it "
                                 "adapts with --base CHECKPOINT")
            out = from_peft(args.from_hf, args.base, args.out, overwrite=args.overwrite)
            print(f"wrote the aiayn adapter checkpoint {out} (on the base {args.base})")
            return 0
        if args.base or (args.merged and args.from_hf):
            raise AiaynError("--base applies to --from-hf of a PEFT adapter folder, --merged to --to-hf of a LoRA "
                             "run's checkpoint")
        if args.from_hf:
            out = from_hf(args.from_hf, args.out, overwrite=args.overwrite, tokenizer=not args.no_tokenizer)
            print(f"wrote the aiayn checkpoint {out}" + (" (weights only, no tokenizer)" if args.no_tokenizer else ""))
            return 0
        if args.no_tokenizer:
            raise AiaynError("--no-tokenizer applies to --from-hf; --to-hf writes the checkpoint's tokenizer when it "
                             "has one")
        notes: list[str] = []
        out = to_hf(args.to_hf, args.out, say=notes.append, overwrite=args.overwrite, merged=args.merged)
        for note in notes:
            print(f"aiayn convert: warning: {note}", file=sys.stderr)
        peft = (out / "adapter_config.json").is_file()
        print(f"wrote the {'PEFT adapter' if peft else 'transformers'} folder {out}")
        return 0

    p.set_defaults(run=run)



@command("merge-adapter", "Fold a LoRA run's adapters into its model: a plain checkpoint that loads and decodes as "
                          "any other and converts to transformers (docs/finetuning.md).")
def _merge_adapter(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="a checkpoint of a run with [train] adapter = \"lora\"")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="the checkpoint to write: a new or empty folder, or an aiayn checkpoint (replaced)")
    p.add_argument("--overwrite", action="store_true",
                   help="also write into a folder that holds other things (only the checkpoint's files are replaced)")
    p.add_argument("--base", metavar="CHECKPOINT", default=None,
                   help="the base checkpoint, where it is no longer where the adapter checkpoint says (checked by its "
                        "manifest hash)")

    def run(args: argparse.Namespace) -> int:
        from aiayn.pretrained import merge_adapter  # lazy: loaded when the command runs

        out = merge_adapter(args.checkpoint, args.out, overwrite=args.overwrite, base=args.base)
        print(f"wrote the merged checkpoint {out}")
        return 0

    p.set_defaults(run=run)
