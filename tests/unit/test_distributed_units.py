"""Pieces of data-parallel training that need no process group (the ranks themselves: tests/integration): the
launcher, the choice of engine and its settings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aiayn.errors import AiaynError
from aiayn.train.distributed import Ranks, check_same_files, launch
from aiayn.train.parallel import resolve_parallel
from aiayn.train.train_config import TrainConfig


class _TwoRanks(Ranks):
    """Rank 0 of two, whose peer reports ``peer_digest``."""

    def __init__(self, peer_digest: str | None) -> None:
        super().__init__(rank=0, world=2)
        object.__setattr__(self, "peer", peer_digest)

    def all_gather(self, obj):  # noqa: ANN001, ANN201 - the test double of Ranks.all_gather
        return [obj, obj if self.peer is None else self.peer]


def _writer(text: str):
    def write(directory: Path) -> None:
        (directory / "tokenizer.json").write_text(text, encoding="utf-8")
    return write


def test_single_process_is_rank_zero_of_one() -> None:
    r = Ranks.current()
    assert (r.rank, r.world, r.main) == (0, 1, True)
    assert r.all_gather("x") == ["x"]
    r.barrier()  # a no-op, not a hang


def test_ranks_with_different_tokenizers_are_refused() -> None:
    check_same_files(_writer("vocab"), _TwoRanks(None), "tokenizers")  # the same bytes pass
    with pytest.raises(AiaynError, match="different tokenizers"):
        check_same_files(_writer("vocab"), _TwoRanks("0" * 64), "tokenizers")


def test_launch_needs_a_process() -> None:
    with pytest.raises(AiaynError, match="--nproc 0"):
        launch(0, ["train", "r.toml"])


def test_one_process_trains_alone_and_several_with_ddp_unless_told() -> None:
    assert resolve_parallel(None, 1) == resolve_parallel("fsdp", 1) == "single"
    assert resolve_parallel(None, 2) == "ddp"
    assert resolve_parallel("fsdp", 4) == "fsdp"


def test_the_parallel_settings_are_checked() -> None:
    problems = TrainConfig.check({"parallel": "zero3", "fsdp_cpu_offload": True})
    assert any(p.startswith("parallel='zero3': unknown; choose one of ddp, fsdp") for p in problems)
    assert any(p.startswith("fsdp_cpu_offload=True: offloads the shards of FSDP") for p in problems)
    assert any("float16 loss scaling is not sharded" in p
               for p in TrainConfig.check({"parallel": "fsdp", "dtype": "float16"}))
    assert TrainConfig.check({"parallel": "fsdp", "dtype": "bfloat16", "fsdp_cpu_offload": True}) == []


def test_fsdp_cpu_offload_of_a_cpu_model_is_refused() -> None:
    from aiayn.config import ModelConfig
    from aiayn.models.build import build_model
    from aiayn.train.parallel import wrap

    class _Task:
        model = build_model(ModelConfig.preset("tiny", arch="decoder"))

    with pytest.raises(AiaynError, match="fsdp_cpu_offload=true: the model is already in CPU memory"):
        wrap(_Task(), "fsdp", Ranks(0, 2), cpu_offload=True)


def test_the_launcher_is_torchs_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--nproc N`` hands torch.distributed.run the command line of one rank, leaves this process's
    OMP_NUM_THREADS as it was, and turns a failed rank into one message."""
    import torch.distributed.run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    seen = {}

    def fake_run(args) -> None:  # noqa: ANN001 - torch's argparse namespace
        seen.update(module=args.module, script=args.training_script, rest=args.training_script_args,
                    nproc=args.nproc_per_node, standalone=args.standalone, omp=os.environ["OMP_NUM_THREADS"])
        failure = ProcessFailure(local_rank=1, pid=1, exitcode=2, error_file="")
        raise ChildFailedError("aiayn", {1: failure})

    monkeypatch.setattr(torchrun, "run", fake_run)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    with pytest.raises(AiaynError, match="rank 1 of 2 stopped with exit code 2"):
        launch(2, ["train", "r.toml", "a.b=1", "--resume"])
    assert seen["module"] and seen["script"] == "aiayn" and seen["standalone"]
    assert seen["rest"] == ["train", "r.toml", "a.b=1", "--resume"] and seen["nproc"] == "2"
    assert int(seen["omp"]) >= 1 and "OMP_NUM_THREADS" not in os.environ


def test_one_fixed_gpu_for_several_ranks_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from aiayn.tasks.registry import run_recipe

    recipe = tmp_path / "r.toml"
    recipe.write_text('task = "translation"\n[train]\ndevice = "cuda:0"\n', encoding="utf-8")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(AiaynError, match=r"\[train\] device='cuda:0': would put all 2 processes"):
        run_recipe(recipe)  # refused before joining a process group (no GPU needed to test it)
