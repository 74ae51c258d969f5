"""The ``aiayn`` command line. Every subcommand has ``--help``; user errors print one line, no traceback."""

from __future__ import annotations

import argparse
import os
import sys

from aiayn import __version__
from aiayn.cli.global_options import add_global_options
from aiayn.errors import AiaynError


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand registered by the ``aiayn.cli`` modules."""
    from aiayn.cli import (  # lazy: --version answers without torch
        commands,
        convert_command,  # noqa: F401  (registers convert)
        embed_command,  # noqa: F401  (registers embed)
        inspect_command,  # noqa: F401  (registers inspect)
        learn_command,  # noqa: F401  (registers learn)
        lm_commands,  # noqa: F401  (registers generate and classify)
        serve_command,  # noqa: F401  (registers serve)
    )

    parser = argparse.ArgumentParser(
        prog="aiayn",
        description="The Transformer of 'Attention Is All You Need' and its family: train, decode, evaluate.",
        epilog="--accel auto (the default) applies the CPU accelerator (aiayn.accel.cpu: native kernels in the "
               "core's attention and output-layer seams, packed weights, a fused loss; results equal the reference up "
               "to float rounding; aiayn check lists them) and keeps freed memory in the process for reuse; --accel "
               "none runs the reference core only. The environment variable AIAYN_ACCEL sets the same.")
    parser.add_argument("--version", action="version", version=f"aiayn {_version()}",
                        help="print aiayn's version and exit")
    add_global_options(parser)  # before the command or, below, after it
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, setup) in commands.REGISTRY.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        setup(p)
        add_global_options(p)
    return parser


def _version() -> str:
    """The version of the aiayn that runs (``aiayn.__version__``, kept equal to pyproject.toml's)."""
    return __version__


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse ``argv``, letting a command's ``key=value`` overrides come after its options too.

    argparse fills a ``nargs="*"`` positional in one go, so in ``aiayn train R.toml --nproc 2 a.b=1`` the
    ``a.b=1`` after the option would be "unrecognized"; such leftovers join ``args.overrides`` when the command
    takes overrides. Anything else left over (an unknown option) is the usual argparse error, said by the command
    (``aiayn translate: error: ...``). So is ``--beam=--``, which this Python's argparse passes on as an empty list.
    """
    args, extra = parser.parse_known_args(argv)
    command = _command_parser(parser, getattr(args, "command", None))
    for item in argv if argv is not None else sys.argv[1:]:
        if item.startswith("--") and item.endswith("=--") and len(item) > 5:
            command.error(f"argument {item[:-3]}: expected one argument")
    if extra and hasattr(args, "overrides") and not any(e.startswith("-") for e in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        command.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _command_parser(parser: argparse.ArgumentParser, name: str | None) -> argparse.ArgumentParser:
    """The parser of the command ``name`` (``parser`` itself when there is none), whose errors name the command."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            return action.choices[name]
    return parser


#: the address space torch and aiayn need before any model is loaded (imported, they map about 0.7 GiB; below
#: 1 GiB of ``ulimit -v`` torch aborts while loading or its first operations fail)
MIN_ADDRESS_SPACE = 1 << 30


def address_space_problem(limit: int | None = None) -> str | None:
    """Why this process cannot run a command: an address-space limit (``ulimit -v``; ``limit`` bytes, None: this
    process's own) below :data:`MIN_ADDRESS_SPACE`; else None."""
    try:
        import resource  # optional: a Unix module
    except ImportError:  # not a Unix system
        return None
    if limit is None:
        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit == resource.RLIM_INFINITY or limit >= MIN_ADDRESS_SPACE:
        return None
    return (f"this process may use {limit >> 20} MiB of address space (ulimit -v {limit >> 10}), and torch needs "
            f"about {MIN_ADDRESS_SPACE >> 20} MiB before any model is loaded; raise the limit (ulimit -v "
            f"{2 * MIN_ADDRESS_SPACE >> 10}, or unlimited) and leave room for the model's weights on top")


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse arguments, run the subcommand, turn user errors into a message and exit code 2."""
    if (sys.argv[1:] if argv is None else list(argv)) == ["--version"]:  # at once, without loading torch
        print(f"aiayn {_version()}")
        return 0
    problem = address_space_problem()
    if problem is not None:  # torch itself would abort while loading, in C++, with no word of why
        print(f"aiayn: error: {problem}", file=sys.stderr)
        return 2
    from aiayn import accel, threads  # lazy: --version answers without torch

    start = threads.sample()  # other processes' CPU use is measured from here to the command's start
    parser = build_parser()
    try:
        args = parse_args(parser, argv)
    except SystemExit as e:  # argparse said what is wrong (usage, then "aiayn COMMAND: error: ...")
        if e.code in (0, None):  # --help, --version
            raise
        return e.code if isinstance(e.code, int) else 2
    if getattr(args, "threads", None):  # the command owns its process's threads too (see aiayn.threads)
        threads.set_explicit(args.threads)
    else:
        threads.apply_at_start(start)
    before = os.environ.get(accel.ENV_VAR)
    try:
        os.environ[accel.ENV_VAR] = accel.resolve(getattr(args, "accel", None))  # for every later step and worker
        accel.setup_process()  # the command owns its process
        return int(args.run(args) or 0)
    except AiaynError as e:
        print(f"aiayn {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C, or a stop signal the trainer handled (aiayn.train.stop_signals)
        from aiayn.program import RESUME_COMMAND_VAR  # lazy: needed only after Ctrl-C or a stop signal
        from aiayn.train.stop_signals import Stopped, exit_code

        if not os.environ.get(RESUME_COMMAND_VAR):  # a rank of `aiayn train --nproc`, whose launcher says it
            print(f"aiayn {args.command}: " + (f"stopped by {e}" if isinstance(e, Stopped) else "interrupted"),
                  file=sys.stderr)
        return exit_code(e)
    except BrokenPipeError:
        return 0
    finally:  # a caller that runs main() in its own process keeps its setting
        if before is None:
            os.environ.pop(accel.ENV_VAR, None)
        else:
            os.environ[accel.ENV_VAR] = before


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
