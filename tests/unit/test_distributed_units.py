"""Pieces of data-parallel training that need no process group (the ranks themselves: tests/integration)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiayn.errors import AiaynError
from aiayn.train.distributed import Ranks, check_same_files, launch


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
        launch(print, 0)


def test_one_fixed_gpu_for_several_ranks_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from aiayn.tasks.registry import run_recipe

    recipe = tmp_path / "r.toml"
    recipe.write_text('task = "translation"\n[train]\ndevice = "cuda:0"\n', encoding="utf-8")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(AiaynError, match=r"\[train\] device='cuda:0': would put all 2 processes"):
        run_recipe(recipe)  # refused before joining a process group (no GPU needed to test it)
