"""The trainer's named parts, each alone on a tiny real model: the parallel strategy, precision, the step, the
checkpoint policy and resuming (the loop that joins them: tests/reliability/test_training_runs.py)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from aiayn.checkpoint import load_training_state, read_state_dict
from aiayn.config import ModelConfig
from aiayn.errors import AiaynError
from aiayn.models.build import build_model
from aiayn.train.checkpoint_policy import CheckpointPolicy, RunState
from aiayn.train.distributed import Ranks
from aiayn.train.metrics_log import MetricsLogger, read_metrics
from aiayn.train.parallel import parallelize, wrap
from aiayn.train.precision import Precision
from aiayn.train.progress import TrainingProgress
from aiayn.train.restore import continue_schedule, read_last, restore_run
from aiayn.train.step import TrainStep
from aiayn.train.train_config import TrainConfig

VOCAB = 16


class _Task:
    """A one-layer decoder LM on random tokens: batch ``i`` of the stream is seeded by ``i``; ``short`` masks the
    labels of the last positions of every second batch, so micro-batches have different target counts."""

    select_metric, select_mode = "loss", "min"

    def __init__(self, ffn: str = "dense") -> None:
        self.config = ModelConfig.preset("tiny", arch="decoder", vocab_size=VOCAB, d_model=16, n_heads=2, n_layers=1,
                                         d_ff=32, max_len=16, dropout=0.0, ffn=ffn, n_experts=2, moe_top_k=1)
        self.model = build_model(self.config)
        self.scores = iter([3.0, 3.5, 1.0, 2.0])  # what evaluate() reports, in turn
        self.nan_at: int | None = None  # the loss call that returns nan
        self.calls = 0

    def batch(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, VOCAB, (3, 7), generator=torch.Generator().manual_seed(i))
        labels = ids[:, 1:].clone()
        if i % 2:
            labels[:, -3:] = -100
        return {"ids": ids[:, :-1], "labels": labels}

    def batches(self, position: dict[str, Any] | None) -> Iterator[tuple[dict[str, torch.Tensor], dict[str, int]]]:
        i = position["i"] if position else 0
        while True:
            yield self.batch(i), {"i": i + 1}
            i += 1

    def count_targets(self, batch: dict[str, torch.Tensor]) -> int:
        return int((batch["labels"] != -100).sum())

    def loss(self, batch: dict[str, torch.Tensor], label_smoothing: float) -> tuple[torch.Tensor, int, dict]:
        self.calls += 1
        logits = self.model(batch["ids"]).logits  # (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100, reduction="sum",
                               label_smoothing=label_smoothing)
        if self.calls == self.nan_at:
            loss = loss * float("nan")
        return loss, self.count_targets(batch), {"nll": float(loss.detach())}

    def evaluate(self) -> dict[str, float]:
        return {"loss": next(self.scores)}

    def checkpoint_config(self) -> dict[str, Any]:
        return {"task": "lm", "model": self.config.to_dict()}

    def write_tokenizers(self, directory: Path) -> None:
        (directory / "tokenizer.json").write_text("{}", encoding="utf-8")


def _cfg(tmp_path: Path, **settings: Any) -> TrainConfig:
    return TrainConfig(**{"out_dir": str(tmp_path / "run"), "lr": 1e-2, "schedule": "constant_warmup", "warmup": 0,
                          "label_smoothing": 0.0, "clip_norm": None, "progress": False, **settings})


def _step(task: _Task, cfg: TrainConfig, dtype: str = "float32") -> TrainStep:
    par = wrap(task, "single", Ranks(), moe_weights=(0.01, 0.001) if task.config.ffn == "moe" else None)
    return TrainStep.build(task, par, Precision(dtype, "cpu"), cfg)


def _grads(task: _Task) -> list[torch.Tensor]:
    return [p.grad.clone() for p in task.model.parameters()]


# ------------------------------------------------------------------------------------------ parallel strategy
def test_the_single_process_strategy_is_the_model_itself() -> None:
    task = _Task()
    par = wrap(task, "single", Ranks())
    assert (par.kind, par.sharded, par.loss_scale) == ("single", False, 1.0)
    assert par.weights is task.model and par.model is task.model
    assert par.sum_over_ranks([1.5, 2.0]) == [1.5, 2.0] and par.gather_rng() is None
    before = [p.clone() for p in task.model.parameters()]
    par.refresh_weights()  # nothing to gather
    assert all(torch.equal(a, b) for a, b in zip(before, task.model.parameters()))
    copy = build_model(task.config)
    par.weights = copy
    with pytest.raises(RuntimeError), par.evaluating(task):
        assert task.model is copy
        raise RuntimeError
    assert task.model is par.model  # put back, even after an error
    threads = torch.get_num_threads()
    with par.alone():  # one process: nothing to borrow
        assert torch.get_num_threads() == threads


def test_the_gradient_norm_is_measured_before_clipping() -> None:
    task = _Task()
    par = wrap(task, "single", Ranks())
    loss, _, _ = task.loss(task.batch(0), 0.0)
    loss.backward()
    params = list(task.model.parameters())
    want = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))
    assert par.grad_norm(params, None) == pytest.approx(float(want), rel=1e-5)
    assert par.grad_norm(params, 0.5) == pytest.approx(float(want), rel=1e-5)  # the norm before clipping...
    assert par.grad_norm(params, None) == pytest.approx(0.5, rel=1e-4)  # ...to which the gradients were cut
    params[0].grad[0, 0] = float("inf")
    assert par.grad_norm(params, None) == float("inf")


@pytest.fixture
def one_rank_group() -> Iterator[None]:
    """A process group of one rank (gloo on the CPU), for the engines' own code paths."""
    if not torch.distributed.is_available():
        pytest.skip("torch built without distributed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()


def test_ddp_synchronizes_gradients_after_the_last_micro_batch_only(tmp_path: Path, one_rank_group: None) -> None:
    par = parallelize(_Task(), "ddp", Ranks(), _cfg(tmp_path), on_cpu=True)
    assert par.weights is par.model and par.loss_scale == 1.0  # world 1: the engine's average is the sum
    with par.micro_batch(last=False):
        assert not par.loss_module.require_backward_grad_sync
    with par.micro_batch(last=True):
        assert par.loss_module.require_backward_grad_sync


def test_fsdp_keeps_a_whole_copy_on_rank_zero_and_refreshes_it_from_the_shards(tmp_path: Path,
                                                                              one_rank_group: None) -> None:
    par = parallelize(_Task(), "fsdp", Ranks(), _cfg(tmp_path), on_cpu=True)
    assert par.sharded and par.weights is not par.model
    assert all(hasattr(p, "full_tensor") for p in par.model.parameters())  # DTensor shards
    name, first = next(iter(par.model.named_parameters()))
    with torch.no_grad():
        for p in par.model.parameters():
            p.add_(1.0)
    assert not torch.equal(dict(par.weights.named_parameters())[name], first.full_tensor())  # stale
    par.refresh_weights()
    whole = dict(par.weights.named_parameters())
    for name, p in par.model.named_parameters():
        assert torch.equal(whole[name], p.full_tensor()), name


# ------------------------------------------------------------------------------------------ precision
def test_float32_has_no_autocast_and_no_scaling() -> None:
    p = Precision("float32", "cpu")
    loss = torch.tensor(2.0)
    assert not p.scaling and p.scale(loss) is loss and p.state_dict() is None and p.loss_scale() is None
    with p.autocast():
        assert torch.nn.Linear(4, 4)(torch.ones(1, 4)).dtype == torch.float32


def test_bfloat16_autocasts_the_forward_pass() -> None:
    p = Precision("bfloat16", "cpu")
    assert not p.scaling
    with p.autocast():
        assert torch.nn.Linear(4, 4)(torch.ones(1, 4)).dtype == torch.bfloat16


def test_float16_scales_the_loss_and_skips_an_overflowing_step() -> None:
    p = Precision("float16", "cpu")
    assert p.scaling and p.loss_scale() == 2.0 ** 16
    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.1)
    p.scale((w * 3).sum()).backward()
    assert torch.equal(w.grad, torch.full((2,), 3.0 * 2 ** 16))
    p.unscale(opt)
    assert torch.equal(w.grad, torch.full((2,), 3.0))
    p.step(opt)
    assert torch.allclose(w.detach(), torch.full((2,), 0.7))
    opt.zero_grad()
    p.scale((w * float("inf")).sum()).backward()
    p.step(opt)  # an overflow: the scaler skips the update and halves the scale
    assert torch.allclose(w.detach(), torch.full((2,), 0.7)) and p.loss_scale() == 2.0 ** 15
    again = Precision("float16", "cpu")
    again.load_state_dict(p.state_dict())
    assert again.loss_scale() == 2.0 ** 15


# ------------------------------------------------------------------------------------------ the step
def test_accumulated_micro_batches_give_the_gradient_of_their_union(tmp_path: Path) -> None:
    """Every micro-batch's summed loss over the targets of the whole step, whatever their counts."""
    task = _Task()
    step = _step(task, _cfg(tmp_path))
    micro = [task.batch(0), task.batch(1)]
    n = [task.count_targets(b) for b in micro]
    assert n[0] != n[1]
    before = [p.detach().clone() for p in task.model.parameters()]
    reference = build_model(task.config)
    reference.load_state_dict(task.model.state_dict())
    record = step(micro, late=lambda: False)
    assert all(torch.equal(a, b) for a, b in zip(before, task.model.parameters()))  # the gradients only
    step.update()
    expected = 0.0
    for b in micro:
        logits = reference(b["ids"]).logits
        expected = expected + F.cross_entropy(logits.flatten(0, 1), b["labels"].flatten(), ignore_index=-100,
                                              reduction="sum")
    (expected / sum(n)).backward()
    for got, want in zip(_grads(task), reference.parameters()):
        torch.testing.assert_close(got, want.grad, rtol=1e-5, atol=1e-7)
    assert record.targets == sum(n) and record.loss == pytest.approx(float(expected.detach()), rel=1e-5)
    assert record.problem is None and not record.late and record.grad_norm > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, task.model.parameters()))  # updated
    assert step.scheduler.last_epoch == 1


def test_a_non_finite_loss_changes_nothing(tmp_path: Path) -> None:
    task = _Task()
    step = _step(task, _cfg(tmp_path))
    before = [p.detach().clone() for p in task.model.parameters()]
    task.nan_at = 2
    record = step([task.batch(0), task.batch(1)], late=lambda: True)
    assert record.problem == "non-finite loss (nan)" and record.grad_norm is None and record.late
    assert all(torch.equal(a, b) for a, b in zip(before, task.model.parameters()))
    assert all(p.grad is None for p in task.model.parameters())
    assert step.scheduler.last_epoch == 0 and not step.optimizer.state


def test_the_step_clips_to_clip_norm(tmp_path: Path) -> None:
    task = _Task()
    step = _step(task, _cfg(tmp_path, clip_norm=0.01))
    record = step([task.batch(0)], late=lambda: False)
    clipped = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in _grads(task)]))
    assert record.grad_norm > 0.01 and float(clipped) == pytest.approx(0.01, rel=1e-4)


def test_a_mixture_of_experts_step_adds_its_router_loss(tmp_path: Path) -> None:
    task = _Task(ffn="moe")
    step = _step(task, _cfg(tmp_path))
    record = step([task.batch(0), task.batch(1)], late=lambda: False)
    assert record.problem is None and 0 < record.moe < float("inf")


# ------------------------------------------------------------------------------------------ checkpoint policy
def _policy(task: _Task, cfg: TrainConfig, run: RunState, resumed: bool = False) -> tuple[CheckpointPolicy, Path]:
    step = _step(task, cfg)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    log = MetricsLogger(out / "metrics.jsonl")
    policy = CheckpointPolicy(task, cfg, step.parallel, step.optimizer, step.scheduler, step.precision, run, log,
                              config_json=task.checkpoint_config(), recipe_sections={"model": {"d_model": 16}},
                              resumed=resumed)
    return policy, out


def test_validation_best_periodic_and_last_follow_their_cadences(tmp_path: Path) -> None:
    task, run = _Task(), RunState()
    cfg = _cfg(tmp_path, max_steps=6, eval_every=2, save_every=3, keep_checkpoints=1)
    policy, out = _policy(task, cfg, run)
    bar = TrainingProgress(cfg.max_steps, None, 0, 0.0, False)
    saved = []
    for step in range(1, 7):
        run.step, run.position = step, {"i": step}
        policy.after_step(bar)
        if (out / "last").is_dir():
            saved.append(load_training_state(out / "last")["step"])
    assert saved == [2, 3, 4, 4, 6]  # last/ after each validation (2, 4, 6) and periodic checkpoint (3, 6)
    validated = [r["step"] for r in read_metrics(out / "metrics.jsonl") if "val_loss" in r]
    assert validated == [2, 4, 6]
    assert run.best == {"value": 1.0, "step": 6}  # scores 3.0, 3.5 (not kept), 1.0
    assert sorted(p.name for p in out.glob("step-*")) == ["step-6"]  # step-3 pruned: keep_checkpoints=1
    assert (out / "best").is_dir()
    state = load_training_state(out / "last")
    assert state["position"] == {"i": 6} and state["recipe"] == {"model": {"d_model": 16}}
    assert state["train_config"]["eval_every"] == 2 and policy.saved_step == 6


def test_timed_checkpoints_follow_the_clock_since_the_last_one(tmp_path: Path) -> None:
    """``save_every_minutes``: a step-N/ after the first step that ends that long after the last one (the paper's
    checkpoints every 10 minutes); the clock restarts at each."""
    task, run = _Task(), RunState()
    cfg = _cfg(tmp_path, max_steps=100, eval_every=100, save_every_minutes=10.0, keep_checkpoints=5)
    policy, out = _policy(task, cfg, run)
    bar = TrainingProgress(cfg.max_steps, None, 0, 0.0, False)
    for step in range(1, 6):
        if step in (2, 4):
            policy.periodic_at -= 601  # ten minutes and a second have passed
        run.step, run.position = step, {"i": step}
        policy.after_step(bar)
    assert sorted(p.name for p in out.glob("step-*")) == ["step-2", "step-4"]
    assert load_training_state(out / "last")["step"] == 4


def test_an_interrupt_saves_the_last_whole_step_with_its_position_and_rng(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture) -> None:
    task, run = _Task(), RunState(step=3, position={"i": 3})
    policy, out = _policy(task, _cfg(tmp_path), run)
    run.mark_done()
    after_step = torch.rand(4)  # what the RNG draws next after step 3
    run.position = {"i": 5}  # a step cut short drew two more micro-batches
    policy.interrupted(KeyboardInterrupt())
    assert "interrupted at step 3; last saved: step 3" in capsys.readouterr().out
    state = load_training_state(out / "last")
    assert state["step"] == 3 and state["position"] == {"i": 3}
    assert torch.equal(torch.rand(4), after_step)  # the RNG is back where the step left it


def test_the_end_of_a_run_averages_its_last_periodic_checkpoints(tmp_path: Path) -> None:
    task, run = _Task(), RunState()
    cfg = _cfg(tmp_path, max_steps=4, eval_every=4, save_every=2, average_last=2)
    policy, out = _policy(task, cfg, run)
    bar = TrainingProgress(cfg.max_steps, None, 0, 0.0, False)
    for step in range(1, 5):
        with torch.no_grad():
            for p in task.model.parameters():
                p.add_(0.5)
        run.step, run.position = step, {"i": step}
        policy.after_step(bar)
    averaged = policy.finish()
    assert averaged == str(out / "averaged")
    a, b, avg = (read_state_dict(out / name) for name in ("step-2", "step-4", "averaged"))
    assert all(torch.allclose(avg[k], (a[k] + b[k]) / 2) for k in avg)
    assert [r["averaged_of"] for r in read_metrics(out / "metrics.jsonl") if "averaged_of" in r] == [2]


# ------------------------------------------------------------------------------------------ resuming
def test_a_resumed_schedule_keeps_its_position_and_takes_the_new_settings() -> None:
    w = torch.nn.Parameter(torch.ones(2))
    old = torch.optim.Adam([w], lr=1.0)
    old_sched = torch.optim.lr_scheduler.LambdaLR(old, lambda s: 1.0 / (s + 1))
    for _ in range(4):
        old.step()
        old_sched.step()
    new = torch.optim.Adam([w], lr=0.5, betas=(0.8, 0.9))
    new_sched = torch.optim.lr_scheduler.LambdaLR(new, lambda s: 1.0 / (s + 1))
    settings = [{k: v for k, v in g.items() if k != "params"} for g in new.param_groups]
    new.load_state_dict(old.state_dict())
    continue_schedule(new, new_sched, settings, old_sched.state_dict())
    assert new_sched.last_epoch == 4 and new.param_groups[0]["lr"] == pytest.approx(0.5 / 5)
    assert new.param_groups[0]["betas"] == (0.8, 0.9) and new_sched.get_last_lr() == [pytest.approx(0.1)]


def test_last_is_read_back_into_a_new_run(tmp_path: Path) -> None:
    task, run = _Task(), RunState(step=2, position={"i": 4}, best={"value": 1.5, "step": 2}, skipped=1)
    cfg = _cfg(tmp_path, max_steps=5)
    policy, out = _policy(task, cfg, run)
    step = TrainStep(task, policy.parallel, policy.precision, cfg, policy.optimizer, policy.scheduler)
    for i in range(2):  # the two steps the state records: optimizer moments to carry over
        step([task.batch(i)], late=lambda: False)
        step.update()
    policy.save(out / "last", with_state=True)
    again = _Task()
    resumed = read_last(again, cfg, Ranks(), "single", again.checkpoint_config(), {"model": {"d_model": 16}})
    assert all(torch.equal(a, b) for a, b in zip(task.model.parameters(), again.model.parameters()))
    fresh = _step(again, cfg)
    restored = restore_run(resumed, again.model, fresh.optimizer, fresh.scheduler, fresh.precision, cfg, Ranks())
    assert (restored.step, restored.position, restored.best, restored.skipped) == (2, {"i": 4}, run.best, 1)
    moments = [s["exp_avg"] for s in fresh.optimizer.state.values()]
    assert moments and all(torch.equal(a, b["exp_avg"]) for a, b in zip(moments, policy.optimizer.state.values()))
    with pytest.raises(AiaynError, match="the run is at step 2, past train.max_steps=1"):
        done = _cfg(tmp_path, max_steps=1)
        restore_run(read_last(again, done, Ranks(), "single", again.checkpoint_config(), {"model": {"d_model": 16}}),
                    again.model, fresh.optimizer, fresh.scheduler, fresh.precision, done, Ranks())
