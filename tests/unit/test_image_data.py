"""Image files and folders as a Vision Transformer reads them: PNG and .npy to [0, 1], channels and size brought
to the model's, a seeded stratified split, and one clear error naming the file for each kind of bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from aiayn.data.images import fit_image, load_image_folder, read_image, stratified_split
from aiayn.errors import AiaynError

mpimg = pytest.importorskip("matplotlib.image")


def test_png_and_npy_read_as_intensities_in_zero_to_one(tmp_path: Path) -> None:
    grey = np.linspace(0, 1, 64, dtype=np.float32).reshape(8, 8)
    mpimg.imsave(tmp_path / "grey.png", grey, cmap="gray", vmin=0, vmax=1)  # written as RGBA, R = G = B
    x = read_image(tmp_path / "grey.png")
    assert x.shape == (3, 8, 8)
    torch.testing.assert_close(fit_image(x, 1, 8, "grey.png")[0], torch.from_numpy(grey), atol=1 / 255, rtol=0)
    np.save(tmp_path / "u8.npy", (grey * 255).astype(np.uint8))
    assert read_image(tmp_path / "u8.npy").shape == (1, 8, 8) and float(read_image(tmp_path / "u8.npy").max()) == 1.0
    np.save(tmp_path / "chw.npy", np.stack([grey] * 3))
    np.save(tmp_path / "hwc.npy", np.stack([grey] * 3, axis=-1))
    torch.testing.assert_close(read_image(tmp_path / "chw.npy"), read_image(tmp_path / "hwc.npy"))


def test_channels_and_size_are_brought_to_the_models() -> None:
    grey = torch.rand(1, 16, 16)
    rgb = fit_image(grey, 3, 16, "x")
    assert rgb.shape == (3, 16, 16) and torch.equal(rgb[2], grey[0])
    torch.testing.assert_close(fit_image(rgb, 1, 16, "x"), grey)  # luma of a grey RGB is the grey
    small = fit_image(torch.ones(1, 16, 16), 1, 8, "x")
    assert small.shape == (1, 8, 8) and torch.allclose(small, torch.ones(1, 8, 8))


@pytest.mark.parametrize(("name", "array", "fragment"), [
    ("raw.npy", np.full((8, 8), 16.0), "pixel values from 16 to 16; images are read as intensities in [0, 1]"),
    ("flat.npy", np.zeros(64, dtype=np.float32), "is not an image"),
    ("text.npy", np.array(["a"]), "cannot read the image"),
])
def test_a_bad_array_is_one_error_naming_the_file(tmp_path: Path, name: str, array: np.ndarray,
                                                  fragment: str) -> None:
    path = tmp_path / name
    if name == "text.npy":
        path.write_text("not an array", encoding="utf-8")
    else:
        np.save(path, array)
    with pytest.raises(AiaynError) as e:
        read_image(path)
    assert str(path) in str(e.value) and fragment in str(e.value)


def test_other_bad_images_are_named(tmp_path: Path) -> None:
    with pytest.raises(AiaynError, match="no such file"):
        read_image(tmp_path / "missing.png")
    with pytest.raises(AiaynError, match=r"give a \.png or a \.npy file"):
        read_image(tmp_path / "photo.jpg")
    with pytest.raises(AiaynError, match="wide.png: a 8x10 image; this model reads square 8x8 images"):
        fit_image(torch.zeros(1, 8, 10), 1, 8, "wide.png")


def test_the_split_is_seeded_stratified_and_disjoint() -> None:
    labels = [k for k in range(3) for _ in range(10)] + [3]  # class 3 has one example: it stays in training
    kept, held = stratified_split(labels, 0.2, seed=0)
    assert sorted(kept + held) == list(range(len(labels)))
    assert [sum(labels[i] == k for i in held) for k in range(4)] == [2, 2, 2, 0]
    assert stratified_split(labels, 0.2, seed=0) == (kept, held)
    assert stratified_split(labels, 0.2, seed=1) != (kept, held)
    with pytest.raises(AiaynError, match="val_fraction=1.5"):
        stratified_split(labels, 1.5, 0)


def test_a_class_folder_reads_every_image_with_its_class(tmp_path: Path) -> None:
    for k, name in enumerate(["10", "9"]):
        (tmp_path / name).mkdir()
        for i in range(2):
            np.save(tmp_path / name / f"{i}.npy", np.full((4, 4), (k + i) / 4, dtype=np.float32))
    (tmp_path / "9" / "notes.txt").write_text("ignored", encoding="utf-8")
    data = load_image_folder(tmp_path, 1, 8)
    assert data.label_names == ["9", "10"] and data.labels == [0, 0, 1, 1]  # numeric order
    assert data.images.shape == (4, 1, 8, 8)
    (tmp_path / "cat").mkdir()
    np.save(tmp_path / "cat" / "0.npy", np.zeros((4, 4), dtype=np.float32))
    with pytest.raises(AiaynError, match=r"classes \['cat'\] are not among the training classes"):
        load_image_folder(tmp_path, 1, 8, ["9", "10"])
    with pytest.raises(AiaynError, match="no .png or .npy images in subfolders"):
        load_image_folder(tmp_path / "9", 1, 8)


def test_random_shift_moves_whole_images_with_a_black_border() -> None:
    from aiayn.data.images import random_shift

    images = torch.rand(32, 1, 5, 5) + 1.0  # never 0, so the border shows
    assert random_shift(images, 0, torch.Generator()) is images
    shifted = random_shift(images, 1, torch.Generator().manual_seed(3))
    assert torch.equal(shifted, random_shift(images, 1, torch.Generator().manual_seed(3)))
    seen = set()
    for x, y in zip(images, shifted):
        matches = [(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1)
                   if torch.equal(y, torch.nn.functional.pad(x, (1, 1, 1, 1))[:, 1 - dy:6 - dy, 1 - dx:6 - dx])]
        assert len(matches) == 1
        seen.add(matches[0])
    assert len(seen) > 3  # several shifts drawn
