"""The ``aiayn`` command line. Every subcommand has ``--help``; user errors print one line, no traceback."""

from __future__ import annotations

import argparse
import sys

from aiayn.allocator import keep_freed_memory_unless_disabled
from aiayn.errors import AiaynError


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand registered by the ``aiayn.cli`` modules."""
    from aiayn.cli import (
        commands,
        lm_commands,  # noqa: F401  (registers generate and classify)
    )

    parser = argparse.ArgumentParser(
        prog="aiayn",
        description="The Transformer of 'Attention Is All You Need' and its family: train, decode, evaluate.",
        epilog="On Linux (glibc) the command keeps freed memory in its process for reuse, which spares CPU training "
               "a page fault per 4 KiB of every large tensor it reallocates each step; the process keeps its peak "
               "memory instead. AIAYN_KEEP_FREED_MEMORY=0 in the environment turns this off.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, setup) in commands.REGISTRY.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        setup(p)
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse ``argv``, letting a command's ``key=value`` overrides come after its options too.

    argparse fills a ``nargs="*"`` positional in one go, so in ``aiayn train R.toml --nproc 2 a.b=1`` the
    ``a.b=1`` after the option would be "unrecognized"; such leftovers join ``args.overrides`` when the command
    takes overrides. Anything else left over (an unknown option) is the usual argparse error.
    """
    args, extra = parser.parse_known_args(argv)
    if extra and hasattr(args, "overrides") and not any(e.startswith("-") for e in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse arguments, run the subcommand, turn user errors into a message and exit code 2."""
    parser = build_parser()
    args = parse_args(parser, argv)
    keep_freed_memory_unless_disabled()  # the command owns its process (see aiayn.allocator)
    try:
        return int(args.run(args) or 0)
    except AiaynError as e:
        print(f"aiayn {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"aiayn {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
