"""Every mistake on the command line ends in one message and exit code 2, never a traceback: a property-based test.

Hypothesis drives each command of ``aiayn`` (train, translate, generate, classify, evaluate, average, convert,
inspect --html, check) through :func:`aiayn.cli.main.main` with generated mistakes:

- numeric options given negative, zero, huge, non-finite or non-numeric values;
- checkpoint paths that are missing, a file, an empty folder, a training run's folder or another task's checkpoint;
- bad files where a file is expected (``--input``, ``--prompt-file``, ``--data``, ``--src``, a recipe, a recipe's
  data files, a checkpoint's files): empty, binary garbage, Latin-1 (invalid UTF-8), one huge line, a folder, a
  missing path (an unreadable file has its own test, skipped when running as root);
- recipes with wrong types, out-of-range values, unknown keys and sections, and TOML syntax errors, in the file or
  as ``section.key=value`` overrides; malformed overrides; model and batch sizes no machine holds; checkpoints
  whose ``config.json`` entries have the wrong types;
- bad devices, output files that are folders, text arguments that are not UTF-8, missing, conflicting and unknown
  options.

Each case asserts: the exit code (2; 0 where the input is acceptable, decided case by case), exactly one
``aiayn COMMAND: error: ...`` line on stderr naming the option, key or file at fault, no "Traceback" anywhere, and
no file outside the case's own folder changed (the tree of data, recipes and checkpoints is hashed before and
after). Three tiny models (a character LM, a word-level translator, a sentiment classifier) are trained once for
the module. ``-s`` prints how many cases ran.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import random
import re
import shutil
import stat
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pytest
import tomllib
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from aiayn.cli.main import main
from aiayn.cli.values import MAX_WHOLE

# skipped over-long pairs are warned about; here they are expected
pytestmark = pytest.mark.filterwarnings("ignore::aiayn.data.parallel.DataWarning")
AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
FAST = settings(deadline=None, derandomize=True, database=None, print_blob=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
COUNTS: Counter[str] = Counter()  # cases run, by family


def fast(n: int) -> settings:
    """Hypothesis settings of one test: ``n`` examples, the same ones on every run, no deadline."""
    return settings(FAST, max_examples=n)

#: bad file contents, by kind; "folder" is a directory, "missing" a path that does not exist
BAD_KINDS = ("empty", "garbage", "latin1", "huge_line", "folder", "missing")
BAD_NAMES = {"empty": "empty.txt", "garbage": "garbage.bin", "latin1": "latin1.txt", "huge_line": "huge-line.txt",
             "folder": "a-folder", "missing": "missing.txt", "unreadable": "unreadable.txt"}
HUGE_LINE_BYTES = 1 << 18  # one line of 256 KiB (the models take 16 to 128 tokens)

WORDS = "the king and queen of a fair land walk to sea by night with their old dog".split()
GOOD, BAD, FILLER = ["great", "lovely", "superb"], ["dull", "awful", "boring"], "the film a story with its cast".split()
TRAIN = {"max_steps": 4, "optimizer": "adamw", "lr": 3e-3, "schedule": "constant_warmup", "warmup": 2,
         "eval_every": 4, "log_every": 1, "progress": False, "threads": 1}


# ------------------------------------------------------------------------------------------------ recipes as data
def toml_value(v: Any) -> str:
    """A value as TOML writes it (None has no TOML form: callers leave such keys out)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def to_toml(recipe: dict[str, Any]) -> str:
    """A recipe dict (top-level keys, then one dict per section) as TOML text."""
    lines = [f"{k} = {toml_value(v)}" for k, v in recipe.items() if not isinstance(v, dict) and v is not None]
    for name, section in recipe.items():
        if isinstance(section, dict):
            lines += ["", f"[{name}]", *(f"{k} = {toml_value(v)}" for k, v in section.items() if v is not None)]
    return "\n".join(lines) + "\n"


def override_text(v: Any) -> str:
    """A value as a ``section.key=value`` override writes it (aiayn.train.recipe parses it back)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    return repr(v)


# ------------------------------------------------------------------------------------------------ the world
class World:
    """The files every case reads: data, bad files, recipes, trained runs; each case runs in a folder of its own
    under ``cases/``, which is the current directory while it runs."""

    def __init__(self, root: Path, data: dict[str, Path], bad: dict[str, Path], recipes: dict[str, dict[str, Any]],
                 recipe_files: dict[str, Path], runs: dict[str, Path], hf: Path, vocab: dict[str, int]) -> None:
        self.root, self.data, self.bad, self.recipes, self.recipe_files = root, data, bad, recipes, recipe_files
        self.runs, self.hf, self.vocab, self.cases = runs, hf, vocab, 0

    def __repr__(self) -> str:  # what Hypothesis prints of the fixture
        return f"World({self.root})"

    def ckpt(self, task: str) -> Path:
        return self.runs[task] / "best"

    def snapshot(self) -> dict[str, Any]:
        """Every file and folder outside ``cases/``: size and SHA-256 (size and mtime where unreadable)."""
        out: dict[str, Any] = {}
        for dirpath, dirnames, filenames in os.walk(self.root):
            here = Path(dirpath)
            if here == self.root:
                dirnames.remove("cases")
            for d in dirnames:
                out[str((here / d).relative_to(self.root))] = "dir"
            for f in filenames:
                p = here / f
                st_ = p.lstat()
                try:
                    digest = hashlib.sha256(p.read_bytes()).hexdigest()
                except OSError:
                    digest = f"unreadable {st_.st_mtime_ns}"
                out[str(p.relative_to(self.root))] = (st_.st_size, digest)
        return out

    def new_case(self) -> Path:
        self.cases += 1
        d = self.root / "cases" / str(self.cases)
        d.mkdir(parents=True)
        return d


def run_cli(argv: list[str], case: Path) -> tuple[int | None, str, str]:
    """``main(argv + --threads 1)`` in ``case`` as the current directory: (exit code, stdout, stderr). An exception
    that escapes main is caught and its traceback appended to stderr (exit code None)."""
    out, err = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    os.chdir(case)
    rc: int | None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main([*argv, "--threads", "1"])
            except SystemExit as e:  # main returns argparse's exit code 2 itself; --help would exit 0
                rc = e.code if isinstance(e.code, int) else 1
            except Exception:  # noqa: BLE001 - reported by the assertions, with the traceback
                rc = None
                err.write(traceback.format_exc())
    finally:
        os.chdir(cwd)
    return rc, out.getvalue(), err.getvalue()


def check(world: World, argv: list[str], expect: int, culprits: list[str], family: str,
          case: Path | None = None) -> None:
    """Run one case and assert what every case must satisfy (module docstring)."""
    case = case or world.new_case()
    before = world.snapshot()
    rc, out, err = run_cli(argv, case)
    after = world.snapshot()
    said = f"\n$ aiayn {' '.join(argv)}\nexit {rc}\nstdout: {out[-1500:]}\nstderr: {err[-3000:]}"
    assert "Traceback" not in out + err, said
    errors = [line for line in err.splitlines() if re.match(r"aiayn [\w-]+: error: ", line)]
    assert rc == expect, f"expected exit {expect}{said}"
    if expect == 2:
        assert len(errors) == 1 and errors[0].startswith(f"aiayn {argv[0]}: error: "), f"one error line{said}"
        message = err[err.index(errors[0]):]
        assert any(c in message for c in culprits), f"the message names none of {culprits}{said}"
    else:
        assert not errors, said
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"changed outside the case folder: {changed}{said}"
    COUNTS[family] += 1


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("cli-bad-input")
    (root / "cases").mkdir()
    d = root / "data"
    d.mkdir()
    rng = random.Random(0)
    data = {"text": d / "text.txt", "in": d / "in.txt", "train.src": d / "train.src", "train.tgt": d / "train.tgt",
            "train.tsv": d / "train.tsv", "valid.tsv": d / "valid.tsv"}
    data["text"].write_text("\n".join(" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(6 + i % 5))
                                      for i in range(120)) + "\n", encoding="utf-8")
    data["in"].write_text("the king walks\n\nthe film was great\n", encoding="utf-8")
    src = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 7))) for _ in range(80)]
    data["train.src"].write_text("\n".join(src) + "\n", encoding="utf-8")
    data["train.tgt"].write_text("\n".join(" ".join(reversed(s.split())) for s in src) + "\n", encoding="utf-8")
    for name, n in (("train.tsv", 60), ("valid.tsv", 20)):
        rows = ["label\tsentence"]
        for _ in range(n):
            label = rng.randint(0, 1)
            words = [rng.choice(FILLER) for _ in range(rng.randint(2, 5))] + [rng.choice(GOOD if label else BAD)]
            rows.append(f"{label}\t{' '.join(words)}")
        data[name].write_text("\n".join(rows) + "\n", encoding="utf-8")

    b = root / "bad"
    b.mkdir()
    bad = {kind: b / name for kind, name in BAD_NAMES.items()}
    bad["empty"].write_bytes(b"")
    bad["garbage"].write_bytes(b"\xff\xfe\x00" + random.Random(1).randbytes(4096))
    bad["latin1"].write_bytes("caf\xe9 cr\xe8me\tna\xefve\n".encode("latin-1"))
    bad["huge_line"].write_bytes((" ".join(WORDS) + " ").encode() * (HUGE_LINE_BYTES // 70))
    bad["folder"].mkdir()
    (bad["folder"] / "notes.md").write_text("not data\n", encoding="utf-8")
    bad["unreadable"].write_text("the king\n", encoding="utf-8")
    os.chmod(bad["unreadable"], 0)
    (root / "empty-folder").mkdir()

    recipes = {
        "lm": {"task": "lm", "data": {"path": str(data["text"]), "block_size": 16, "batch_size": 4,
                                      "eval_max_blocks": 4},
               "tokenizer": {"kind": "char"},
               "model": {"preset": "gpt2-small", "d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32,
                         "dropout": 0.0},
               "train": {**TRAIN, "save_every": 2, "out_dir": "run"}},
        "translation": {"task": "translation",
                        "data": {"train_src": str(data["train.src"]), "train_tgt": str(data["train.tgt"]),
                                 "valid_src": str(data["train.src"]), "valid_tgt": str(data["train.tgt"]),
                                 "batch_tokens": 200},
                        "tokenizer": {"kind": "word", "min_frequency": 1},
                        "model": {"preset": "tiny", "d_model": 16, "n_heads": 2, "d_ff": 32, "n_layers": 1,
                                  "n_encoder_layers": 1},
                        "train": {**TRAIN, "out_dir": "run"}, "eval": {"bleu_sentences": 4}},
        "classification": {"task": "classification",
                           "data": {"train": str(data["train.tsv"]), "valid": str(data["valid.tsv"]), "max_len": 16,
                                    "batch_size": 8},
                           "tokenizer": {"kind": "word"},
                           "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32, "dropout": 0.0,
                                     "position": "learned"},
                           "train": {**TRAIN, "out_dir": "run"}},
    }
    r = root / "recipes"
    r.mkdir()
    recipe_files, runs = {}, {}
    for task, recipe in recipes.items():
        recipe_files[task] = r / f"{task}.toml"
        recipe_files[task].write_text(to_toml(recipe), encoding="utf-8")
        runs[task] = root / "runs" / task
        rc, _, err = run_cli(["train", str(recipe_files[task]), f"train.out_dir={runs[task]}"], root)
        assert rc == 0, f"{task}: {err}"
    hf = root / "hf-lm"
    rc, _, err = run_cli(["convert", "--to-hf", str(runs["lm"] / "best"), "--out", str(hf)], root)
    assert rc == 0, err

    from aiayn.pretrained import load_pretrained

    vocab = {task: load_pretrained(runs[task] / "best").tokenizers["tgt" if task == "translation" else "text"]
             .vocab_size for task in runs}
    yield World(root, data, bad, recipes, recipe_files, runs, hf, vocab)
    os.chmod(bad["unreadable"], stat.S_IRUSR | stat.S_IWUSR)  # so that pytest can remove it
    print(f"\ntest_cli_bad_input: {sum(COUNTS.values())} cases: "
          + ", ".join(f"{k} {v}" for k, v in sorted(COUNTS.items())))


# ------------------------------------------------------------------------------------------------ numeric options
@dataclass(frozen=True)
class Flag:
    """A numeric option and the values it takes: ``kind`` int or float, in [low, high] (``open_low``: (low, high]).
    A valid value runs the command (exit 0) unless ``run_valid`` is False or it is above ``run_below``."""

    command: str
    flag: str
    kind: str
    low: float
    high: float = math.inf
    open_low: bool = False
    run_valid: bool = True
    run_below: float = math.inf


def numeric_flags(world: World) -> list[Flag]:
    v_mt = world.vocab["translation"]
    return [
        *(Flag(c, "--beam", "int", 1, v_mt) for c in ("translate", "evaluate-mt", "inspect")),
        Flag("translate", "--n-best", "int", 1, 4),  # the checkpoint's beam is 4
        *(Flag(c, "--batch-size", "int", 1) for c in ("translate", "evaluate-mt", "evaluate-lm", "evaluate-cls",
                                                      "classify")),
        *(Flag(c, "--alpha", "float", 0) for c in ("translate", "evaluate-mt")),
        Flag("evaluate-lm", "--context", "int", 2, 16),  # the model's max_len is its block size, 16
        Flag("evaluate-lm", "--stride", "int", 1, 15),  # below the context (16)
        Flag("generate", "--max-new-tokens", "int", 1, run_below=64),  # a huge count runs until EOS: legitimate
        Flag("generate", "--temperature", "float", 0),
        Flag("generate", "--top-k", "int", 1),
        Flag("generate", "--top-p", "float", 0, 1, open_low=True),
        Flag("generate", "--seed", "int", 0, 2**63 - 1),
        Flag("inspect", "--port", "int", 0, 65535),  # parsed, not served: --html
        Flag("inspect", "--timeout", "float", 0, open_low=True),
        Flag("average", "--last", "int", 1),
        Flag("train", "--nproc", "int", 1, run_valid=False),  # a valid count launches processes
    ]


def base_argv(world: World, command: str) -> list[str]:
    """A working command line; the option under test comes after it (argparse keeps the last value)."""
    lm, mt, cls = (str(world.ckpt(t)) for t in ("lm", "translation", "classification"))
    return {
        "translate": ["translate", "--checkpoint", mt, "-i", str(world.data["in"])],
        "evaluate-mt": ["evaluate", "--checkpoint", mt, "--src", str(world.data["in"]), "--ref",
                        str(world.data["in"])],
        "evaluate-lm": ["evaluate", "--checkpoint", lm, "--data", str(world.data["text"])],
        "evaluate-cls": ["evaluate", "--checkpoint", cls, "--data", str(world.data["valid.tsv"])],
        "generate": ["generate", "--checkpoint", lm, "--max-new-tokens", "4", "--prompt", "the king"],
        "classify": ["classify", "--checkpoint", cls, "-i", str(world.data["in"])],
        "inspect": ["inspect", "--checkpoint", mt, "--html", "out.html"],
        "average": ["average", "--run", str(world.runs["lm"]), "--out", "averaged"],
        "train": ["train", str(world.recipe_files["lm"])],
    }[command]


NUMBER_TEXT = st.one_of(
    st.integers(-10**6, 0).map(str),
    st.integers(1, 300).map(str),
    st.integers(10**9, 10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.floats(-3, 3).map(lambda x: f"{x:.3g}"),
    st.sampled_from(["", " ", "abc", "1.5", "2.0", "1e3", "0x10", "NaN", "-inf", "inf", "1e400", "1_000", "+3",
                     "3 4", "1,5", "--", "-"]),
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=6),
)


def accepted(flag: Flag, text: str) -> float | None:
    """The value an option should take from ``text`` (None: refused)."""
    try:
        value: float = int(text.strip()) if flag.kind == "int" else float(text.strip())
    except ValueError:
        return None
    if not math.isfinite(value):
        return None
    above = value > flag.low if flag.open_low else value >= flag.low
    high = min(flag.high, MAX_WHOLE) if flag.kind == "int" else flag.high  # options take 64-bit whole numbers
    return value if above and value <= high else None


@fast(300)
@given(data=st.data())
def test_numeric_options(world: World, data: st.DataObject) -> None:
    flag = data.draw(st.sampled_from(numeric_flags(world)), label="flag")
    text = data.draw(NUMBER_TEXT, label="value")
    value = accepted(flag, text)
    if value is not None:
        assume(flag.run_valid and value < flag.run_below)
    check(world, [*base_argv(world, flag.command), f"{flag.flag}={text}"], 2 if value is None else 0, [flag.flag],
          "numeric option")


@fast(40)
@given(where=st.sampled_from(["generate --prompt", "inspect --text"]),
       text=st.text(st.one_of(st.characters(blacklist_characters="\x00"),  # any Unicode, and undecodable bytes
                              st.integers(0xDC80, 0xDCFF).map(chr)), min_size=1, max_size=12))
def test_text_arguments(world: World, where: str, text: str) -> None:
    """Any Unicode text is an input; text that was not UTF-8 on the command line (kept by Python as lone surrogates,
    which no output can encode) is refused."""
    surrogates = any("\ud800" <= ch <= "\udfff" for ch in text)
    flag = where.split()[1]
    argv = (["generate", "--checkpoint", str(world.ckpt("lm")), "--max-new-tokens", "2"] if where.startswith("gen")
            else ["inspect", "--checkpoint", str(world.ckpt("translation")), "--html", "out.html"])
    check(world, [*argv, f"{flag}={text}"], 2 if surrogates else 0, [flag], "text argument")


# ------------------------------------------------------------------------------------------------ checkpoint paths
CHECKPOINT_COMMANDS = {  # command -> (argv builder given the checkpoint, the task it needs or None: any)
    "generate": (lambda w, c: ["generate", "--checkpoint", c, "--max-new-tokens", "3"], "lm"),
    "translate": (lambda w, c: ["translate", "--checkpoint", c, "-i", str(w.data["in"])], "translation"),
    "classify": (lambda w, c: ["classify", "--checkpoint", c, "-i", str(w.data["in"])], "classification"),
    "evaluate": (lambda w, c: ["evaluate", "--checkpoint", c, "--data", str(w.data["text"])], None),  # any task
    "inspect": (lambda w, c: ["inspect", "--checkpoint", c, "--html", "out.html"], None),
    "check": (lambda w, c: ["check", "--checkpoint", c, "--no-resume"], None),
    "average": (lambda w, c: ["average", c, str(w.ckpt("lm")), "--out", "averaged"], None),
    "convert": (lambda w, c: ["convert", "--to-hf", c, "--out", "hf"], None),
}


@fast(40)
@given(command=st.sampled_from(sorted(CHECKPOINT_COMMANDS)),
       what=st.sampled_from(["missing", "a file", "an empty folder", "a run folder", "garbage", "another task"]))
def test_checkpoint_paths(world: World, command: str, what: str) -> None:
    build, task = CHECKPOINT_COMMANDS[command]
    other = {"lm": "classification", "translation": "lm", "classification": "translation"}
    assume(what != "another task" or task is not None)
    path = {"missing": world.root / "nowhere" / "best", "a file": world.data["in"],
            "an empty folder": world.root / "empty-folder", "a run folder": world.runs[task or "lm"],
            "garbage": world.bad["garbage"], "another task": world.ckpt(other.get(task or "lm", "lm"))}[what]
    check(world, build(world, str(path)), 2, [str(path), path.name, "--checkpoint"], "checkpoint path")


def test_a_run_folder_names_its_checkpoints(world: World) -> None:
    run = world.runs["translation"]
    case = world.new_case()
    check(world, ["translate", "--checkpoint", str(run), "-i", str(world.data["in"])], 2, [str(run / "best")],
          "checkpoint path", case)
    _, _, err = run_cli(["translate", "--checkpoint", str(run)], case)
    assert f"{run}: a training run's folder" in err and str(run / "best") in err and str(run / "last") in err


# ------------------------------------------------------------------------------------------------ bad input files
def input_cases(world: World) -> dict[str, tuple[Any, dict[str, int]]]:
    """Commands that read a file the user names: argv builder given the file, and the exit code by bad kind
    (missing kinds: 2)."""
    lm, mt, cls = (str(world.ckpt(t)) for t in ("lm", "translation", "classification"))
    decode_ok = {"empty": 0, "huge_line": 0}  # nothing to do, or a line cut to the model's length and named
    return {
        "translate -i": (lambda f: ["translate", "--checkpoint", mt, "-i", f], decode_ok),
        "translate -i --on-long error": (lambda f: ["translate", "--checkpoint", mt, "-i", f, "--on-long", "error"],
                                         {"empty": 0}),
        "classify -i": (lambda f: ["classify", "--checkpoint", cls, "-i", f], decode_ok),
        "generate --prompt-file": (lambda f: ["generate", "--checkpoint", lm, "--prompt-file", f,
                                              "--max-new-tokens", "3"], decode_ok),
        "inspect -i": (lambda f: ["inspect", "--checkpoint", mt, "-i", f, "--html", "out.html"], {"huge_line": 0}),
        "evaluate --src --ref": (lambda f: ["evaluate", "--checkpoint", mt, "--src", f, "--ref", f],
                                 {"huge_line": 0}),  # nothing to score is an error
        "evaluate --ref": (lambda f: ["evaluate", "--checkpoint", mt, "--src", str(world.data["in"]), "--ref", f],
                           {}),
        "evaluate lm --data": (lambda f: ["evaluate", "--checkpoint", lm, "--data", f, "--stride", "15",
                                          "--batch-size", "4096"], {"huge_line": 0}),
        "evaluate classification --data": (lambda f: ["evaluate", "--checkpoint", cls, "--data", f], {}),
        "train RECIPE": (lambda f: ["train", f], {}),
    }


@fast(80)
@given(data=st.data())
def test_bad_input_files(world: World, data: st.DataObject) -> None:
    cases = input_cases(world)
    name = data.draw(st.sampled_from(sorted(cases)), label="command")
    kind = data.draw(st.sampled_from(BAD_KINDS), label="file")
    build, ok = cases[name]
    path = world.bad[kind]
    check(world, build(str(path)), ok.get(kind, 2), [path.name], "input file")


@pytest.mark.skipif(AS_ROOT, reason="running as root, which reads a chmod 000 file anyway")
@pytest.mark.parametrize("name", ["translate -i", "classify -i", "generate --prompt-file", "inspect -i",
                                  "evaluate lm --data", "evaluate classification --data", "train RECIPE"])
def test_unreadable_input_files(world: World, name: str) -> None:
    build, _ = input_cases(world)[name]
    check(world, build(str(world.bad["unreadable"])), 2, [BAD_NAMES["unreadable"]], "input file")


# ------------------------------------------------------------------------------------------------ recipe files
def recipe_file(world: World, case: Path, recipe: dict[str, Any]) -> Path:
    path = case / "recipe.toml"
    path.write_text(to_toml(recipe), encoding="utf-8")
    return path


def broken_toml(text: str, rng: random.Random, how: str) -> str:
    """``text`` made invalid TOML by ``how``: a structural character deleted, a bad line inserted, a key or a
    section repeated."""
    lines = text.split("\n")
    if how == "delete":
        spots = [i for i, ch in enumerate(text) if ch in '[]="{}']
        i = rng.choice(spots)
        return text[:i] + text[i + 1:]
    if how == "insert":
        bad = rng.choice(["[data", "x = ", "= 1", "key", "[[", '"unclosed = 1', "x = [1, 2", "x = {a = 1",
                          "task = 'lm' 'x'", "a.b. = 1", "\x01 = 2", "x = 1 2", "[]", "x = tru"])
        lines.insert(rng.randrange(len(lines) + 1), bad)
        return "\n".join(lines)
    if how == "repeat key":
        keyed = [i for i, line in enumerate(lines) if " = " in line and not line.startswith("[")]
        i = rng.choice(keyed)
        return "\n".join([*lines[:i + 1], lines[i], *lines[i + 1:]])
    headers = [line for line in lines if line.startswith("[")]
    return text + "\n" + rng.choice(headers) + "\n"


@fast(40)
@given(task=st.sampled_from(["lm", "translation", "classification"]),
       how=st.sampled_from(["delete", "insert", "repeat key", "repeat section"]), seed=st.integers(0, 10**6))
def test_recipe_syntax_errors(world: World, task: str, how: str, seed: int) -> None:
    text = broken_toml(to_toml(world.recipes[task]), random.Random(seed), how)
    try:
        tomllib.loads(text)
        assume(False)  # still valid TOML: not a syntax error
    except tomllib.TOMLDecodeError:
        pass
    case = world.new_case()
    path = case / "broken.toml"
    path.write_text(text, encoding="utf-8")
    check(world, ["train", str(path)], 2, [path.name], "recipe syntax", case)


@fast(12)
@given(content=st.sampled_from(["# only a comment\n", "[data]\n", 'task = "nope"\n', "task = 3\n",
                                'task = "lm"\n[[data]]\nx = 1\n', 'task = "lm"\ndata = 3\n',
                                '\ufefftask = "lm"\n']))
def test_recipe_files_without_a_task(world: World, content: str) -> None:
    case = world.new_case()
    path = case / "odd.toml"
    path.write_text(content, encoding="utf-8")
    check(world, ["train", str(path)], 2, [path.name], "recipe file", case)


# ------------------------------------------------------------------------------------------------ recipe values
TASK_MODULES = {"lm": "aiayn.tasks.lm", "translation": "aiayn.tasks.translation",
                "classification": "aiayn.tasks.classification"}
#: values out of range, by (section, key): each must be refused
OUT_OF_RANGE: dict[tuple[str, str], list[Any]] = {
    ("train", "max_steps"): [0, -1], ("train", "lr"): [0, -1.0, math.nan, math.inf], ("train", "warmup"): [-1],
    ("train", "accum"): [0, -2], ("train", "label_smoothing"): [1.0, -0.1], ("train", "eval_every"): [0],
    ("train", "log_every"): [0], ("train", "keep_checkpoints"): [-1], ("train", "seed"): [-1, 10**12],
    ("train", "clip_norm"): [-1.0, 0.0], ("train", "weight_decay"): [-1.0], ("train", "eps"): [0.0],
    ("train", "min_lr_ratio"): [2.0], ("train", "max_nonfinite_steps"): [0], ("train", "threads"): [0],
    ("train", "betas"): [[1.5, 0.9], [0.9]], ("train", "max_minutes"): [0, -1.0], ("train", "save_every"): [0],
    ("train", "optimizer"): ["nope"], ("train", "schedule"): ["nope"], ("train", "device"): ["gpu7", ""],
    ("train", "dtype"): ["float8"], ("train", "out_dir"): ["", "  "],
    ("data", "block_size"): [1, -5], ("data", "batch_size"): [0], ("data", "eval_max_blocks"): [0],
    ("data", "val_fraction"): [1.0, -0.5], ("data", "max_len"): [2, 0], ("data", "max_tokens_per_side"): [1],
    ("data", "batch_tokens"): [0], ("data", "policy"): ["nope"],
    ("tokenizer", "vocab_size"): [-1, 2], ("tokenizer", "min_frequency"): [0], ("tokenizer", "kind"): ["nope"],
    ("tokenizer", "dropout"): [1.5],
    ("model", "d_model"): [0, -16, 10**12], ("model", "n_heads"): [0, 3], ("model", "n_layers"): [0, 10**9],
    ("model", "d_ff"): [0, 10**12], ("model", "dropout"): [1.5, -0.1], ("model", "position"): ["nope"],
    ("model", "norm"): ["nope"], ("model", "activation"): ["nope"], ("model", "max_len"): [0, 10**13],
    ("model", "n_encoder_layers"): [0, 10**9],
    ("decode", "beam"): [0], ("decode", "alpha"): [-1.0], ("decode", "max_len_a"): [-1.0],
    ("decode", "max_len_b"): [-1],
    ("eval", "bleu_sentences"): [0], ("eval", "bleu_beam"): [0],
}
TABLE_KEYS = {"label_names"}  # keys whose value is a table


def known_keys(task: str) -> dict[str, dict[str, Any]]:
    """Every key a recipe of ``task`` may set, with its default, by section."""
    import importlib

    from aiayn.config import ModelConfig
    from aiayn.train.train_config import TrainConfig

    module = importlib.import_module(TASK_MODULES[task])
    out = {s: dict(getattr(module, f"{s.upper()}_DEFAULTS")) for s in ("data", "tokenizer", "decode", "eval")
           if hasattr(module, f"{s.upper()}_DEFAULTS")}
    out["train"] = {f.name: getattr(TrainConfig(), f.name) for f in fields(TrainConfig)}
    out["model"] = {f.name: f.default for f in fields(ModelConfig)}
    return out


def wrong_types(default: Any, key: str) -> list[Any]:
    """Values whose type a key with this default refuses."""
    table = {"x": 1}
    if isinstance(default, bool):
        return ["yes", 3, [1], table]
    if isinstance(default, int):
        return ["many", True, 2.5, [1], table]
    if isinstance(default, float):
        return ["fast", True, [0.5], table]
    if isinstance(default, str):
        return [3, False, ["a"], table]
    if isinstance(default, (list, tuple)):
        return ["x", 3, table]
    return [] if key in TABLE_KEYS else [table]  # None: any type but a table is fine somewhere


@fast(240)
@given(data=st.data())
def test_bad_recipe_values(world: World, data: st.DataObject) -> None:
    task = data.draw(st.sampled_from(["lm", "translation", "classification"]), label="task")
    known = known_keys(task)
    section = data.draw(st.sampled_from(sorted(known)), label="section")
    how = data.draw(st.sampled_from(["wrong type", "out of range", "unknown key", "unknown section"]), label="how")
    if how == "unknown section":
        key = data.draw(st.from_regex(r"\A[a-z][a-z_]{2,9}\Z").filter(
            lambda k: k not in {"task", "name", "data", "tokenizer", "model", "train", "decode", "eval"}), label="key")
        value: Any = {"x": 1}
    elif how == "unknown key":
        key = data.draw(st.from_regex(r"\A[a-z][a-z_]{2,12}\Z").filter(
            lambda k: k not in known[section] and k != "preset" and k != "init_from"), label="key")
        value = data.draw(st.sampled_from([1, "x", True, 0.5]), label="value")
    elif how == "wrong type":
        key = data.draw(st.sampled_from(sorted(k for k, v in known[section].items() if wrong_types(v, k))),
                        label="key")
        value = data.draw(st.sampled_from(wrong_types(known[section][key], key)), label="value")
    else:
        keys = sorted(k for s, k in OUT_OF_RANGE if s == section and k in known[section])
        assume(keys)
        key = data.draw(st.sampled_from(keys), label="key")
        value = data.draw(st.sampled_from(OUT_OF_RANGE[(section, key)]), label="value")
    as_override = data.draw(st.booleans(), label="as override")
    case = world.new_case()
    recipe = json.loads(json.dumps(world.recipes[task]))
    overrides = []
    if how == "unknown section":
        if as_override:
            overrides = [f"{key}.x=1"]
        else:
            recipe[key] = value
    elif as_override:
        overrides = [f"{section}.{key}={override_text(value)}"]
    else:
        recipe.setdefault(section, {})[key] = value
    path = recipe_file(world, case, recipe)
    check(world, ["train", str(path), *overrides], 2, [key], "recipe value", case)


#: sizes no machine holds, by task: each must be refused before anything is allocated
HUGE = [("lm", "model", "d_ff", 10**12), ("lm", "model", "n_layers", 10**9), ("lm", "data", "block_size", 10**12),
        ("lm", "data", "batch_size", 10**11), ("lm", "model", "max_len", 10**13), ("lm", "model", "d_model", 10**8),
        ("translation", "model", "d_model", 2**20), ("translation", "model", "n_encoder_layers", 10**9),
        ("translation", "data", "batch_tokens", 10**13), ("classification", "model", "d_ff", 10**12),
        ("classification", "data", "max_len", 10**12), ("classification", "data", "batch_size", 10**12),
        ("lm", "model", "n_experts", 10**9)]


@fast(len(HUGE) * 2)
@given(size=st.sampled_from(HUGE), as_override=st.booleans())
def test_sizes_beyond_the_machine(world: World, size: tuple[str, str, str, int], as_override: bool) -> None:
    task, section, key, value = size
    case = world.new_case()
    recipe = json.loads(json.dumps(world.recipes[task]))
    if key == "n_experts":
        recipe["model"]["ffn"] = "moe"
    overrides = [f"{section}.{key}={value}"] if as_override else []
    if not as_override:
        recipe[section][key] = value
    check(world, ["train", str(recipe_file(world, case, recipe)), *overrides], 2, [key], "recipe size", case)


SECTION_NAMES = ("data", "tokenizer", "model", "train", "decode", "eval")
OVERRIDES = st.one_of(
    st.sampled_from(["noequals", "=1", "data.=1", ".x=1", "data..path=1", "data=3", "train=[1]", "data.path.x=1",
                     "train.max_steps", " . =1", "model.d_model.x.y=2", "train.max_steps==3", "train.lr=fast",
                     "model.dropout=[0.1]", "train.max_steps=1e3", "data.batch_size=four", "task=nope", "task=7"]),
    st.builds(lambda a, b: f"{a}.{b}=1", st.from_regex(r"\A[a-z]{1,8}\Z").filter(
        lambda x: x not in SECTION_NAMES), st.from_regex(r"\A[a-z_]{1,8}\Z")),
)


@fast(40)
@given(task=st.sampled_from(["lm", "translation", "classification"]), override=OVERRIDES)
def test_malformed_overrides(world: World, task: str, override: str) -> None:
    key = override.split("=", 1)[0]
    names = [part.strip() for part in key.split(".") if part.strip()]
    case = world.new_case()
    check(world, ["train", str(recipe_file(world, case, world.recipes[task])), override], 2,
          [override, *names[-1:]], "override", case)


def usage_mistakes(world: World) -> list[tuple[list[str], str]]:
    """Command lines argparse or a command refuses as a whole, and what the message must name."""
    lm, mt, cls = (str(world.ckpt(t)) for t in ("lm", "translation", "classification"))
    text, src = str(world.data["text"]), str(world.data["in"])
    return [
        (["translate"], "--checkpoint"), (["translate", "--checkpoint", mt, "-i", src, "--bogus"], "--bogus"),
        (["translate", "--checkpoint", mt, "-i", src, "stray"], "stray"),
        (["check", "--preset", "tiny", "--checkpoint", lm], "--checkpoint"), (["check", "--arch", "nope"], "--arch"),
        (["check", "--preset", "nope", "--no-resume"], "nope"), (["evaluate", "--checkpoint", lm], "--data"),
        (["evaluate", "--checkpoint", mt, "--src", src], "--ref"),
        (["evaluate", "--checkpoint", mt, "--src", src, "--ref", text], text),
        (["average", "--out", "o"], "--run"), (["average", lm, "--run", str(world.runs["lm"]), "--out", "o"], "--run"),
        (["average", "--last", "2", lm, "--out", "o"], "--last"), (["average", lm, mt, "--out", "o"], mt),
        (["inspect", "--checkpoint", lm, "--text", "x", "--input", src, "--html", "o.html"], "--text"),
        (["convert", "--out", "x"], "--from-hf"), (["convert", "--from-hf", str(world.hf), "--to-hf", lm, "--out", "x"],
                                                  "--to-hf"),
        (["generate", "--checkpoint", lm, "--on-long", "sometimes"], "--on-long"),
        (["generate", "--checkpoint", lm, "--dtype", "float8"], "--dtype"),
        (["generate", "--checkpoint", lm, "--int8", "--dtype", "bfloat16"], "--int8"),
        (["translate", "--checkpoint", mt, "--checkpoint", lm, "-i", src], lm),
        (["translate", "--checkpoint", mt, "--checkpoint", mt, "-i", src, "--attention", "a.json"], "--attention"),
        (["classify", "--checkpoint", cls, "-i", src, "--accel", "turbo"], "--accel"),
        (["train", str(world.recipe_files["lm"]), "--resume"], "run"), (["data", "download", "nope"], "nope"),
        (["demo", "nope"], "nope"), (["demo", "--steps", "0"], "--steps"),
    ]


@fast(40)
@given(data=st.data())
def test_usage_mistakes(world: World, data: st.DataObject) -> None:
    argv, culprit = data.draw(st.sampled_from(usage_mistakes(world)), label="command line")
    check(world, argv, 2, [culprit], "usage")


# ------------------------------------------------------------------------------------------------ recipe data files
DATA_KEYS = {"lm": ["path", "valid_path"], "classification": ["train", "valid"],
             "translation": ["train_src", "train_tgt", "valid_src", "valid_tgt"]}


def data_outcome(task: str, kind: str) -> int:
    """The exit code a recipe of ``task`` whose data file (any key) is a bad file of ``kind`` must give: 2, but for
    one long line of text, which a language model trains on (for translation it is one pair longer than the model
    takes, dropped, which leaves no pair; for classification a line without a label column)."""
    return 0 if (task, kind) == ("lm", "huge_line") else 2


@fast(80)
@given(task=st.sampled_from(sorted(DATA_KEYS)), data=st.data())
def test_bad_data_files(world: World, task: str, data: st.DataObject) -> None:
    key = data.draw(st.sampled_from(DATA_KEYS[task]), label="key")
    kind = data.draw(st.sampled_from(BAD_KINDS), label="file")
    both_sides = task == "translation" and data.draw(st.booleans(), label="both sides")
    case = world.new_case()
    recipe = json.loads(json.dumps(world.recipes[task]))
    recipe["data"][key] = str(world.bad[kind])
    if both_sides:
        recipe["data"][key.replace("_src", "_tgt") if key.endswith("_src") else key.replace("_tgt", "_src")] = \
            str(world.bad[kind])
    path = recipe_file(world, case, recipe)
    check(world, ["train", str(path)], data_outcome(task, kind), [world.bad[kind].name, key],
          "recipe data file", case)


# ------------------------------------------------------------------------------------------------ checkpoint files
CHECKPOINT_FILES = ("config.json", "model.safetensors", "tokenizer.json", "manifest.json")


@fast(100)
@given(command=st.sampled_from(sorted(CHECKPOINT_COMMANDS)), name=st.sampled_from(CHECKPOINT_FILES),
       kind=st.sampled_from(BAD_KINDS), manifest=st.booleans())
def test_damaged_checkpoint_files(world: World, command: str, name: str, kind: str, manifest: bool) -> None:
    assume(manifest or name != "manifest.json")
    build, task = CHECKPOINT_COMMANDS[command]
    case = world.new_case()
    ckpt = case / "ckpt"
    shutil.copytree(world.ckpt(task or "lm"), ckpt)
    if not manifest:
        (ckpt / "manifest.json").unlink()
    target = ckpt / name
    target.unlink()
    if kind == "folder":
        target.mkdir()
    elif kind != "missing":
        shutil.copyfile(world.bad[kind], target)
    expect = 0 if (name, kind) == ("manifest.json", "missing") else 2  # no manifest: loaded unverified
    check(world, build(world, str(ckpt)), expect, [name], "checkpoint file", case)


#: entries of a checkpoint's config.json with the wrong type
BAD_META = [("model", []), ("model", "x"), ("tokenizers", "x"), ("tokenizers", {"text": 5, "src": 5, "tgt": 5}),
            ("task", 7), ("decode", []), ("lowercase", "yes"), ("labels", 5), ("labels", []), ("block_size", "x"),
            ("block_size", -1), ("max_len", -3), ("label_names", 3), ("newline_symbol", 5),
            ("model.d_ff", 10**12), ("model.n_layers", 10**9), ("model.d_model", -8)]


@fast(40)
@given(command=st.sampled_from(["generate", "translate", "classify", "evaluate", "inspect", "check"]),
       entry=st.sampled_from(BAD_META))
def test_edited_checkpoint_configs(world: World, command: str, entry: tuple[str, Any]) -> None:
    build, task = CHECKPOINT_COMMANDS[command]
    case = world.new_case()
    ckpt = case / "ckpt"
    shutil.copytree(world.ckpt(task or "lm"), ckpt)
    (ckpt / "manifest.json").unlink()  # an edit the manifest would catch first
    meta = json.loads((ckpt / "config.json").read_text(encoding="utf-8"))
    key, value = entry
    if key.startswith("model."):
        meta["model"][key.removeprefix("model.")] = value
    else:
        meta[key] = value
    (ckpt / "config.json").write_text(json.dumps(meta), encoding="utf-8")
    check(world, build(world, str(ckpt)), 2, ["config.json"], "checkpoint config entry", case)


@fast(20)
@given(name=st.sampled_from(["config.json", "model.safetensors", "tokenizer.json"]), kind=st.sampled_from(BAD_KINDS))
def test_damaged_transformers_folders(world: World, name: str, kind: str) -> None:
    case = world.new_case()
    folder = case / "hf"
    shutil.copytree(world.hf, folder)
    target = folder / name
    target.unlink()
    if kind == "folder":
        target.mkdir()
    elif kind != "missing":
        shutil.copyfile(world.bad[kind], target)
    check(world, ["convert", "--from-hf", str(folder), "--out", "converted"], 2, [name, str(folder)],
          "transformers folder", case)


# ------------------------------------------------------------------------------------------------ other options
@fast(20)
@given(command=st.sampled_from(["generate", "translate", "classify", "inspect", "check"]),
       device=st.sampled_from(["nope", "gpu", "cuda:99", "cpu:x", "", "tpu", "cuda:-1"]))
def test_bad_devices(world: World, command: str, device: str) -> None:
    import torch

    assume(device != "cuda:99" or torch.cuda.device_count() < 99)
    build, task = CHECKPOINT_COMMANDS[command]
    check(world, [*build(world, str(world.ckpt(task or "lm"))), f"--device={device}"], 2, ["--device"], "device")


@fast(20)
@given(command=st.sampled_from(["translate --output", "translate --attention", "generate --attention",
                                "evaluate --hyp-out", "inspect --html"]),
       where=st.sampled_from(["a folder", "under a file"]))
def test_bad_output_paths(world: World, command: str, where: str) -> None:
    case = world.new_case()
    (case / "a-file.txt").write_text("x\n", encoding="utf-8")
    target = str(case) if where == "a folder" else str(case / "a-file.txt" / "out.txt")
    mt, lm = str(world.ckpt("translation")), str(world.ckpt("lm"))
    argv = {"translate --output": ["translate", "--checkpoint", mt, "-i", str(world.data["in"]), "--output", target],
            "translate --attention": ["translate", "--checkpoint", mt, "-i", str(world.data["in"]), "--attention",
                                      target],
            "generate --attention": ["generate", "--checkpoint", lm, "--max-new-tokens", "2", "--attention", target],
            "evaluate --hyp-out": ["evaluate", "--checkpoint", mt, "--src", str(world.data["in"]), "--ref",
                                   str(world.data["in"]), "--hyp-out", target],
            "inspect --html": ["inspect", "--checkpoint", mt, "--html", target]}[command]
    check(world, argv, 2, [command.split()[-1]], "output path", case)
