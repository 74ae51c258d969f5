"""Image classification end to end on tiny Vision Transformers: a folder of PNG bars and scikit-learn's digits
trained a few steps, the checkpoint read back by ``load_pretrained``, ``aiayn classify`` on image files,
``aiayn evaluate``, ``aiayn inspect`` over patches, resume == uninterrupted, and the recipe checks of the new
fields."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from aiayn.checkpoint import read_state_dict
from aiayn.cli.main import main
from aiayn.pretrained import load_pretrained
from aiayn.tasks.image_classification import evaluate_images, predict_proba
from aiayn.tasks.registry import run_recipe
from aiayn.train.recipe import load_recipe, recipe_problems

mpimg = pytest.importorskip("matplotlib.image")

RECIPE = """task = "image_classification"

[data]
{data}
batch_size = 16

[model]
input = "patches"
patch_size = 2
d_model = 16
n_heads = 2
n_layers = 2
d_ff = 32
dropout = 0.0
norm_position = "pre"
position = "learned"
{model}

[train]
out_dir = "{out}"
max_steps = {steps}
optimizer = "adamw"
lr = 3e-3
schedule = "constant_warmup"
warmup = 5
label_smoothing = 0.0
eval_every = {steps}
log_every = 1
progress = false
threads = 1
"""


def _bars(folder: Path, n: int, seed: int) -> None:
    """``n`` 8x8 grey PNGs per class: a bright horizontal bar ("h") or vertical bar ("v") on faint noise."""
    g = np.random.default_rng(seed)
    for name in ("h", "v"):
        (folder / name).mkdir(parents=True)
        for i in range(n):
            x = g.uniform(0, 0.2, (8, 8))
            k = g.integers(0, 8)
            if name == "h":
                x[k] = 1.0
            else:
                x[:, k] = 1.0
            mpimg.imsave(folder / name / f"{i}.png", x, cmap="gray", vmin=0, vmax=1)


def _recipe(tmp_path: Path, name: str, data: str, steps: int, model: str = "") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(RECIPE.format(data=data, model=model, out=tmp_path / name, steps=steps), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def bars(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bars")
    _bars(root / "train", 24, 0)
    _bars(root / "valid", 6, 1)
    return root


@pytest.fixture(scope="module")
def bars_checkpoint(bars: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("bars_run")
    run_recipe(_recipe(tmp, "run", f'train = "{bars / "train"}"\nvalid = "{bars / "valid"}"', 60), [])
    return tmp / "run" / "last"


def test_a_folder_of_images_trains_and_its_checkpoint_classifies_files(bars: Path, bars_checkpoint: Path,
                                                                       tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    pre = load_pretrained(bars_checkpoint)
    meta = json.loads((bars_checkpoint / "config.json").read_text(encoding="utf-8"))
    assert pre.task == "image_classification" and meta["labels"] == ["h", "v"] and meta["tokenizers"] == {}
    c = pre.config
    assert (c.input, c.image_size, c.channels, c.n_classes, c.max_len) == ("patches", 8, 1, 2, 17)
    assert "patch_embed.proj.weight" in read_state_dict(bars_checkpoint)
    scores = evaluate_images(pre, str(bars / "valid"))
    assert scores["examples"] == 12 and scores["accuracy"] >= 0.9

    files = sorted((bars / "valid").glob("*/*.png"))
    listing = tmp_path / "images.txt"
    listing.write_text("\n".join(str(f.relative_to(bars)) for f in files[:3]) + "\n\n" + str(files[-1]) + "\n",
                       encoding="utf-8")
    (tmp_path / "valid").symlink_to(bars / "valid")  # relative paths are read beside the list
    assert main(["classify", "--checkpoint", str(bars_checkpoint), "-i", str(listing)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 5 and out[3] == ""
    from aiayn.data.images import image_input

    images = torch.stack([image_input(pre, f) for f in [*files[:3], files[-1]]])
    probs = predict_proba(pre.model, images)
    want = [f"{['h', 'v'][int(k)]}\t{float(p):.4f}" for p, k in zip(*probs.max(-1))]
    assert [line for line in out if line] == want

    assert main(["classify", "--checkpoint", str(bars_checkpoint), "-i", str(files[0])]) == 0
    assert capsys.readouterr().out.splitlines() == [want[0]]
    assert main(["evaluate", "--checkpoint", str(bars_checkpoint), "--data", str(bars / "valid")]) == 0
    assert '"examples": 12' in capsys.readouterr().out


def test_a_bad_image_is_one_clear_error(bars_checkpoint: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture) -> None:
    np.save(tmp_path / "wide.npy", np.zeros((8, 10), dtype=np.float32))
    listing = tmp_path / "images.txt"
    listing.write_text("wide.npy\n", encoding="utf-8")
    assert main(["classify", "--checkpoint", str(bars_checkpoint), "-i", str(listing)]) == 2
    err = capsys.readouterr().err
    assert f"{listing}:1: {tmp_path / 'wide.npy'}: a 8x10 image; this model reads square 8x8 images" in err
    assert "Traceback" not in err


def test_the_explorer_reads_an_image_over_its_patches(bars: Path, bars_checkpoint: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    from aiayn.inspect.image import inspect_image, pooled_attention

    image = sorted((bars / "valid" / "h").glob("*.png"))[0]
    record = inspect_image(load_pretrained(bars_checkpoint), image)
    assert record["tokens"]["encoder"] == ["CLS"] + [f"p{i}" for i in range(16)]
    assert np.array(record["attention"]["encoder"]).shape == (2, 2, 17, 17)  # (L, H, T, S)
    assert len(record["stats"]["encoder"]) == 2 and record["output"]["prediction"] in ("h", "v")
    assert np.array(record["positions"]["encoder"]["table"]).shape[0] >= 17
    assert record["image"]["cells"][1:3] == [(0, 0), (0, 1)] and pooled_attention(record, 1).shape == (4, 4)
    assert main(["inspect", "--checkpoint", str(bars_checkpoint), "-i", str(image), "--png", str(tmp_path)]) == 0
    assert {"image.png", "patch_attention_layer0.png", "encoder_layer1.png"} <= {f.name for f in tmp_path.iterdir()}
    assert main(["inspect", "--checkpoint", str(bars_checkpoint), "--html", str(tmp_path / "x.html")]) == 2
    assert "give the image to inspect with -i IMAGE.png" in capsys.readouterr().err
    from aiayn.errors import AiaynError
    from aiayn.inspect import inspect_text

    with pytest.raises(AiaynError, match="reads images, not text"):  # what the served explorer's text box gets
        inspect_text(load_pretrained(bars_checkpoint), "a text")


def test_digits_train_and_evaluate_on_the_recipe_split(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("sklearn")
    recipe = _recipe(tmp_path, "digits", 'source = "sklearn-digits"\nval_fraction = 0.2', 120)
    run_recipe(recipe, [])
    pre = load_pretrained(tmp_path / "digits" / "last")
    assert (pre.config.image_size, pre.config.channels, pre.config.n_classes) == (8, 1, 10)
    assert pre.meta["data"] == {"source": "sklearn-digits", "val_fraction": 0.2, "split_seed": 0}
    scores = evaluate_images(pre, "sklearn-digits")
    assert scores["examples"] == 359 and scores["accuracy"] > 0.5  # 120 steps: far above chance (0.1)
    assert main(["evaluate", "--checkpoint", str(tmp_path / "digits" / "last"), "--data", "sklearn-digits"]) == 0
    assert '"examples": 359' in capsys.readouterr().out


def test_resume_equals_the_uninterrupted_run(bars: Path, tmp_path: Path) -> None:
    """With shifted images too: a batch's shifts are a function of its position in the stream."""
    data = f'train = "{bars / "train"}"\nmax_shift = 1'
    run_recipe(_recipe(tmp_path, "straight", data, 8), [])
    run_recipe(_recipe(tmp_path, "resumed", data, 4), [])
    run_recipe(_recipe(tmp_path, "resumed", data, 8), [], resume=True)
    a, b = read_state_dict(tmp_path / "straight" / "last"), read_state_dict(tmp_path / "resumed" / "last")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_recipe_checks_name_every_bad_image_setting(bars: Path, tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, "bad", f'train = "{bars / "train"}"\nsource = "mnist"', 5, "image_size = 8")
    problems = recipe_problems(load_recipe(recipe, ["model.patch_size=3", "data.max_shift=-1"]))
    assert any("max_shift=-1: must be a whole number of pixels >= 0" in p for p in problems)
    assert any("source='mnist': unknown" in p for p in problems)
    assert any("set one of source" in p and "not both" in p for p in problems)
    assert any("patch_size=3: does not divide image_size=8" in p for p in problems)
    missing = _recipe(tmp_path, "missing", f'train = "{tmp_path / "nowhere"}"', 5)
    assert any("no such folder" in p for p in recipe_problems(load_recipe(missing, [])))
    good = _recipe(tmp_path, "good", f'train = "{bars / "train"}"', 5)
    assert recipe_problems(load_recipe(good, [])) == []
    assert main(["train", str(missing)]) == 2
