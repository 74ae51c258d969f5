"""The thread policy of aiayn.threads with /proc readings, clocks and CPU times injected: no sleeping, no load."""

from __future__ import annotations

import os

import pytest
import torch

from aiayn import threads
from aiayn.threads import CpuSample, ThreadGovernor, choose_threads, others_busy, parse_proc_stat

# two CPUs; fields: user nice system idle iowait irq softirq steal guest guest_nice
STAT = """cpu  300 0 100 500 10 0 0 0 0 0
cpu0 200 0 50 200 5 0 0 0 0 0
cpu1 100 0 50 300 5 0 0 0 0 0
intr 1 2 3
ctxt 42
"""


def stat_text(ticks: list[tuple[int, int, int]]) -> str:
    """/proc/stat with one line per CPU from (user, idle, steal) ticks."""
    lines = [f"cpu{i} {u} 0 0 {idle} 0 0 0 {steal} 0 0" for i, (u, idle, steal) in enumerate(ticks)]
    return "cpu  0 0 0 0 0 0 0 0 0 0\n" + "\n".join(lines) + "\nintr 0\n"


@pytest.fixture(autouse=True)
def _restore_threads(monkeypatch):
    """Each test starts with no explicit choice, the rule not applied, 2 usable cores, and torch's threads
    restored afterwards."""
    before = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "")  # so that teardown restores it, set_explicit having exported it
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(threads, "_explicit", None)
    monkeypatch.setattr(threads, "_adaptive", False)
    monkeypatch.setattr(threads, "_said", "")
    monkeypatch.setattr(threads, "_pending", None)
    monkeypatch.setattr(threads, "_torch_default", 2)
    monkeypatch.setattr(threads, "_affinity", lambda: {0, 1})
    monkeypatch.setattr(threads, "_cgroup_cpu_limit", lambda: None)
    yield
    torch.set_num_threads(before)


def test_parse_proc_stat_sums_the_chosen_cpus_and_counts_steal_as_busy():
    assert parse_proc_stat(STAT) == (200 + 50 + 100 + 50, 455 + 455, 2)
    assert parse_proc_stat(STAT, {1}) == (150, 455, 1)
    text = stat_text([(10, 50, 40)])
    assert parse_proc_stat(text) == (50, 100, 1)  # steal is time the core was not ours
    assert parse_proc_stat("intr 0\n") is None
    assert parse_proc_stat(STAT, {7}) is None


def test_others_busy_subtracts_our_own_cpu_time():
    # 2 CPUs over 1 s (200 ticks): 150 busy ticks = 1.5 cores busy, of which 0.5 core were ours
    before, after = CpuSample(0, 0, 2, 10.0, 100.0), CpuSample(150, 200, 2, 10.5, 101.0)
    assert others_busy(before, after) == pytest.approx(1.0)
    # our own time exceeding the measured busy time (tick rounding) never goes negative
    assert others_busy(before, CpuSample(10, 200, 2, 11.0, 101.0)) == 0.0
    # a window too short to tell
    assert others_busy(before, CpuSample(1, 2, 2, 10.0, 100.01)) is None


@pytest.mark.parametrize(("cores", "busy", "threads", "taken"), [
    (2, 0.0, 2, 0),
    (2, 0.2, 2, 0),    # a little background noise is no reason to drop a core
    (2, 0.5, 1, 1),    # a half-busy core makes every kernel wait for the thread on it
    (2, 1.0, 1, 1),
    (2, 2.0, 1, 1),    # always at least one thread
    (4, 1.0, 3, 1),
    (4, 1.3, 2, 2),
    (2, None, 2, 0),   # not measured: all cores
])
def test_choose_threads_counts_a_core_taken_once_others_use_a_quarter_of_it(cores, busy, threads, taken):
    decision = choose_threads(cores, busy)
    assert (decision.threads, decision.taken) == (threads, taken)


def test_under_a_quota_others_take_cores_only_where_they_leave_fewer_free():
    assert choose_threads(2, 5.0, cpus=8).threads == 2  # 8 CPUs, 2 allowed by the quota, 5 busy: 3 free
    assert choose_threads(2, 7.0, cpus=8).threads == 1
    assert choose_threads(4, 1.0, cpus=4).taken == 1


def test_small_work_runs_on_one_thread_and_the_message_says_why():
    assert choose_threads(2, 0.0, threads.SMALL_STEP_FLOPS / 2).threads == 1
    assert choose_threads(2, 0.0, threads.SMALL_STEP_FLOPS * 2).threads == 2
    assert choose_threads(1, 0.0, 1.0).small is False  # nothing to say on one core
    assert choose_threads(2, 1.0).message().startswith("using 1 of 2 cores: 1 busy with other processes")
    assert "too small to share" in choose_threads(2, 0.0, 1.0).message()
    assert choose_threads(2, 0.0).message() == ""


def test_usable_cores_is_capped_by_the_cgroup_quota_and_torchs_default(monkeypatch):
    monkeypatch.setattr(threads, "_affinity", lambda: set(range(8)))
    monkeypatch.setattr(threads, "_torch_default", 8)
    assert threads.usable_cores() == 8
    monkeypatch.setattr(threads, "_cgroup_cpu_limit", lambda: 2.5)
    assert threads.usable_cores() == 3
    monkeypatch.setattr(threads, "_torch_default", 2)
    assert threads.usable_cores() == 2


def test_explicit_choices_win(monkeypatch):
    assert threads.explicit_threads() is None
    assert threads.explicit_threads({"OMP_NUM_THREADS": "3"}) == 3
    assert threads.explicit_threads({"OMP_NUM_THREADS": "nonsense"}) is None
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    said = []
    assert threads.apply_at_start(say=said.append, read_stat=lambda: stat_text([(100, 0, 0)] * 2)) is None
    assert not said and not threads._adaptive
    monkeypatch.delenv("OMP_NUM_THREADS")
    threads.set_explicit(1)
    assert torch.get_num_threads() == 1 and threads.explicit_threads() == 1 and threads.threads_option() == 1
    assert os.environ["OMP_NUM_THREADS"] == "1"  # for the processes it starts (the ranks of train --nproc)
    with pytest.raises(ValueError):
        threads.set_explicit(0)


def test_apply_at_start_drops_the_busy_core_and_says_so():
    ticks = iter([stat_text([(0, 0, 0), (0, 0, 0)]), stat_text([(100, 0, 0), (0, 100, 0)])])
    # the window began a second ago, so nothing is waited for; the other process used one core, we used none
    start = threads.sample(lambda: next(ticks), own_cpu=lambda: 5.0, clock=lambda: 0.0)
    start = CpuSample(start.busy_ticks, start.total_ticks, start.n_cpus, 0.0, -1.0e9)
    said: list[str] = []
    decision = threads.apply_at_start(start, say=said.append, read_stat=lambda: next(ticks))
    assert decision is not None and decision.threads == 1 and torch.get_num_threads() == 1
    assert said == []  # said when the command's work begins, not before
    threads.announce_threads()
    threads.announce_threads()
    assert said == ["using 1 of 2 cores: 1 busy with other processes (--threads N to choose)"]
    assert threads._adaptive
    # the trainer's first re-check finds the same: nothing more is said
    machine, later = FakeMachine(), []
    gov = governor(machine, 10**7, later)
    machine.run(1.0, ours=1.0, others=1.0)
    assert gov.after_step(1000).threads == 1 and later == []


def test_apply_at_start_without_proc_stat_leaves_torch_alone():
    torch.set_num_threads(2)
    assert threads.apply_at_start(say=print, read_stat=lambda: None) is None
    assert torch.get_num_threads() == 2


class FakeMachine:
    """/proc/stat, a clock and our CPU time that a test advances: ``run(seconds, ours, others)`` in cores."""

    def __init__(self) -> None:
        self.t, self.own, self.busy, self.total = 0.0, 0.0, 0, 0

    def run(self, seconds: float, ours: float, others: float) -> None:
        self.t += seconds
        self.own += ours * seconds
        self.busy += round((ours + others) * seconds * 100)
        self.total += round(2 * seconds * 100)

    def stat(self) -> str:
        idle = self.total - self.busy
        return f"cpu0 {self.busy} 0 0 {idle} 0 0 0 0 0 0\ncpu1 0 0 0 0 0 0 0 0 0 0\n"


def governor(machine: FakeMachine, params: int, said: list[str]) -> ThreadGovernor:
    return ThreadGovernor(params, every_s=30.0, say=said.append, read_stat=machine.stat, clock=lambda: machine.t,
                          own_cpu=lambda: machine.own)


def test_governor_follows_other_processes_and_checks_only_every_30_s():
    threads._adaptive = True
    torch.set_num_threads(2)
    machine, said = FakeMachine(), []
    gov = governor(machine, 10**7, said)  # 6e7 FLOPs per target token: 1000 tokens is well above the small bar
    machine.run(1.0, ours=2.0, others=0.0)
    assert gov.after_step(1000).threads == 2 and not said
    machine.run(10.0, ours=1.0, others=1.0)  # a busy process arrives
    assert gov.after_step(1000) is None  # not due yet: one clock read, nothing else
    machine.run(25.0, ours=1.0, others=1.0)
    assert gov.after_step(1000).threads == 1 and torch.get_num_threads() == 1
    assert said == ["using 1 of 2 cores: 1 busy with other processes (--threads N to choose)"]
    machine.run(31.0, ours=1.0, others=1.0)
    assert gov.after_step(1000).threads == 1 and len(said) == 1  # unchanged: said once
    machine.run(31.0, ours=1.0, others=0.05)  # it left
    assert gov.after_step(1000).threads == 2 and torch.get_num_threads() == 2
    assert said[-1] == "using all 2 cores again: other processes left them"


def test_governor_runs_small_steps_on_one_thread():
    threads._adaptive = True
    torch.set_num_threads(2)
    machine, said = FakeMachine(), []
    model = torch.nn.Linear(10, 10)  # 110 parameters: any step is small
    gov = governor(machine, model, said)
    machine.run(0.5, ours=1.0, others=0.0)
    assert gov.after_step(500).small and torch.get_num_threads() == 1
    assert "too small to share" in said[0]


def test_governor_is_off_unless_the_process_chose_the_rule_and_nothing_is_explicit(monkeypatch):
    machine, said = FakeMachine(), []
    torch.set_num_threads(2)
    assert not governor(machine, 1, said).enabled  # a library user who never called apply_at_start
    threads._adaptive = True
    assert governor(machine, 1, said).enabled
    assert not ThreadGovernor(1, enabled=False, read_stat=machine.stat).enabled  # train.threads, GPU, ranks
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    gov = governor(machine, 1, said)
    machine.run(1.0, ours=1.0, others=1.0)
    assert not gov.enabled and gov.after_step(10) is None and torch.get_num_threads() == 2


# ---------------------------------------------------------------------------------------------- the aiayn command
@pytest.mark.parametrize(("argv", "threads"), [
    (["--threads", "3", "demo"], 3),
    (["demo", "--threads", "2"], 2),
    (["--threads", "3", "demo", "copy", "--threads", "1"], 1),  # the last one given wins
    (["demo"], None),
    (["train", "r.toml", "a.b=1", "--threads", "1", "c.d=2"], 1),
])
def test_threads_is_a_global_option_before_or_after_the_command(argv, threads):
    from aiayn.cli.main import build_parser, parse_args

    assert getattr(parse_args(build_parser(), argv), "threads", None) == threads


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_threads_must_be_a_positive_whole_number(value, capsys):
    from aiayn.cli.main import build_parser, parse_args

    with pytest.raises(SystemExit):
        parse_args(build_parser(), ["--threads", value, "demo"])
    assert "give a whole number of threads" in capsys.readouterr().err


def test_every_command_documents_threads(capsys):
    from aiayn.cli.main import build_parser

    parser = build_parser()
    assert "--threads N" in parser.format_help()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, p in sub.choices.items():
        assert "--threads N" in p.format_help(), name


def _busy_start(said: list[str], apply=threads.apply_at_start) -> None:
    """apply_at_start as the command calls it, on a machine where another process keeps one of two cores busy."""
    ticks = iter([stat_text([(0, 0, 0), (0, 0, 0)]), stat_text([(100, 0, 0), (0, 100, 0)])])
    start = threads.sample(lambda: next(ticks), own_cpu=lambda: 5.0, clock=lambda: 0.0)
    start = CpuSample(start.busy_ticks, start.total_ticks, start.n_cpus, 0.0, -1.0e9)
    apply(start, say=said.append, read_stat=lambda: next(ticks))


def test_the_thread_notice_comes_with_the_work_not_before_an_error_nor_after_train_threads(
        monkeypatch, tmp_path, capsys):
    from aiayn.cli.main import main

    said: list[str] = []
    monkeypatch.setattr(threads, "apply_at_start", lambda start=None: _busy_start(said))
    assert main(["generate", "--checkpoint", str(tmp_path / "missing"), "--prompt", "x"]) == 2
    assert said == [] and "cores" not in capsys.readouterr().err
    threads.forget_start_choice()  # what the trainer does under train.threads
    threads.announce_threads()
    assert said == []
    _busy_start(said)
    threads.announce_threads()
    assert said == ["using 1 of 2 cores: 1 busy with other processes (--threads N to choose)"]


def test_version_is_answered_without_loading_torch():
    import subprocess
    import sys

    code = "import sys; from aiayn.cli.main import main; main(['--version']); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["aiayn", "0.1.0", "False"]
