"""Points in time as people write them on a command line: one parser for `diagnose --since/--until`,
the dashboards' windows and `replay --window` (stdlib only, like the rest of telemetry.contract).

Accepted: epoch seconds, ISO 8601 (UTC unless a zone is given), `now`, or relative to now:
90s, 30m, 2h, 7d, 1w (that long ago).
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone

RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_time(text: str | float | None, now: float | None = None) -> float | None:
    """A point in time as epoch seconds; None for None or ''."""
    if text is None or text == "":
        return None
    if isinstance(text, (int, float)):
        return float(text)
    now = time.time() if now is None else now
    s = str(text).strip()
    if s == "now":
        return now
    if m := RELATIVE.match(s):
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
