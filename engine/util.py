"""Small helpers that several rooms of the engine use and that are no concept of their own:
a free loopback port, and durations as people write them ("60s", "5m", "1h", "500ms", or seconds).
Standard library only, so that every layer may import it."""

from __future__ import annotations

import re
import socket

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*$")


def parse_interval(value) -> float:
    """Seconds (> 0) from "60s" / "2m" / 60 / 0.5; ValueError naming the value otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"interval {value!r}: give seconds or a duration such as \"60s\", \"5m\"")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        m = _DURATION.match(str(value))
        if not m:
            raise ValueError(f"interval {value!r}: give seconds or a duration such as \"60s\", \"5m\", \"500ms\"")
        seconds = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    if not seconds > 0:
        raise ValueError(f"interval {value!r}: must be more than 0")
    return seconds


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now (the OS's pick; another process may still take it before you bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0
