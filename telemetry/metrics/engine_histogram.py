"""A histogram family for the engine thread: lock-free observations, exposed through prometheus_client.

prometheus_client's Histogram takes a lock per bucket and per sum on every
observation (~2 us here), and a request's inter-token latencies are hundreds of
observations at once. Every observation of a child comes from one thread (the
engine loop of its replica), so a child here is a plain list of bucket counts
and a float sum, updated with a C bisect; the scrape thread reads a copy and
exports it as a standard HistogramMetricFamily. Rule: one writer per child
(one MetricsObserver per replica id and registry).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString


VECTORIZE_FROM = 16  # observe_many: numpy from this many values (a request's 255 ITLs: its hook 40 -> 27 us)


class EngineHistogramChild:
    __slots__ = ("bounds", "_bounds_array", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self._bounds_array = np.asarray(bounds, dtype=np.float64)
        self.counts = [0] * (len(bounds) + 1)  # per bucket, not cumulative; the last is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # first bound >= value: Prometheus' `le`
        self.sum += value

    def observe_many(self, values: Sequence[float]) -> None:
        counts = self.counts
        if len(values) >= VECTORIZE_FROM:
            # searchsorted(side="left") is bisect_left: the first bound >= value
            per_bucket = np.bincount(np.searchsorted(self._bounds_array, values), minlength=len(counts))
            for i in np.flatnonzero(per_bucket).tolist():
                counts[i] += int(per_bucket[i])
        else:
            bounds = self.bounds
            for value in values:
                counts[bisect_left(bounds, value)] += 1
        self.sum += sum(values)


class EngineHistogram:
    """A labelled histogram family registered as a custom collector on `registry`."""

    def __init__(self, name: str, documentation: str, labelnames: Iterable[str], buckets: Sequence[float],
                 registry: CollectorRegistry):
        bounds = tuple(float(b) for b in buckets if b != float("inf"))
        if list(bounds) != sorted(set(bounds)):
            raise ValueError(f"{name}: buckets must be strictly increasing")
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.bounds = bounds
        self._le = [floatToGoString(b) for b in bounds] + ["+Inf"]
        self._children: dict[tuple[str, ...], EngineHistogramChild] = {}
        registry.register(self)

    def labels(self, *values: str) -> EngineHistogramChild:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {values}")
        key = tuple(str(v) for v in values)
        child = self._children.get(key)
        if child is None:
            child = self._children.setdefault(key, EngineHistogramChild(self.bounds))
        return child

    def remove(self, *values: str) -> None:
        self._children.pop(tuple(str(v) for v in values), None)

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, child in list(self._children.items()):
            counts, total = list(child.counts), child.sum  # a snapshot; the engine thread keeps writing
            cumulative, buckets = 0, []
            for le, count in zip(self._le, counts):
                cumulative += count
                buckets.append((le, cumulative))
            family.add_metric(key, buckets, total)
        yield family
