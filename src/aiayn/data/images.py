"""Image-classification data: scikit-learn's bundled 8x8 digits, or a folder of class-named subfolders of images.

Every image becomes a float tensor (C, S, S) of intensities in [0, 1]: PNG files through ``matplotlib.image.imread``
(which gives PNG pixels in [0, 1]), ``.npy`` arrays of uint8 (0..255) or of floats already in [0, 1], the digits'
0..16 divided by 16. A grey image (H, W) has one channel; an RGB(A) image three (alpha dropped). :func:`fit_image`
brings an image to a model's channels (luma for grey, repeated grey for RGB) and side (a square image is resized;
any other shape is a user error naming the file).

The held-out split is a pure function of (labels, fraction, seed) (:func:`stratified_split`), so the training run,
``aiayn evaluate`` and the logistic-regression baseline (``recipes/sweeps/digits_baseline.py``) see the same split.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from aiayn.errors import AiaynError

#: the ``[data] source`` naming scikit-learn's bundled digits (1,797 grey 8x8 images of 0..9, no download)
DIGITS = "sklearn-digits"
#: the image files read, by suffix
IMAGE_SUFFIXES = (".png", ".npy")
#: ITU-R BT.601 luma weights: RGB -> grey
LUMA = (0.299, 0.587, 0.114)


@dataclass(frozen=True)
class ImageData:
    """Labeled images.

    Attributes:
        images: (N, C, S, S) float32 intensities in [0, 1].
        labels: the class id of each image, an index into ``label_names``.
        label_names: the class names (the digits' "0".."9", or a folder's subfolder names).
        sources: where each image came from (a file, or ``sklearn-digits[i]``), for messages.
    """

    images: torch.Tensor
    labels: list[int]
    label_names: list[str]
    sources: list[str]

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, index: Sequence[int]) -> ImageData:
        """The images at ``index``, in that order."""
        ix = list(index)
        return ImageData(self.images[torch.tensor(ix, dtype=torch.long)], [self.labels[i] for i in ix],
                         self.label_names, [self.sources[i] for i in ix])


def load_digits() -> ImageData:
    """scikit-learn's bundled digits: 1,797 images (1, 8, 8), labels "0".."9" (read from the package, no download).

    Raises:
        AiaynError: scikit-learn is not installed (names the extra that installs it).
    """
    try:
        from sklearn.datasets import load_digits as sk_load_digits  # optional: scikit-learn
    except ImportError:
        raise AiaynError(f"[data] source = {DIGITS!r} needs scikit-learn; pip install 'aiayn[vision]' (or "
                         "scikit-learn)") from None
    digits = sk_load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32)[:, None] / 16.0  # (N, 1, 8, 8) in [0, 1]
    labels = [int(y) for y in digits.target]
    return ImageData(images, labels, [str(k) for k in range(10)], [f"{DIGITS}[{i}]" for i in range(len(labels))])


def stratified_split(labels: Sequence[int], fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """A seeded, stratified hold-out: of each class's examples, shuffled from ``seed``, round(fraction * n) (at least
    one where the class has two or more) go to the held-out part.

    Returns:
        (kept indices, held-out indices), each sorted.
    Raises:
        AiaynError: ``fraction`` is not in (0, 1).
    """
    if not 0.0 < fraction < 1.0:
        raise AiaynError(f"[data] val_fraction={fraction}: must be in (0, 1), e.g. 0.2")
    g = torch.Generator().manual_seed(seed)
    kept, held = [], []
    for k in sorted(set(labels)):
        members = [i for i, y in enumerate(labels) if y == k]
        order = [members[j] for j in torch.randperm(len(members), generator=g).tolist()]
        n = min(max(round(fraction * len(order)), 1 if len(order) > 1 else 0), len(order) - 1)
        held += order[:n]
        kept += order[n:]
    return sorted(kept), sorted(held)


def read_image(path: str | Path) -> torch.Tensor:
    """One image file as (C, H, W) float32 in [0, 1]: a PNG (grey, RGB or RGBA; alpha dropped) or a ``.npy`` array
    ((H, W), (H, W, C) or (C, H, W) with C in 1, 3, 4; uint8 0..255 or floats in [0, 1]).

    Raises:
        AiaynError: a missing or unreadable file, another suffix, or values or a shape that are not an image's; the
            message names the file and the fix.
    """
    p = Path(path)
    if p.suffix.lower() not in IMAGE_SUFFIXES:
        raise AiaynError(f"{p}: not an image file this reads; give a .png or a .npy file")
    if not p.is_file():
        raise AiaynError(f"{p}: no such file; check the path")
    try:
        if p.suffix.lower() == ".npy":
            array = np.load(p, allow_pickle=False)
        else:
            import matplotlib.image as mpimg  # optional: matplotlib

            array = mpimg.imread(p)
        x = torch.from_numpy(array.copy())
    except (ValueError, OSError, SyntaxError, TypeError) as e:
        raise AiaynError(f"{p}: cannot read the image ({e}); give a valid PNG or .npy file") from None
    if x.dtype == torch.uint8:
        x = x.float() / 255.0
    elif x.dtype == torch.bool or not (x.is_floating_point() or x.dtype in (torch.int16, torch.int32, torch.int64)):
        raise AiaynError(f"{p}: an array of {x.dtype}; give uint8 (0..255) or float (0..1) pixel values")
    x = x.float()
    if x.dim() == 3 and x.shape[-1] in (1, 3, 4) and x.shape[0] not in (1, 3, 4):
        x = x.permute(2, 0, 1)  # (H, W, C) -> (C, H, W)
    elif x.dim() == 3 and x.shape[-1] in (1, 3, 4) and x.shape[0] in (1, 3, 4) and p.suffix.lower() == ".png":
        x = x.permute(2, 0, 1)  # a PNG is always (H, W, C)
    elif x.dim() == 2:
        x = x[None]  # (1, H, W)
    if x.dim() != 3 or x.shape[0] not in (1, 3, 4) or min(x.shape[1:]) < 1:
        raise AiaynError(f"{p}: an array of shape {tuple(array.shape)} is not an image; give (H, W), (H, W, C) or "
                         "(C, H, W) with C = 1, 3 or 4")
    if not torch.isfinite(x).all() or float(x.min()) < 0.0 or float(x.max()) > 1.0:
        raise AiaynError(f"{p}: pixel values from {float(x.min()):g} to {float(x.max()):g}; images are read as "
                         "intensities in [0, 1] (or uint8 0..255): divide by the largest value")
    return x[:3] if x.shape[0] == 4 else x  # RGBA -> RGB


def fit_image(x: torch.Tensor, channels: int, size: int, source: str) -> torch.Tensor:
    """``x`` (C, H, W) brought to (channels, size, size): grey from RGB by luma, RGB from grey by repetition, a square
    image of another side resized (bilinear, antialiased).

    Raises:
        AiaynError: the image is not square, or has channels that cannot become ``channels``; names ``source``.
    """
    c, h, w = x.shape
    if h != w:
        raise AiaynError(f"{source}: a {h}x{w} image; this model reads square {size}x{size} images: crop it square")
    if c != channels:
        if c == 3 and channels == 1:
            x = (x * torch.tensor(LUMA, dtype=x.dtype)[:, None, None]).sum(0, keepdim=True)  # (1, H, W)
        elif c == 1:
            x = x.expand(channels, h, w)
        else:
            raise AiaynError(f"{source}: an image of {c} channels; this model reads {channels}: convert it")
    if h != size:
        x = F.interpolate(x[None], size=(size, size), mode="bilinear", antialias=True, align_corners=False)[0]
        x = x.clamp(0.0, 1.0)
    return x.contiguous()


def random_shift(images: torch.Tensor, max_shift: int, generator: torch.Generator) -> torch.Tensor:
    """Each image moved by a random whole number of pixels, up to ``max_shift`` in each direction, the uncovered
    border black (0): the augmentation of small-image classifiers (LeCun et al. 1998 trained on shifted digits).

    Args:
        images: (B, C, H, W).
        max_shift: the largest shift in pixels (0: the images as they are).
        generator: draws the shifts (seeded by the caller, so a batch's shifts are a function of its position).
    Returns:
        (B, C, H, W).
    """
    if max_shift == 0:
        return images
    b, _, h, w = images.shape
    padded = F.pad(images, (max_shift,) * 4)  # (B, C, H + 2m, W + 2m), zero border
    dy, dx = torch.randint(0, 2 * max_shift + 1, (2, b), generator=generator).tolist()
    return torch.stack([padded[i, :, y:y + h, x:x + w] for i, (y, x) in enumerate(zip(dy, dx))])


def _sorted_names(names: list[str]) -> list[str]:
    try:
        return sorted(names, key=int)
    except ValueError:
        return sorted(names)


def load_image_folder(root: str | Path, channels: int, size: int, label_names: Sequence[str] | None = None
                      ) -> ImageData:
    """Every ``.png`` / ``.npy`` file in the class-named subfolders of ``root`` (``root/cat/1.png`` is a "cat"),
    brought to (channels, size, size) by :func:`fit_image`.

    Args:
        root: the folder.
        channels, size: what the model reads.
        label_names: the classes in id order (a validation folder takes the training folder's); default the
            subfolder names, sorted (numerically when all are whole numbers).
    Raises:
        AiaynError: a missing folder, no images, fewer than two classes, a class the training folder lacks, or a bad
            image (named).
    """
    folder = Path(root)
    if not folder.is_dir():
        raise AiaynError(f"{folder}: no such folder; give a folder with one subfolder of images per class")
    found = {d.name: sorted(f for f in d.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)
             for d in folder.iterdir() if d.is_dir() and not d.name.startswith(".")}
    found = {k: v for k, v in found.items() if v}
    if not found:
        raise AiaynError(f"{folder}: no .png or .npy images in subfolders; put each class's images in a subfolder "
                         "named after the class (e.g. cat/1.png, dog/2.png)")
    names = list(label_names) if label_names is not None else _sorted_names(list(found))
    unknown = sorted(set(found) - set(names))
    if unknown:
        raise AiaynError(f"{folder}: classes {unknown} are not among the training classes {names}; remove them or "
                         "train with them")
    if label_names is None and len(names) < 2:
        raise AiaynError(f"{folder}: only one class ({names[0]}); a classifier needs at least two subfolders")
    images, labels, sources = [], [], []
    for k, name in enumerate(names):
        for f in found.get(name, []):
            images.append(fit_image(read_image(f), channels, size, str(f)))
            labels.append(k)
            sources.append(str(f))
    return ImageData(torch.stack(images), labels, names, sources)


def first_image_shape(root: str | Path) -> tuple[int, int]:
    """(channels, side) of the first image in a class folder (what a model for it reads unless told otherwise):
    1 channel for grey (also stored as RGB with R = G = B, as many tools write grey PNGs), 3 otherwise."""
    folder = Path(root)
    files = sorted(f for d in sorted(folder.iterdir()) if d.is_dir() for f in sorted(d.iterdir())
                   if f.suffix.lower() in IMAGE_SUFFIXES) if folder.is_dir() else []
    if not files:
        raise AiaynError(f"{folder}: no .png or .npy images in subfolders; put each class's images in a subfolder "
                         "named after the class (e.g. cat/1.png, dog/2.png)")
    x = read_image(files[0])
    grey = x.shape[0] == 1 or bool((x[0] == x[1]).all() and (x[1] == x[2]).all())
    return (1 if grey else 3), int(x.shape[1])


def image_input(pre: Any, path: str | Path, line: str | None = None) -> torch.Tensor:
    """One image file as the checkpoint's model reads it: (C, S, S) in [0, 1] (:mod:`aiayn.data.images`).

    Raises:
        AiaynError: a file that is not an image the model can read, named (after ``line``, the input line that
            gave its path, when given).
    """
    c = pre.config
    try:
        return fit_image(read_image(path), c.channels, c.image_size, str(path))
    except AiaynError as e:
        if line is None:
            raise
        raise AiaynError(f"{line}: {e}") from None
