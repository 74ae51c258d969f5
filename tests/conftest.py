"""Shared pytest fixtures: every test starts from the same random state; real data is found or skipped; a
``device`` argument runs a test on every available device."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

# Tiny models: thread start-up costs more than it buys, and CI has 2 shared cores.
torch.set_num_threads(1)

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

# Tests that take a ``device`` argument run on the CPU and, where a GPU is present, again on CUDA.
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "device" in metafunc.fixturenames:
        metafunc.parametrize("device", DEVICES)


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """Each test module starts at one thread, whatever an earlier one set (trainers and benches set threads)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def seed() -> int:
    """Seed torch's global generator before each test (so tests do not depend on their order)."""
    torch.manual_seed(0)
    return 0


@pytest.fixture
def shared_data() -> Path:
    """The directory of real corpora (``../shared/data``); skips the test when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture
def decisive_decoders() -> tuple[torch.nn.Module, torch.nn.Module]:
    """A tiny decoder-only LM and encoder-decoder (vocab 50, eval mode) for comparing decodes across precisions:
    the LM's large weights make greedy continuations vary (not one repeated token); the encoder-decoder's
    spread-out, untied output layer with EOS (id 2) at logit 0 keeps beam outputs from being empty."""
    from aiayn import ModelConfig, build_model

    torch.manual_seed(0)
    lm = build_model(ModelConfig.preset("tiny", arch="decoder", vocab_size=50, norm_position="pre")).eval()
    with torch.no_grad():
        for p in lm.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.3)
    torch.manual_seed(0)
    s2s = build_model(ModelConfig.preset("tiny", arch="encoder-decoder", vocab_size=50, tie_embeddings=False)).eval()
    with torch.no_grad():
        s2s.lm_head.proj.weight.normal_(0.0, 0.5)
        s2s.lm_head.proj.weight[2] = 0.0
    return lm, s2s
