"""``aiayn check``: every row passes on a healthy model, a planted divergence fails its row and the exit code, and the
checks themselves catch what they claim to (a cache that drops a step, padding that leaks, a broken resume)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from aiayn import ModelConfig, build_model
from aiayn.accel.cpu import functional as accel_modules
from aiayn.check import check_accumulated, check_batched, check_cached, check_resume, relative_difference
from aiayn.cli.main import main


def test_a_healthy_preset_passes_every_check(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--preset", "tiny", "--arch", "decoder", "--no-resume"]) == 0
    out = capsys.readouterr().out
    for name in ("cached == uncached", "batched == single", "accelerated == reference", "accumulated == one batch"):
        assert name in out
    assert "FAILED" not in out and ", 0 failed" in out
    assert "in use to decode: MultiHeadAttention.attention_kernel=cpu_attention_kernel x2" in out
    assert "LMHead.greedy_kernel=ScreenedGreedy x1" in out


def test_a_divergent_accelerator_fails_its_rows_and_the_exit_code(monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    real = accel_modules.cpu_attention_kernel

    def off_by_a_little(q, k, v, mask, bias, dropout_p, is_causal, scale):  # noqa: ANN001, ANN202
        return real(q, k, v, mask, bias, dropout_p, is_causal, scale * 1.01)

    monkeypatch.setattr(accel_modules, "cpu_attention_kernel", off_by_a_little)
    assert main(["check", "--preset", "tiny", "--no-resume"]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "training loss and every gradient" in out


def test_acceleration_off_skips_the_comparison(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--accel", "none", "--preset", "tiny", "--arch", "encoder", "--no-resume"]) == 0
    out = capsys.readouterr().out
    assert "in use to train: the reference core" in out and "in use to decode: the reference core" in out
    assert "skipped: acceleration is off" in out and "skipped: an encoder has no cache" in out


def test_a_checkpoint_is_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from aiayn.checkpoint import save_checkpoint

    config = ModelConfig.preset("tiny", arch="decoder", vocab_size=64)
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "ckpt", build_model(config), {"task": "lm", "model": config.to_dict()})
    assert main(["check", "--checkpoint", str(tmp_path / "ckpt"), "--no-resume"]) == 0
    assert str(tmp_path / "ckpt") in capsys.readouterr().out


def test_the_checks_catch_what_they_claim(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    lm = build_model(ModelConfig.preset("tiny", arch="decoder", vocab_size=64))
    assert check_cached(lm).passed and check_batched(lm).passed and check_accumulated(lm).passed
    from aiayn.nn import cache as cache_module

    real_append, real_step = cache_module.SelfAttnCache.append, cache_module.SelfAttnCache.append_step

    def forgetful(self, k, v):  # noqa: ANN001, ANN202 - keys and values of the step before are lost
        out_k, out_v = real_append(self, k, v)
        return out_k[:, :, -1:], out_v[:, :, -1:]

    def forgetful_step(self, kv):  # noqa: ANN001, ANN202 - the same, for a one-position step
        out_k, out_v = real_step(self, kv)
        return out_k[:, :, -1:], out_v[:, :, -1:]

    with monkeypatch.context() as m:
        m.setattr(cache_module.SelfAttnCache, "append", forgetful)
        m.setattr(cache_module.SelfAttnCache, "append_step", forgetful_step)
        assert not check_cached(lm).passed
    enc = build_model(ModelConfig.preset("tiny", arch="encoder", vocab_size=64))
    with monkeypatch.context() as m:  # padding keys attended: rows of a batch no longer equal rows alone
        m.setattr("aiayn.nn.masks.padding_mask", lambda is_token: torch.ones_like(is_token)[:, None, None, :])
        assert not check_batched(enc).passed
    assert relative_difference(torch.ones(2), torch.ones(3)) == float("inf")
    assert relative_difference(torch.tensor([float("nan")]), torch.zeros(1)) == float("inf")


def test_resume_is_compared_from_a_real_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    assert check_resume(steps=6).passed
    # a resume that forgets the optimizer's moments
    monkeypatch.setattr(torch.optim.Optimizer, "load_state_dict", lambda self, state: None)
    assert not check_resume(steps=6).passed
