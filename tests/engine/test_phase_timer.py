"""The step's phase timer: laps charged to their phases, and the split of one forward or of K sub-steps."""

from __future__ import annotations

import pytest

from engine.core.phase_timer import PHASES, PhaseTimer


def _timer(**seconds) -> PhaseTimer:
    timer = PhaseTimer()
    timer.seconds = dict.fromkeys(PHASES, 0.0) | seconds
    return timer


def test_laps_charge_the_time_since_the_last_lap():
    timer = PhaseTimer()
    timer.lap("schedule")
    timer.lap("forward")
    timer.lap("forward")
    assert timer.seconds["forward"] >= 0.0 and timer.seconds["prepare"] == 0.0
    timer.move(timer.seconds["schedule"], "schedule", "prepare")  # what a draft model's forwards do
    assert timer.seconds["schedule"] == 0.0


def test_one_forward_is_one_split_of_the_five_phases():
    timer = _timer(schedule=1.0, prepare=2.0, forward=3.0, sample=4.0, postprocess=5.0)
    assert timer.splits([]) == [(1.0, 2.0, 3.0, 4.0, 5.0)]


def test_sub_steps_split_the_phases_and_keep_the_total():
    """Schedule and prepare on the first sub-step, the postprocess on the last, each its own forward; the
    forward phase's time outside the sub-steps (reading the tokens back) is the last one's sampling."""
    timer = _timer(schedule=1.0, prepare=2.0, forward=10.0, sample=0.5, postprocess=5.0)
    splits = timer.splits([3.0, 3.0, 3.0])
    assert splits == [(1.0, 2.0, 3.0, 0.0, 0.0), (0.0, 0.0, 3.0, 0.0, 0.0), (0.0, 0.0, 3.0, 1.5, 5.0)]
    assert sum(map(sum, splits)) == pytest.approx(sum(timer.seconds.values()))
