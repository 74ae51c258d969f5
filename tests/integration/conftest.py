"""Fixtures shared by the integration tests."""

from __future__ import annotations

import contextlib
import gzip
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aiayn.data.synthetic import generate_corpus


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("corpus")
    c = generate_corpus(300, 20, 20, seed=3)
    (d / "train.src").write_text("\n".join(s for s, _ in c["train"]) + "\n", encoding="utf-8")
    with gzip.open(d / "train.tgt.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(t for _, t in c["train"]) + "\n")
    (d / "valid.src").write_text("\n".join(s for s, _ in c["valid"]) + "\n", encoding="utf-8")
    (d / "valid.tgt").write_text("\n".join(t for _, t in c["valid"]) + "\n", encoding="utf-8")
    return d


#: sentences the tiny inspection checkpoints' tokenizers know
INSPECT_TEXT = ["the small dog runs .", "a red bird sings over the house .", "the cat sleeps near the river ,",
                "der kleine hund rennt .", "ein roter vogel singt ."]


@pytest.fixture(scope="session")
def inspect_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny random checkpoints of the translation, lm and classification tasks, as training writes them:
    task -> checkpoint directory. The translation model uses T5 position biases, the classifier ALiBi-free
    sinusoidal positions, the language model RoPE with a sliding window."""
    import torch

    from aiayn import ModelConfig, build_model
    from aiayn.checkpoint import save_checkpoint
    from aiayn.tokenize import WordTokenizer

    tok = WordTokenizer.train(INSPECT_TEXT)
    root = tmp_path_factory.mktemp("inspect")
    base = dict(vocab_size=tok.vocab_size, d_model=32, n_heads=4, d_ff=48, max_len=64, dropout=0.0)
    setups = {
        "translation": (dict(preset="paper-base", n_layers=2, n_encoder_layers=2),
                        {"tokenizers": {"src": "tokenizer.json", "tgt": "tokenizer.json"},
                         "decode": {"beam": 2, "alpha": 0.6, "max_len_a": 1.0, "max_len_b": 6}, "lowercase": False}),
        "lm": (dict(arch="decoder", n_layers=2, position="rope", sliding_window=4, norm="rmsnorm", norm_position="pre"),
               {"tokenizers": {"text": "tokenizer.json"}, "block_size": 32, "newline_symbol": None,
                "packing": False}),
        "classification": (dict(arch="encoder", n_encoder_layers=2, n_layers=2, n_classes=2, position="sinusoidal"),
                           {"tokenizers": {"text": "tokenizer.json"}, "labels": ["0", "1"],
                            "label_names": ["negative", "positive"], "max_len": 32}),
    }
    out = {}
    for task, (fields, meta) in setups.items():
        fields = {**base, **fields}
        preset = fields.pop("preset", None)
        config = ModelConfig.preset(preset, **fields) if preset else ModelConfig(**fields)
        torch.manual_seed(0)
        model = build_model(config).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.2 * torch.randn_like(p))
        out[task] = save_checkpoint(root / task, model, {"task": task, "model": config.to_dict(), **meta},
                                    tokenizer_writer=lambda d: tok.save(d / "tokenizer.json"))
    return out


@contextlib.contextmanager
def _served(app, port: int | None = None) -> Iterator[str]:
    """Run an ASGI ``app`` under uvicorn on a free loopback port in a thread; yields its base URL."""
    import uvicorn

    if port is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture
def serve():
    """``with serve(app) as url:`` runs an ASGI app on a real loopback socket for the block."""
    return _served
