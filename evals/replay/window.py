"""`--window`: which stretch of stored production traffic to replay.

    2h            the last two hours (any of 90s, 30m, 2h, 7d, 1w)
    START..END    either side may be empty (from the beginning / up to now); each side is epoch
                  seconds, ISO 8601 (UTC unless a zone is given), `now`, or relative (2h = two hours ago)

The same forms as `infersight diagnose --since/--until`: both parse with telemetry.contract.times.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from telemetry.contract.times import RELATIVE, parse_time


@dataclass(frozen=True)
class Window:
    spec: str  # as the user gave it: part of the run's suite name
    start: float  # epoch seconds, inclusive
    end: float  # exclusive; `now` (when the replay started) where the spec leaves it open


def parse_window(spec: str, now: float | None = None) -> Window:
    now = time.time() if now is None else now
    spec = spec.strip()
    if not spec:
        raise ValueError("empty --window (examples: 2h, 30m, 2024-05-01T10:00..2024-05-01T11:00, 1700000000..)")
    if ".." in spec:
        since, _, until = spec.partition("..")
        start = parse_time(since, now) if since.strip() else 0.0
        end = parse_time(until, now) if until.strip() else now
    else:
        if not RELATIVE.match(spec):
            raise ValueError(f"window {spec!r}: give a duration back from now (2h, 30m) or START..END")
        start, end = parse_time(spec, now), now
    if start >= end:
        raise ValueError(f"window {spec!r} is empty: its start is not before its end")
    return Window(spec, start, end)
