"""`--window`: which stretch of stored production traffic to replay.

    2h            the last two hours (any of 90s, 30m, 2h, 7d, 1w)
    START..END    either side may be empty (from the beginning / up to now); each side is epoch
                  seconds, ISO 8601 (UTC unless a zone is given), `now`, or relative (2h = two hours ago)

The same forms as `infersight diagnose --since/--until` (diagnostics/scope.py), written again here
because evals sits below diagnostics in the import order.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


@dataclass(frozen=True)
class Window:
    spec: str  # as the user gave it: part of the run's suite name
    start: float  # epoch seconds, inclusive
    end: float  # exclusive; `now` (when the replay started) where the spec leaves it open


def parse_time(text: str, now: float) -> float:
    s = text.strip()
    if s == "now":
        return now
    if m := _RELATIVE.match(s):
        return now - float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    try:
        return float(s)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"not a time: {text!r} (epoch seconds, ISO 8601, 'now', or relative like 2h / 30m / 7d)")
    return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()


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
        if not _RELATIVE.match(spec):
            raise ValueError(f"window {spec!r}: give a duration back from now (2h, 30m) or START..END")
        start, end = parse_time(spec, now), now
    if start >= end:
        raise ValueError(f"window {spec!r} is empty: its start is not before its end")
    return Window(spec, start, end)
