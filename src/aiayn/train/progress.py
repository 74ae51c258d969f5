"""The training progress bar: steps done against the limit that will end the run, with an ETA that holds.

A run ends at ``train.max_steps`` or after ``train.max_minutes``, whichever comes first. Once the step rate is
known, the bar's total is the step the run will actually reach: ``max_steps`` when that comes first, else the step
expected when the minutes run out (so tqdm's remaining-time estimate is the time left), and its label says which
limit binds.

On a terminal it is a tqdm bar; when standard error is a file or a pipe (a log), it prints a plain line after the
first step and every ``LOG_EVERY_S`` seconds instead, so the log holds no carriage-return refreshes.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator

from tqdm import tqdm

LOG_EVERY_S = 60.0  # seconds between plain progress lines in a log


class TrainingProgress:
    """A tqdm bar over optimizer steps that knows both limits of the run.

    Args:
        max_steps: the step limit.
        max_minutes: the time limit (None: none), counting ``elapsed_before``.
        step: the step the run starts from (a resumed run's).
        elapsed_before: seconds of training before this process (a resumed run's).
        enabled: draw the bar (rank 0 with ``train.progress``).
    """

    def __init__(self, max_steps: int, max_minutes: float | None, step: int, elapsed_before: float,
                 enabled: bool) -> None:
        self.max_steps, self.max_minutes = max_steps, max_minutes
        self.start_step, self.elapsed_before = step, elapsed_before
        self.t0 = time.time()
        self.time_binds = False
        terminal = sys.stderr.isatty()
        self.log_lines = enabled and not terminal  # plain lines instead of a redrawn bar
        self.logged_at, self.postfix = self.t0, {}
        self.desc = f"to step {max_steps}"
        self.bar = tqdm(total=max_steps, initial=step, disable=not (enabled and terminal), dynamic_ncols=True,
                        unit="step", desc=self.desc)

    def projected_last_step(self, step: int) -> int:
        """The step the run will end at: ``max_steps``, or sooner when ``max_minutes`` runs out first at the rate
        of this process's steps so far."""
        if self.max_minutes is None or step <= self.start_step:
            return self.max_steps
        spent = time.time() - self.t0
        left = self.max_minutes * 60 - self.elapsed_before - spent
        rate = (step - self.start_step) / max(spent, 1e-9)  # steps/s in this process
        return min(self.max_steps, step + max(0, int(rate * left)) + 1)

    def update(self, step: int) -> None:
        """Advance the bar to ``step`` and re-aim its total at the limit that binds."""
        last = self.projected_last_step(step)
        time_binds = last < self.max_steps
        if time_binds != self.time_binds or (time_binds and last != self.bar.total):
            self.time_binds = time_binds
            self.bar.total = last
            self.desc = (f"to the {self.max_minutes:g}-min limit (~step {last})" if time_binds
                         else f"to step {self.max_steps}")
            self.bar.set_description_str(self.desc)
        self.bar.update(step - self.bar.n)
        now = time.time()
        first = step == self.start_step + 1  # the first line as soon as the first step is done
        if self.log_lines and (first or now - self.logged_at >= LOG_EVERY_S or step == self.max_steps):
            self.logged_at = now
            minutes = (self.elapsed_before + now - self.t0) / 60
            values = "".join(f", {k} {v}" for k, v in self.postfix.items())
            print(f"step {step}/{self.bar.total} ({self.desc}){values}, {minutes:.1f} min", file=sys.stderr,
                  flush=True)

    def set_postfix(self, **values: str) -> None:
        """Loss, learning rate and throughput after the bar."""
        self.postfix = values
        self.bar.set_postfix(ordered_dict=values)

    @contextlib.contextmanager
    def validating(self, step: int) -> Iterator[None]:
        """While the run validates (or saves): the bar says so; a log gets a line."""
        self.bar.set_description_str(f"validating at step {step}")
        if self.log_lines:
            print(f"step {step}: validating", file=sys.stderr, flush=True)
        try:
            yield
        finally:
            self.bar.set_description_str(self.desc)

    def close(self) -> None:
        """Finish the bar (its line stays on the terminal)."""
        self.bar.close()
