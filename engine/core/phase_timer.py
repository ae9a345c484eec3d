"""The host time of one engine step, split in the StepRecord's five phases."""

from __future__ import annotations

import time

PHASES = ("schedule", "prepare", "forward", "sample", "postprocess")


class PhaseTimer:
    """Started when the step starts; `lap(phase)` charges the time since the last lap to `phase`."""

    def __init__(self):
        self.start_wall = time.time()
        self.start = self._last = time.perf_counter()
        self.seconds = dict.fromkeys(PHASES, 0.0)

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] += now - self._last
        self._last = now

    @property
    def elapsed(self) -> float:
        """Seconds from the step's start to its last lap."""
        return self._last - self.start

    def move(self, seconds: float, source: str, target: str) -> None:
        """Charge `seconds` of `source` to `target` instead (a draft model's forwards, inside prepare)."""
        self.seconds[source] -= seconds
        self.seconds[target] += seconds

    def splits(self, forward_seconds: list[float]) -> list[tuple[float, ...]]:
        """The split of each forward the step ran: one, or a multi-step batch's sub-steps (each its own
        forward time; the schedule and prepare on the first, the postprocess on the last, and the forward
        phase's time outside the sub-steps, the tokens read back, on the last one's sampling)."""
        s = self.seconds
        forwards = forward_seconds or [s["forward"]]
        last = len(forwards) - 1
        rest = s["sample"] + s["forward"] - sum(forwards)
        return [(s["schedule"] if j == 0 else 0.0, s["prepare"] if j == 0 else 0.0, f,
                 rest if j == last else 0.0, s["postprocess"] if j == last else 0.0)
                for j, f in enumerate(forwards)]
