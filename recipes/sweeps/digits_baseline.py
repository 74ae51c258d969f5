"""The baseline a Vision Transformer on the 8x8 digits must beat: scikit-learn's LogisticRegression on the raw 64
pixels, trained and scored on exactly the split ``recipes/digits-vit.toml`` trains and validates on
(:func:`aiayn.data.images.stratified_split` with the recipe's ``val_fraction`` and ``split_seed``).

    .venv/bin/python recipes/sweeps/digits_baseline.py [--checkpoint runs/digits-vit/best]

Prints the baseline's held-out accuracy and, given a ViT checkpoint, the ViT's on the same images (the checkpoint's
own split), as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "digits-vit.toml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", help="a digits-vit checkpoint to score on the same held-out images")
    parser.add_argument("--max-iter", type=int, default=5000, help="LogisticRegression's max_iter (default 5000)")
    args = parser.parse_args()

    from sklearn.linear_model import LogisticRegression

    from aiayn.data.images import load_digits, stratified_split
    from aiayn.tasks.image_classification import DATA_DEFAULTS
    from aiayn.train.recipe import load_recipe, take

    data = take(load_recipe(RECIPE)["data"], DATA_DEFAULTS, "data")
    fraction, seed = float(data["val_fraction"]), int(data["split_seed"])
    digits = load_digits()
    kept, held = stratified_split(digits.labels, fraction, seed)
    x = digits.images.flatten(1).numpy()  # (N, 64) in [0, 1]
    y = torch.tensor(digits.labels).numpy()
    start = time.perf_counter()
    baseline = LogisticRegression(max_iter=args.max_iter).fit(x[kept], y[kept])
    result = {"split": {"train": len(kept), "held_out": len(held), "val_fraction": fraction, "split_seed": seed},
              "logistic_regression": {"accuracy": float((baseline.predict(x[held]) == y[held]).mean()),
                                      "max_iter": args.max_iter, "seconds": round(time.perf_counter() - start, 2)}}
    if args.checkpoint:
        from aiayn.pretrained import load_pretrained
        from aiayn.tasks.image_classification import evaluate_images

        scores = evaluate_images(load_pretrained(args.checkpoint), "sklearn-digits")
        result["vit"] = {"checkpoint": args.checkpoint, "accuracy": scores["accuracy"], "examples": scores["examples"]}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
