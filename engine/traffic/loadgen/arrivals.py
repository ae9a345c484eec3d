"""Arrival processes: when requests are sent.

- `poisson:RATE`: open loop, exponential gaps at RATE requests/s (independent users);
- `burst:N@INTERVAL`: open loop, N requests at once every INTERVAL seconds (batch jobs);
- `closed:CONCURRENCY`: closed loop, CONCURRENCY clients that each send the next
  request when their previous one finishes (a saturation test).
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Arrival:
    kind: str  # "poisson" | "burst" | "closed"
    rate: float = 0.0  # poisson: requests / s
    burst: int = 0  # burst: requests per burst
    interval: float = 0.0  # burst: seconds between bursts
    concurrency: int = 0  # closed: clients

    @property
    def open_loop(self) -> bool:
        return self.kind != "closed"

    def offsets(self, seed: int = 0):
        """Send times (seconds from the start) of an open-loop process, endless."""
        rng = random.Random(f"arrival:{seed}")
        t = 0.0
        if self.kind == "poisson":
            while True:
                t += rng.expovariate(self.rate)
                yield t
        elif self.kind == "burst":
            while True:
                for _ in range(self.burst):
                    yield t
                t += self.interval
        else:
            raise ValueError("a closed-loop arrival has no send schedule")

    def describe(self) -> str:
        if self.kind == "poisson":
            return f"poisson:{self.rate:g}"
        if self.kind == "burst":
            return f"burst:{self.burst}@{self.interval:g}"
        return f"closed:{self.concurrency}"


def parse_arrival(text: str) -> Arrival:
    """'poisson:4' | 'burst:16@5' | 'closed:8' -> Arrival (ValueError with the accepted forms)."""
    usage = "use poisson:RATE, burst:N@INTERVAL or closed:CONCURRENCY (e.g. poisson:2, burst:16@5, closed:4)"
    kind, _, arg = text.strip().partition(":")
    try:
        if kind == "poisson":
            rate = float(arg)
            if not rate > 0:
                raise ValueError
            return Arrival("poisson", rate=rate)
        if kind == "burst":
            n, _, interval = arg.partition("@")
            arrival = Arrival("burst", burst=int(n), interval=float(interval))
            if arrival.burst < 1 or not arrival.interval > 0:
                raise ValueError
            return arrival
        if kind == "closed":
            c = int(arg)
            if c < 1:
                raise ValueError
            return Arrival("closed", concurrency=c)
    except ValueError:
        pass
    raise ValueError(f"bad arrival {text!r}: {usage}")
