"""`calibrate` says when its capacity is only its own --max-rate ceiling."""

from __future__ import annotations

from engine.traffic.calibrate import RatePoint, capacity, capacity_line, ceiling_reached


def _p(rate, ok):
    return RatePoint(rate, rate, 10, 0, 0.1, 0.01, 0.5, ok)


def test_ceiling_reached_is_said():
    points = [_p(1, True), _p(2, True), _p(4, True)]
    assert capacity(points) == 4 and ceiling_reached(points)
    assert "ceiling (4/s) was reached without breaching the SLO" in capacity_line(points, 4)


def test_a_knee_is_a_capacity():
    points = [_p(1, True), _p(2, True), _p(4, False)]
    assert capacity(points) == 2 and not ceiling_reached(points)
    line = capacity_line(points, 2)
    assert line == "capacity: 2 requests/s per replica under the SLO" and "ceiling" not in line
    assert "not met even at the lowest rate" in capacity_line([_p(1, False)], 0)
