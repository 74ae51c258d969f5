"""The translation demo says what it reached, what it needed and why when it misses its bar."""

from __future__ import annotations

from aiayn.demos.translation import BAR, STEPS, shortfall

METRICS = {"exact_match": 0.084, "steps": STEPS, "max_steps": STEPS, "train_minutes": 2.5, "threads": 1,
           "train_loss": 1.234}


def test_nothing_to_say_at_or_above_the_bar():
    assert shortfall({**METRICS, "exact_match": BAR}) == ""


def test_a_miss_names_what_was_reached_needed_and_the_run():
    text = shortfall(METRICS)
    assert "8.4%" in text and "95%" in text
    assert f"all {STEPS} training steps" in text and "2.5 min" in text and "1 thread" in text
    assert f"--steps {2 * STEPS}" in text


def test_a_run_cut_short_says_so():
    text = shortfall({**METRICS, "steps": 149})
    assert f"only 149 of {STEPS} training steps" in text and "stopped early" in text
