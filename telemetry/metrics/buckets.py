"""Histogram buckets (upper bounds, base units) wide enough for a 2-core CPU and an H100.

A CPU replica's TTFT is seconds, a GPU's tens of milliseconds; one set of buckets
must resolve both, so the latency buckets run a 1-2.5-5 ladder over five decades.
"""

from __future__ import annotations


def ladder(low: float, high: float, steps: tuple[float, ...] = (1.0, 2.5, 5.0)) -> tuple[float, ...]:
    """1-2.5-5 style bounds from `low` to `high` inclusive, e.g. 0.001, 0.0025, 0.005, 0.01 ..."""
    bounds: list[float] = []
    decade = low
    while decade <= high * (1 + 1e-9):
        for step in steps:
            bound = round(decade * step, 10)
            if low * (1 - 1e-9) <= bound <= high * (1 + 1e-9):
                bounds.append(bound)
        decade *= 10
    return tuple(bounds)


# time to first token: 1 ms .. 60 s, dense where SLOs sit (tens of ms on a GPU, ~1 s on a CPU)
TTFT_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                1.0, 1.5, 2.0, 2.5, 5.0, 7.5, 10.0, 20.0, 30.0, 45.0, 60.0)
# inter-token latency: 0.5 ms .. 10 s, dense over 5..100 ms (a decode step on a GPU .. a CPU);
# speculative tokens accepted in one step arrive together and land in the first bucket
ITL_SECONDS = (0.0005, 0.001, 0.002, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
               0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
# whole-request phases (e2e, queue, prefill, decode): 1 ms .. 10 min
REQUEST_SECONDS = ladder(0.001, 100.0) + (300.0, 600.0)
# one scheduler step: 0.1 ms .. 10 s
STEP_SECONDS = ladder(0.0001, 10.0)
# share of a step spent outside the forward pass: 0..1
RATIO = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)
# tokens per request: 1 .. 128k
TOKENS = ladder(1, 100_000, steps=(1.0, 2.0, 5.0)) + (131_072.0,)
