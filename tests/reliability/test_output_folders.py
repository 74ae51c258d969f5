"""No command deletes or overwrites what it did not write.

Every command that writes a folder where the user says (``convert --to-hf``, ``convert --from-hf``, ``average``,
``train``'s ``out_dir``, ``inspect --png``, the sharded export) is pointed at realistic victims: a git work tree
(``.git/``, ``src/x.py``, a ``config.json``, one commit) and a sentence-transformers folder (a transformers model
plus ``modules.json``, ``1_Pooling/config.json`` and ``README.md``). Each is refused with exit code 2 and one
message naming the folder and the flag, and every byte of every file survives (the tree is hashed before and
after). A command's source is never its destination, even with ``--overwrite``. A command run again into its own
output replaces only its own files; with ``--overwrite`` it writes its files into a foreign folder and leaves
every other file as it was. Output folders get the umask's modes in both directions of ``convert``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from aiayn import ModelConfig, build_model
from aiayn.checkpoint import save_checkpoint
from aiayn.cli.main import main
from aiayn.errors import AiaynError
from aiayn.output_folder import (
    CHECKPOINT,
    MARKER,
    PICTURES,
    TRANSFORMERS,
    check_output_folder,
    check_run_folder,
    install,
    staging_folder,
)
from aiayn.tokenize import CharTokenizer

transformers = pytest.importorskip("transformers")
from tokenizers import Tokenizer as HFTokenizer  # noqa: E402
from tokenizers import models, pre_tokenizers, trainers  # noqa: E402

TEXT = ["the king and queen of a fair land", "walk to sea by night with their old dog"] * 4
D, H, FF, MAX = 16, 2, 32, 32

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


# ---------------------------------------------------------------------------------------------- what is written
def _gpt2_folder(folder: Path) -> Path:
    """A tiny random GPT-2 as ``save_pretrained`` writes it, with its fast tokenizer."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=280, special_tokens=["<|endoftext|>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                      show_progress=False))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
              for m in json.loads(tok.to_str())["model"]["merges"]]
    transformers.GPT2TokenizerFast(vocab=tok.get_vocab(with_added_tokens=False), merges=merges).save_pretrained(
        folder)
    eos = tok.token_to_id("<|endoftext|>")
    cfg = transformers.GPT2Config(vocab_size=tok.get_vocab_size(), n_positions=MAX, n_embd=D, n_layer=1, n_head=H,
                                  n_inner=FF, bos_token_id=eos, eos_token_id=eos)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(folder)
    return folder


def _aiayn_lm(path: Path) -> Path:
    """A GPT-2-shaped aiayn language model with a char tokenizer, saved as training saves it."""
    tok = CharTokenizer.train(TEXT)
    config = ModelConfig(vocab_size=tok.vocab_size, d_model=D, n_heads=H, n_layers=1, d_ff=FF, max_len=MAX,
                         dropout=0.0, arch="decoder", activation="gelu", norm="layernorm", norm_position="pre",
                         position="learned", scale_embeddings=False, tie_embeddings=True, init="gpt2")
    torch.manual_seed(0)
    meta = {"task": "lm", "model": config.to_dict(), "tokenizers": {"text": "tokenizer.json"}, "block_size": MAX,
            "newline_symbol": None, "packing": False}
    return save_checkpoint(path, build_model(config), meta, tokenizer_writer=lambda d: tok.save(d / "tokenizer.json"))


def _sharded(path: Path) -> Path:
    """An aiayn checkpoint with a ``dcp/`` folder, written in this one process (as rank 0 of one would)."""
    from aiayn.train.dcp_checkpoint import _write

    tok = CharTokenizer.train(TEXT)
    config = ModelConfig(vocab_size=tok.vocab_size, d_model=D, n_heads=H, n_layers=1, d_ff=FF, max_len=MAX,
                         dropout=0.0, arch="decoder")
    model = build_model(config)
    optimizer = torch.optim.AdamW(model.parameters())
    meta = {"task": "lm", "model": config.to_dict(), "tokenizers": {"text": "tokenizer.json"}, "block_size": MAX,
            "newline_symbol": None, "packing": False}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # one process, as intended
        return save_checkpoint(path, model, meta, tokenizer_writer=lambda d: tok.save(d / "tokenizer.json"),
                               shard_writer=lambda tmp: _write(tmp / "dcp", model, optimizer))


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sources: a transformers folder, two aiayn checkpoints, a sharded one and a recipe's corpus."""
    root = tmp_path_factory.mktemp("sources")
    corpus = root / "text.txt"
    corpus.write_text("\n".join(TEXT * 10) + "\n", encoding="utf-8")
    return {"hf": _gpt2_folder(root / "gpt2"), "ck": _aiayn_lm(root / "ck"), "ck2": _aiayn_lm(root / "ck2"),
            "sharded": _sharded(root / "sharded"), "corpus": corpus}


# ---------------------------------------------------------------------------------------------- the victims
def _git_tree(folder: Path) -> Path:
    """A git work tree with one commit: ``src/x.py``, ``config.json``."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    (folder / "src").mkdir(parents=True)
    (folder / "src" / "x.py").write_text("print('my project')\n", encoding="utf-8")
    (folder / "config.json").write_text('{"name": "my project", "version": 3}\n', encoding="utf-8")
    git = ["git", "-C", str(folder), "-c", "user.name=T", "-c", "user.email=t@example.org", "-c",
           "init.defaultBranch=main"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "first"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    return folder


def _sentence_transformers(folder: Path, made: dict[str, Path]) -> Path:
    """A sentence-transformers folder: a transformers model plus its modules, pooling and model card."""
    shutil.copytree(made["hf"], folder)
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]) + "\n")
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text('{"word_embedding_dimension": 16, "pooling_mode_mean_tokens": '
                                                       'true}\n')
    (folder / "config_sentence_transformers.json").write_text('{"__version__": {"sentence_transformers": "3.0.0"}}\n')
    (folder / "README.md").write_text("# my embedding model\n\nTrained for a month.\n")
    return folder


VICTIMS = ("git", "sentence-transformers")


@pytest.fixture(params=VICTIMS)
def victim(request: pytest.FixtureRequest, tmp_path: Path, made: dict[str, Path]) -> Path:
    if request.param == "git":
        return _git_tree(tmp_path / "project")
    return _sentence_transformers(tmp_path / "st-model", made)


def _tree(root: Path) -> dict[str, str]:
    """Every entry under ``root``: relative path -> SHA-256 of a file, ``dir``, or ``link -> target``."""
    out: dict[str, str] = {}
    for here, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(here) / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                out[rel] = f"link -> {os.readlink(path)}"
            elif path.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _refused(capsys: pytest.CaptureFixture, argv: list[str], folder: Path, *words: str) -> str:
    """Run the CLI; it must exit 2 with one error on stderr, one line naming ``folder`` (and ``words``). Only
    ``train`` says more there: the progress note it prints before it reaches the folder."""
    code = main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    errors = [line for line in lines if line.startswith(f"aiayn {argv[0]}: error: ")]
    assert code == 2, err
    assert len(errors) == 1 and (len(lines) == 1 or argv[0] == "train"), err
    assert str(folder) in errors[0] and all(w in errors[0] for w in words), errors[0]
    assert "Traceback" not in err
    return errors[0]


def _siblings(folder: Path) -> list[str]:
    """Hidden temporary or trash folders left beside ``folder``."""
    return [p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}.")]


TRIED = {"refused": 0, "rerun": 0, "overwrite": 0}


# ---------------------------------------------------------------------------------------------- refusals
def _convert_to_hf(made, out, *flags):
    return ["convert", "--to-hf", str(made["ck"]), "--out", str(out), *flags]


def _convert_from_hf(made, out, *flags):
    return ["convert", "--from-hf", str(made["hf"]), "--out", str(out), *flags]


def _average(made, out, *flags):
    return ["average", str(made["ck"]), str(made["ck2"]), "--out", str(out), *flags]


def _inspect_png(made, out, *flags):
    return ["inspect", "--checkpoint", str(made["ck"]), "--text", "the king", "--png", str(out), *flags]


COMMANDS = {"convert --to-hf": _convert_to_hf, "convert --from-hf": _convert_from_hf, "average": _average,
            "inspect --png": _inspect_png}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_folder_the_command_did_not_write_is_refused_untouched(command: str, victim: Path, made, capsys) -> None:
    before = _tree(victim)
    message = _refused(capsys, COMMANDS[command](made, victim), victim, "--overwrite", "refusing to write")
    assert "nothing else there is changed or removed" in message
    assert _tree(victim) == before and not _siblings(victim)
    TRIED["refused"] += 1


def test_a_fresh_training_run_into_a_folder_that_is_not_a_run_folder_is_refused(victim: Path, made, tmp_path,
                                                                                  capsys) -> None:
    recipe = tmp_path / "lm.toml"
    recipe.write_text(RECIPE.format(path=made["corpus"].as_posix(), out=victim.as_posix()), encoding="utf-8")
    before = _tree(victim)
    _refused(capsys, ["train", str(recipe)], victim, "not an aiayn run folder", "train.out_dir")
    assert _tree(victim) == before  # the run's lock came and went
    TRIED["refused"] += 1


def test_the_sharded_export_refuses_a_folder_it_did_not_write(victim: Path, made) -> None:
    from aiayn.train.dcp_checkpoint import export_sharded, has_sharded

    assert has_sharded(made["sharded"])
    before = _tree(victim)
    with pytest.raises(AiaynError, match="overwrite=True") as e:
        export_sharded(made["sharded"], victim)
    assert str(victim) in str(e.value) and "\n" not in str(e.value)
    assert _tree(victim) == before and not _siblings(victim)
    TRIED["refused"] += 1


def test_a_demo_clears_only_its_own_earlier_run(victim: Path, tmp_path: Path) -> None:
    from aiayn.output_folder import clear_run_folder

    before = _tree(victim)
    with pytest.raises(AiaynError, match="not an aiayn run folder"):
        clear_run_folder(victim, extra=("cross_attention.png",))
    assert _tree(victim) == before
    TRIED["refused"] += 1
    run = tmp_path / "demo"
    for sub in ("last", "best", "step-4"):
        (run / sub).mkdir(parents=True)
        (run / sub / "config.json").write_text("{}")
    for name in ("metrics.jsonl", "learning_curve.png", "cross_attention.png"):
        (run / name).write_text("x")
    clear_run_folder(run, extra=("cross_attention.png",))
    assert run.is_dir() and not any(run.iterdir())


def test_a_run_file_that_is_a_folder_is_named(tmp_path: Path) -> None:
    from aiayn.output_folder import check_run_folder

    (tmp_path / "run" / "learning_curve.png").mkdir(parents=True)
    with pytest.raises(AiaynError, match=r"learning_curve.png: is a folder, where training writes its"):
        check_run_folder(tmp_path / "run")


def test_a_source_is_never_the_destination_even_with_overwrite(made, tmp_path: Path, capsys) -> None:
    hf, ck = made["hf"], made["ck"]
    sources = {hf: _tree(hf), ck: _tree(ck), made["ck2"]: _tree(made["ck2"])}
    for argv, out in [(["convert", "--from-hf", str(hf), "--out", str(hf)], hf),
                      (["convert", "--from-hf", str(hf), "--out", str(hf / "sub")], hf / "sub"),
                      (["convert", "--from-hf", str(hf), "--out", str(hf.parent)], hf.parent),
                      (["convert", "--to-hf", str(ck), "--out", str(ck)], ck),
                      (["convert", "--to-hf", str(ck), "--out", str(ck / "hf")], ck / "hf"),
                      (["average", str(ck), str(made["ck2"]), "--out", str(made["ck2"] / "avg")], made["ck2"] / "avg"),
                      (["average", str(ck), str(made["ck2"]), "--out", str(ck.parent)], ck.parent),
                      (["inspect", "--checkpoint", str(ck), "--text", "a", "--png", str(ck / "png")], ck / "png")]:
        for flags in ([], ["--overwrite"]):
            _refused(capsys, argv + flags, out, "source")
            TRIED["refused"] += 1
    from aiayn.train.dcp_checkpoint import export_sharded

    sharded = _tree(made["sharded"])
    with pytest.raises(AiaynError, match="is the source"):
        export_sharded(made["sharded"], made["sharded"], overwrite=True)
    TRIED["refused"] += 1
    assert {p: _tree(p) for p in sources} == sources and _tree(made["sharded"]) == sharded
    assert not (hf / "sub").exists() and not (ck / "hf").exists() and not (ck / "png").exists()


def test_a_file_is_never_an_output_folder(made, tmp_path: Path, capsys) -> None:
    file = tmp_path / "notes.txt"
    file.write_text("keep me\n")
    for command in sorted(COMMANDS):
        _refused(capsys, COMMANDS[command](made, file, "--overwrite"), file, "is a file")
        TRIED["refused"] += 1
    assert file.read_text() == "keep me\n"


# ---------------------------------------------------------------------------------------------- own output again
def _loads(command: str, out: Path) -> None:
    """What ``command`` wrote at ``out`` is whole: its manifest lists exactly its files, and it loads."""
    if command == "convert --to-hf":
        marker = json.loads((out / MARKER).read_text())
        assert marker["aiayn_output"] == TRANSFORMERS
        for name, entry in marker["files"].items():
            assert hashlib.sha256((out / name).read_bytes()).hexdigest() == entry["sha256"], name
        transformers.AutoModelForCausalLM.from_pretrained(str(out))
        transformers.AutoTokenizer.from_pretrained(str(out))
    elif command == "inspect --png":
        marker = json.loads((out / MARKER).read_text())
        assert sorted(marker["files"]) == sorted(p.name for p in out.glob("*.png"))
    else:
        from aiayn.pretrained import load_pretrained

        load_pretrained(out, accel="none")


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_the_command_run_again_into_its_own_output_replaces_only_its_own_files(command: str, made, tmp_path: Path,
                                                                               capsys) -> None:
    out = tmp_path / "out"
    assert main(COMMANDS[command](made, out)) == 0
    first = _tree(out)
    assert main(COMMANDS[command](made, out)) == 0  # its own output, nothing else: replaced as a whole
    assert _tree(out) == first and not _siblings(out)
    (out / "NOTES.md").write_text("what I found\n")  # the user's file beside the output
    (out / "extra").mkdir()
    (out / "extra" / "plot.svg").write_text("<svg/>\n")
    assert main(COMMANDS[command](made, out)) == 0  # now file by file: the user's files stay
    assert (out / "NOTES.md").read_text() == "what I found\n" and (out / "extra" / "plot.svg").read_text() == "<svg/>\n"
    assert _tree(out).keys() - {"NOTES.md", "extra", "extra/plot.svg"} == first.keys()
    _loads(command, out)
    assert not _siblings(out)
    capsys.readouterr()
    TRIED["rerun"] += 1


def test_a_sharded_export_again_into_its_own_output(made, tmp_path: Path) -> None:
    from aiayn.train.dcp_checkpoint import export_sharded

    out = export_sharded(made["sharded"], tmp_path / "exported")
    (out / "NOTES.md").write_text("mine\n")
    assert export_sharded(made["sharded"], out) == out
    assert (out / "NOTES.md").read_text() == "mine\n"
    _loads("export", out)
    TRIED["rerun"] += 1


def test_a_training_run_starts_in_an_empty_folder_and_in_what_runs_leave(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    check_run_folder(empty)
    check_run_folder(tmp_path / "missing")
    run = tmp_path / "run"
    for name in ("best", "step-4", "step-8.old", "averaged", ".last.tmp-host-123-0123abcd"):
        (run / name).mkdir(parents=True)
    for name in ("metrics.jsonl", ".lock", "learning_curve.png"):
        (run / name).write_text("")
    check_run_folder(run)
    (run / "step-x").mkdir()
    (run / "data.txt").write_text("")
    with pytest.raises(AiaynError, match=r"it holds data.txt, step-x\); a new run writes"):
        check_run_folder(run)


# ---------------------------------------------------------------------------------------------- --overwrite
#: the files each command writes (every other file of the victim must survive byte for byte)
WRITES = {"convert --to-hf": {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                              "tokenizer_config.json", "special_tokens_map.json", MARKER},
          "convert --from-hf": {"config.json", "model.safetensors", "tokenizer.json", "manifest.json"},
          "average": {"config.json", "model.safetensors", "tokenizer.json", "manifest.json"},
          "inspect --png": {"decoder_layer0.png", "mask_decoder.png", "positions_decoder.png", MARKER}}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_with_overwrite_the_command_writes_its_files_and_leaves_every_other(command: str, victim: Path, made,
                                                                              capsys) -> None:
    before = _tree(victim)
    assert main(COMMANDS[command](made, victim, "--overwrite")) == 0, capsys.readouterr().err
    after = _tree(victim)
    written = {k for k in after if after[k] != before.get(k)}
    assert written <= WRITES[command], written
    assert {k: v for k, v in before.items() if k not in WRITES[command]} == {
        k: v for k, v in after.items() if k in before and k not in WRITES[command]}
    _loads(command, victim)
    if (victim / ".git").is_dir():  # the repository itself is whole: only its config.json differs from the commit
        status = subprocess.run(["git", "-C", str(victim), "status", "--porcelain"], capture_output=True, text=True,
                                check=True).stdout
        assert " M src/x.py" not in status and "D " not in status
        subprocess.run(["git", "-C", str(victim), "fsck", "--no-progress"], check=True, capture_output=True)
    # written once with the flag, the folder is the command's own output: again without the flag, still nothing else
    assert main(COMMANDS[command](made, victim)) == 0
    again = _tree(victim)
    assert {k: v for k, v in before.items() if k not in WRITES[command]} == {
        k: v for k, v in again.items() if k in before and k not in WRITES[command]}
    assert not _siblings(victim)
    capsys.readouterr()
    TRIED["overwrite"] += 1


def test_the_sharded_export_with_overwrite_leaves_every_other_file(victim: Path, made) -> None:
    from aiayn.train.dcp_checkpoint import export_sharded

    before = _tree(victim)
    export_sharded(made["sharded"], victim, overwrite=True)
    after = _tree(victim)
    mine = {"config.json", "model.safetensors", "tokenizer.json", "manifest.json"}
    assert {k: v for k, v in before.items() if k not in mine} == {
        k: v for k, v in after.items() if k in before and k not in mine}
    _loads("export", victim)
    TRIED["overwrite"] += 1


def test_a_folder_in_the_way_of_an_output_file_is_one_error_and_nothing_moves(made, tmp_path: Path, capsys) -> None:
    out = tmp_path / "odd"
    (out / "model.safetensors").mkdir(parents=True)  # a folder where the checkpoint puts a file
    (out / "model.safetensors" / "keep.txt").write_text("keep\n")
    before = _tree(out)
    _refused(capsys, _convert_from_hf(made, out, "--overwrite"), out / "model.safetensors", "in the way")
    assert _tree(out) == before and not _siblings(out)
    TRIED["refused"] += 1


def test_files_the_earlier_output_no_longer_writes_go_unless_someone_changed_them(tmp_path: Path) -> None:
    out = tmp_path / "pictures"
    for names in (["a.png", "b.png", "c.png"], ["a.png"]):
        tmp = staging_folder(out)
        for name in names:
            (tmp / name).write_bytes(b"picture " + name.encode())
        if names == ["a.png"]:
            (out / "NOTES.md").write_text("mine\n")  # beside the output: the second one is merged in
            (out / "c.png").write_bytes(b"edited by hand, a different size")
        install(tmp, check_output_folder(out, PICTURES))
    assert sorted(p.name for p in out.iterdir()) == sorted(["NOTES.md", MARKER, "a.png", "c.png"])  # b.png: aiayn's
    assert json.loads((out / MARKER).read_text())["files"].keys() == {"a.png"}
    TRIED["rerun"] += 1


# ---------------------------------------------------------------------------------------------- modes
@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_both_directions_of_convert_write_folders_with_the_umasks_modes(made, tmp_path: Path, umask_022,
                                                                         capsys) -> None:
    to, back = tmp_path / "to-hf", tmp_path / "from-hf"
    assert main(_convert_to_hf(made, to)) == 0 and main(["convert", "--from-hf", str(to), "--out", str(back)]) == 0
    for folder in (to, back):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o755, folder
        for file in folder.iterdir():
            assert stat.S_IMODE(file.stat().st_mode) == 0o644, file
    capsys.readouterr()


def test_the_guard_reads_manifests_not_file_names(made, tmp_path: Path) -> None:
    assert check_output_folder(made["ck"], CHECKPOINT).state == "own"
    assert check_output_folder(made["ck"], CHECKPOINT).whole
    legacy = tmp_path / "legacy"  # config.json and weights, but no manifest: not recognised by their names
    shutil.copytree(made["ck"], legacy)
    (legacy / "manifest.json").unlink()
    with pytest.raises(AiaynError, match="no manifest.json of aiayn's"):
        check_output_folder(legacy, CHECKPOINT)
    with pytest.raises(AiaynError, match=f"no {MARKER} of aiayn's"):
        check_output_folder(made["ck"], TRANSFORMERS)  # an aiayn checkpoint is not a transformers export
    (legacy / "manifest.json").write_text('{"name": "my web app", "icons": []}')  # someone else's manifest.json
    with pytest.raises(AiaynError, match="refusing to write into it"):
        check_output_folder(legacy, CHECKPOINT)
    assert check_output_folder(legacy, CHECKPOINT, overwrite=True).state == "other"


def test_zz_counts(capsys) -> None:
    """The battery's counts for docs/reliability.md (printed with -s)."""
    with capsys.disabled():
        print(f"\noutput folders: {TRIED}")
