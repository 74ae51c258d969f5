"""Hostile files and paths: each is one error naming the file or path and the fix, exit code 2, never a traceback.

- JSON nested 200,000 deep as a checkpoint's ``config.json``, ``tokenizer.json`` or ``manifest.json``, a transformers
  folder's ``tokenizer.json`` / ``tokenizer_config.json``, the tied-names metadata of ``model.safetensors``, and an
  output folder's ``aiayn-output.json`` (Python's parser raises ``RecursionError``, the Rust one of ``tokenizers``
  says "recursion limit exceeded");
- ``train.out_dir`` with a 300-byte folder name, a path over 4096 bytes, a symbolic link that loops, one to a missing
  folder, or under a file; the same paths as the output folder of ``convert`` or ``average``;
- a ``training_state.pt`` that holds a pickled object (with a manifest that vouches for it): refused in one line;
- ``generate`` under an address-space limit (``ulimit -v``) too small for the model: said before the weights are
  read, with the memory needed and the memory allowed.

Counters (tried / survived / raw tracebacks) are printed at the end with ``-s``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import struct
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import safetensors.torch
import torch

from aiayn import ModelConfig, build_model
from aiayn.checkpoint import read_state_dict, save_checkpoint
from aiayn.checkpoint.layout import ALIASES_KEY
from aiayn.cli.main import main
from aiayn.errors import AiaynError
from aiayn.output_folder import CHECKPOINT, MARKER, TRANSFORMERS, check_output_folder
from aiayn.tokenize import CharTokenizer, PretrainedTokenizer

DEEP = "[" * 200_000 + "]" * 200_000
DEEP_INSIDE = '{"kind": "bpe", "model": ' + DEEP + "}"  # the nesting inside a file's usual object
COUNTS: Counter = Counter()
TEXT = "the king and queen of a fair land walk to sea by night with their old dog\n" * 20

RECIPE = """
task = "lm"
[data]
path = "{path}"
block_size = 16
batch_size = 4
eval_max_blocks = 2
[tokenizer]
kind = "char"
[model]
d_model = 16
n_heads = 2
n_layers = 1
d_ff = 32
dropout = 0.0
position = "learned"
[train]
out_dir = "{out}"
max_steps = 2
lr = 3e-3
eval_every = 2
log_every = 1
progress = false
threads = 1
"""


def _count(scenario: str, rc: int, err: str) -> None:
    COUNTS[f"{scenario}: tried"] += 1
    COUNTS[f"{scenario}: survived"] += rc == 2 and "Traceback" not in err
    COUNTS[f"{scenario}: raw tracebacks"] += "Traceback" in err


def _refused(argv: list[str], capsys: pytest.CaptureFixture, scenario: str, *words: str) -> str:
    """Run the command; it must exit 2 with one error line holding every one of ``words``."""
    rc = main(argv)
    err = capsys.readouterr().err
    _count(scenario, rc, err)
    assert rc == 2, err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in lines[0], (w, err)
    return lines[0]


def _vouch(ckpt: Path) -> None:
    """Rewrite the manifest so that it lists the files as they are now (a crafted checkpoint, not a damaged one)."""
    manifest = json.loads((ckpt / "manifest.json").read_text())
    for name in manifest["files"]:
        data = (ckpt / name).read_bytes()
        manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny aiayn language model with a char tokenizer, saved as training saves it."""
    tok = CharTokenizer.train([TEXT])
    config = ModelConfig(vocab_size=tok.vocab_size, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=32,
                         dropout=0.0, arch="decoder", position="learned", tie_embeddings=True)
    meta = {"task": "lm", "model": config.to_dict(), "tokenizers": {"text": "tokenizer.json"}, "block_size": 32}
    path = tmp_path_factory.mktemp("lm") / "ckpt"
    return save_checkpoint(path, build_model(config), meta, tokenizer_writer=lambda d: tok.save(d / "tokenizer.json"))


def _copy(lm: Path, tmp_path: Path) -> Path:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for f in lm.iterdir():
        (ckpt / f.name).write_bytes(f.read_bytes())
    return ckpt


def _generate(ckpt: Path) -> list[str]:
    return ["generate", "--checkpoint", str(ckpt), "--prompt", "the", "--max-new-tokens", "2"]


# ------------------------------------------------------------------------------------------- deeply nested JSON


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "manifest.json"])
def test_json_nested_200000_deep_in_a_checkpoint_is_one_error_naming_the_file(name: str, lm: Path, tmp_path: Path,
                                                                              capsys: pytest.CaptureFixture) -> None:
    ckpt = _copy(lm, tmp_path)
    (ckpt / name).write_text(DEEP_INSIDE)
    if name != "manifest.json":
        _vouch(ckpt)
    said = _refused(_generate(ckpt), capsys, "JSON nested 200,000 deep", f"{ckpt / name}", "nested too deeply")
    assert "valid" in said


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"])
def test_json_nested_200000_deep_in_a_transformers_tokenizer_folder(name: str, tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    hf = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    hf.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text('{"unk_token": "[UNK]"}')
    (tmp_path / name).write_text('{"model": ' + DEEP + "}")
    with pytest.raises(AiaynError) as e:
        PretrainedTokenizer.from_folder(tmp_path)
    said = str(e.value)
    _count("JSON nested 200,000 deep", 2, "")
    assert said.startswith(str(tmp_path / name)) and "\n" not in said, said
    assert re.search("nested too deeply|recursion limit", said), said


def test_deeply_nested_metadata_in_model_safetensors(lm: Path, tmp_path: Path) -> None:
    ckpt = _copy(lm, tmp_path)
    tensors = safetensors.torch.load_file(ckpt / "model.safetensors")
    safetensors.torch.save_file(tensors, ckpt / "model.safetensors", metadata={ALIASES_KEY: DEEP})
    _vouch(ckpt)
    with pytest.raises(AiaynError, match=re.escape(f"{ckpt / 'model.safetensors'}: cannot read model weights "
                                                   "(nested too deeply")):
        read_state_dict(ckpt)
    _count("JSON nested 200,000 deep", 2, "")


def test_a_deeply_nested_output_marker_marks_no_output_of_ours(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / MARKER).write_text(DEEP)
    with pytest.raises(AiaynError, match=f"{out}: exists, holds {MARKER}, and no {MARKER} of aiayn's marks it"):
        check_output_folder(out, TRANSFORMERS)
    _count("JSON nested 200,000 deep", 2, "")


# ---------------------------------------------------------------------------------------------- unusable paths


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    data = tmp_path / "data.txt"
    data.write_text(TEXT)
    file = tmp_path / "recipe.toml"
    file.write_text(RECIPE.format(path=data, out=tmp_path / "run"))
    return file


def _paths(tmp_path: Path) -> dict[str, tuple[Path, Path, tuple[str, ...]]]:
    """name -> (the path given, the path at fault, words the message must hold)."""
    long = tmp_path / ("n" * 300)
    too_long = tmp_path.joinpath(*["p" * 250] * 20)  # every name short enough, the whole path not
    (tmp_path / "loop-a").symlink_to("loop-b")
    (tmp_path / "loop-b").symlink_to("loop-a")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone" / "runs")
    (tmp_path / "a-file").write_text("mine\n")
    return {
        "300-byte name": (long, long, ("300 bytes long", "limit of 255 bytes per name", "shorten that name")),
        "300-byte name deeper": (long / "run", long, ("300 bytes long", "limit of 255 bytes per name")),
        "symlink loop": (tmp_path / "loop-a", tmp_path / "loop-a", ("a symbolic link that loops", "ln -sfn", "rm ")),
        "under a symlink loop": (tmp_path / "loop-a" / "run", tmp_path / "loop-a", ("a symbolic link that loops",)),
        "dangling symlink": (tmp_path / "dangling", tmp_path / "dangling",
                             ("a symbolic link to a missing folder", f"mkdir -p {tmp_path / 'gone' / 'runs'}")),
        "under a dangling symlink": (tmp_path / "dangling" / "run", tmp_path / "dangling",
                                     ("a symbolic link to a missing folder",)),
        "under a file": (tmp_path / "a-file" / "run", tmp_path / "a-file", ("is a file, not a folder, so",)),
        "path over 4096 bytes": (too_long, too_long, ("bytes long, over the file system's limit of", "shorten it")),
    }


def test_an_unusable_train_out_dir_is_named_in_words(recipe: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    for name, (given, at_fault, words) in _paths(tmp_path).items():
        said = _refused(["train", str(recipe), f"train.out_dir={given}"], capsys, "unusable train.out_dir",
                        f"error: {at_fault}: ", *words, "or choose another train.out_dir")
        assert "is a file" not in said or name == "under a file", (name, said)
    assert (tmp_path / "a-file").read_text() == "mine\n" and not (tmp_path / "gone").exists()


def test_an_unusable_output_folder_is_named_in_words(tmp_path: Path) -> None:
    for name, (given, at_fault, words) in _paths(tmp_path).items():
        for kind in (CHECKPOINT, TRANSFORMERS):
            with pytest.raises(AiaynError) as e:
                check_output_folder(given, kind)
            said = str(e.value)
            _count("unusable output folder", 2, "")
            assert said.startswith(f"{at_fault}: ") and said.endswith("or choose another folder"), (name, said)
            assert all(w in said for w in words), (name, said)


# --------------------------------------------------------------------------------------- pickled training state


class Payload:
    """What a pickle can carry besides data: an object whose class is imported (and whose code runs) on load."""


def test_a_pickled_training_state_is_refused_in_one_line(recipe: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    assert main(["train", str(recipe)]) == 0
    capsys.readouterr()
    last = tmp_path / "run" / "last"
    state = torch.load(last / "training_state.pt", weights_only=True)
    state["payload"] = Payload()
    torch.save(state, last / "training_state.pt")
    _vouch(last)
    before = {f.name: f.read_bytes() for f in last.iterdir()}
    said = _refused(["train", str(recipe), "--resume", "train.max_steps=4"], capsys, "pickled training state",
                    f"{last / 'training_state.pt'}: holds objects other than tensors and plain values",
                    f"{__name__}.Payload", "refused for safety", "could run code", "another train.out_dir")
    assert "weights_only" not in said and "WeightsUnpickler" not in said
    assert {f.name: f.read_bytes() for f in last.iterdir()} == before  # refused before anything was written


# ---------------------------------------------------------------------------------------------------- memory


def _address_space_in_use() -> int:
    """The address space a command uses before it loads a model (torch, the CLI and the trainer imported)."""
    probe = ("import re, aiayn.cli.main, aiayn.pretrained, aiayn.train.trainer; "
             "print(re.search(r'VmSize:\\s+(\\d+)', open('/proc/self/status').read()).group(1))")
    return int(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout) * 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the address space used from /proc")
def test_generate_under_ulimit_v_says_how_much_memory_the_model_needs(lm: Path, tmp_path: Path) -> None:
    """A model whose weights need more address space than ``ulimit -v`` leaves: refused before they are read.

    The weights are a sparse file (no disk used) of a size the limit cannot hold, as a checkpoint older than
    manifests (no checksum to compute over gigabytes of zeros); nothing allocates them."""
    limit = _address_space_in_use() + (1 << 30)
    ckpt = _copy(lm, tmp_path)
    (ckpt / "manifest.json").unlink()
    n = limit // 4 + 1  # float32 values: more bytes than the whole limit
    header = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(ckpt / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + 4 * n)

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    run = subprocess.run([sys.executable, "-m", "aiayn", *_generate(ckpt)], capture_output=True, text=True,
                         preexec_fn=low_limit, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    _count("generate under ulimit -v", run.returncode, run.stderr)
    assert run.returncode == 2, run.stderr[-3000:]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    said = re.search(r"error: (.*)", run.stderr).group(1)
    assert said.startswith(f"{ckpt / 'model.safetensors'}: the model needs "), said
    needed = int(re.search(r"needs (\d+) MiB", said).group(1))
    allowed = int(re.search(r"ulimit -v allows (\d+) MiB", said).group(1))
    assert needed > 2 * (4 * n >> 20) and allowed == limit >> 20, said
    assert "raise the limit" in said


@pytest.mark.skipif(not hasattr(os, "fork"), reason="sets ulimit -v in the child")
def test_a_limit_too_low_for_torch_itself_is_one_line_before_torch_loads(lm: Path) -> None:
    """`ulimit -v 400M`: torch would abort while loading (std::bad_alloc in C++, exit 134); aiayn says so first."""
    import resource

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (400 << 20, 400 << 20))

    run = subprocess.run([sys.executable, "-m", "aiayn", *_generate(lm)], capture_output=True, text=True,
                         preexec_fn=low_limit, timeout=120)
    _count("a command under ulimit -v 400M", run.returncode, run.stderr)
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr[-3000:]
    assert run.stderr.startswith("aiayn: error: this process may use 400 MiB of address space (ulimit -v 409600)")
    assert "raise the limit" in run.stderr


def test_pickled_objects_in_transformers_weights_are_refused_in_one_line(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture) -> None:
    """A transformers folder's pytorch_model.bin that carries more than tensors: one line, nothing unpickled."""
    transformers = pytest.importorskip("transformers")
    folder = tmp_path / "gpt2"
    folder.mkdir()
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2, bos_token_id=0,
                                     eos_token_id=0)
    config.to_json_file(folder / "config.json")
    state = {**transformers.GPT2LMHeadModel(config).state_dict(), "payload": Payload()}  # the older weights format
    torch.save(state, folder / "pytorch_model.bin")
    said = _refused(["convert", "--from-hf", str(folder), "--out", str(tmp_path / "out"), "--no-tokenizer"], capsys,
                    "pickled transformers weights", f"{folder / 'pytorch_model.bin'}: holds objects other than tensors",
                    f"{__name__}.Payload", "refused for safety")
    assert "weights_only" not in said and "WeightsUnpickler" not in said


def test_an_allocation_that_fails_while_loading_is_one_error(lm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the estimate cannot foresee (another process took the memory meanwhile): torch's allocation error, in
    words; any other RuntimeError passes unchanged."""
    import aiayn.pretrained as pretrained

    def no_memory(*args: object, **kw: object) -> None:
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:121] data. DefaultCPUAllocator: not enough memory: you "
                           "tried to allocate 4294967296 bytes.")
    monkeypatch.setattr(pretrained, "build_model", no_memory)
    with pytest.raises(AiaynError, match=re.escape(f"{lm / 'model.safetensors'}: out of memory while loading the "
                                                   "model (") + ".*DefaultCPUAllocator.*raise the limit"):
        pretrained.load_pretrained(lm, accel="none")

    def a_bug(*args: object, **kw: object) -> None:
        raise RuntimeError("shape mismatch")
    monkeypatch.setattr(pretrained, "build_model", a_bug)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        pretrained.load_pretrained(lm, accel="none")
    _count("allocation failing while loading", 2, "")


def test_zz_counts(capsys: pytest.CaptureFixture) -> None:
    with capsys.disabled():
        print("\nbad files:", dict(COUNTS))
