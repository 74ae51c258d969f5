"""``aiayn learn``: the course's checks, progress and assembly from the command line."""

from __future__ import annotations

import argparse
import runpy
import sys
import traceback
from pathlib import Path
from typing import Any

from aiayn.cli.commands import command
from aiayn.cli.global_options import add_global_options
from aiayn.cli.values import whole
from aiayn.errors import AiaynError


@command("learn", "The course (docs/course): check your functions against aiayn's reference, each mistake "
                  "diagnosed; see which lessons you passed; train a Transformer made of your own pieces.")
def _learn(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    sub.add_parser("status", help="which lessons and exercises are passed, and what comes next",
                   description="Which lessons and exercises are passed (kept in $AIAYN_LEARN_HOME/progress.json, by "
                               "default under ~/.local/share/aiayn/learn), and what comes next.")
    check = sub.add_parser("check", help="a lesson's final check on the functions of FILE.py (or one exercise)",
                           description="Run LESSON's final check on the functions defined in FILE.py, each against "
                                       "aiayn's reference on random shapes and edge cases, with a diagnosis of each "
                                       "mistake. The lesson counts as passed when every exercise passes; it needs "
                                       "the lessons before it passed. LESSON may also name one exercise "
                                       "(e.g. attention). Exit code 0: passed; 1: not passed.")
    check.add_argument("lesson", metavar="LESSON", help="a lesson (3, 03, masks) or an exercise (masked_attention)")
    check.add_argument("file", metavar="FILE.py", help="your Python file, defining the functions by exercise name")
    check.add_argument("--seed", type=whole(0), default=None, help="the random cases' seed (default: a new one)")
    build = sub.add_parser("assemble", help="train a Transformer made of your pieces from FILE.py on the copy task",
                           description="Plug the functions of FILE.py named like the exercises (masked_attention, "
                                       "causal_mask, split_heads, merge_heads, sinusoidal, feed_forward, sublayer, "
                                       "noam_lr, label_smoothed_loss) into an aiayn encoder-decoder, aiayn's own "
                                       "pieces filling in the rest, and train it on the copy task. Exit code 0: it "
                                       "learned; 1: it did not.")
    build.add_argument("file", metavar="FILE.py", help="your Python file")
    build.add_argument("--steps", type=whole(1), default=300, help="training steps (default 300: seconds on a CPU)")
    build.add_argument("--seed", type=whole(0), default=0, help="initialization and data seed (default 0)")
    build.add_argument("--pre-norm", action="store_true", help="pre-LN layers (default: post-LN, the paper's)")
    begin = sub.add_parser("start", help="copy the course's notebooks into DIR with the solutions blanked",
                           description="Copy the course's notebooks (docs/course) into DIR, each exercise's "
                                       "solution replaced by raise NotImplementedError, for you to write.")
    begin.add_argument("dir", metavar="DIR", help="a new or existing folder")
    begin.add_argument("--overwrite", action="store_true", help="replace the course's notebooks already in DIR")

    for action in sub.choices.values():  # --threads and --accel after the action too, as after any command
        add_global_options(action)

    def run(args: argparse.Namespace) -> int:
        from aiayn import learn  # lazy: loaded when the command runs

        if args.action == "status":
            print(learn.status())
            return 0
        if args.action == "start":
            from aiayn.learn.notebooks import start  # lazy: loaded when the command runs

            written = start(args.dir, overwrite=args.overwrite)
            print(f"wrote {len(written)} notebooks into {args.dir}; open {written[0].name} in Jupyter")
            return 0
        functions = _load_file(args.file)
        if args.action == "assemble":
            result = learn.assemble(functions, steps=args.steps, seed=args.seed,
                                    norm_position="pre" if args.pre_norm else "post")
            print(result.report())
            return 0 if result.learned else 1
        if args.lesson in learn.EXERCISES:
            fn = functions.get(args.lesson)
            if not callable(fn):
                raise AiaynError(f"{args.file}: no function named {args.lesson}; define it there")
            result = learn.check(args.lesson, fn, seed=args.seed)
        else:
            result = learn.check_lesson(args.lesson, functions, seed=args.seed, source=args.file)
        print(result.report())
        return 0 if result.passed else 1

    p.set_defaults(run=run)


def _load_file(path: str) -> dict[str, Any]:
    """Run the learner's file and return its top-level names (an AiaynError naming the file and line on failure)."""
    file = Path(path)
    if not file.is_file():
        raise AiaynError(f"{path}: no such file; give the Python file that defines your functions")
    sys.path.insert(0, str(file.resolve().parent))  # as `python FILE.py` would: its folder's modules importable
    try:
        return runpy.run_path(str(file), run_name="__learner__")
    except SyntaxError as e:
        raise AiaynError(f"{path}:{e.lineno}: syntax error: {e.msg}; fix it and run the check again") from e
    except Exception as e:  # the learner's file may raise anything while it runs
        frames = [f for f in traceback.extract_tb(e.__traceback__) if Path(f.filename) == file.resolve()
                  or f.filename == str(file)]
        line = f":{frames[-1].lineno}" if frames else ""
        raise AiaynError(f"{path}{line}: running it raised {type(e).__name__}: {e}; the file should only define "
                         "functions (and import what they need)") from e
    finally:
        sys.path.remove(str(file.resolve().parent))
