"""A histogram family for the engine thread: lock-free observations, exposed through prometheus_client.

prometheus_client's Histogram takes a lock per bucket and per sum on every
observation (~2 us here), and a request's inter-token latencies are hundreds of
observations at once. Every observation of a child comes from one thread (the
engine loop of its replica), so a child here is a plain list of bucket counts
and a float sum, updated with a C bisect; the scrape thread reads a copy and
exports it as a standard HistogramMetricFamily. Rule: one writer per child
(one MetricsObserver per replica id and registry).

A child may keep finer buckets than its family exports (`resolve`): the union of its own
bounds and another family's. A `HistogramView` then exports the same observations under
another name, labels and bounds (vLLM's, telemetry/metrics/vllm_names.py) at scrape time:
one bisect per observation on the engine thread serves both, and a cumulative count at a
kept bound is exact for every family that exports it.
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


def finite_bounds(name: str, buckets: Iterable[float]) -> tuple[float, ...]:
    bounds = tuple(float(b) for b in buckets if b != float("inf"))
    if list(bounds) != sorted(set(bounds)):
        raise ValueError(f"{name}: buckets must be strictly increasing")
    return bounds


class CumulativeAt:
    """Reads a child's per-bucket counts (over its kept bounds) as cumulative (le, count) pairs at
    `bounds`, each of which must be one of the kept bounds."""

    def __init__(self, name: str, kept: tuple[float, ...], bounds: tuple[float, ...]):
        position = {b: i for i, b in enumerate(kept)}
        missing = [b for b in bounds if b not in position]
        if missing:
            raise ValueError(f"{name}: bounds {missing} are not kept by the source histogram")
        self._last_index = [position[b] for b in bounds]
        self._le = [floatToGoString(b) for b in bounds]

    def __call__(self, counts: list[int]) -> list[tuple[str, int]]:
        buckets, cumulative, start = [], 0, 0
        for le, last in zip(self._le, self._last_index):
            cumulative += sum(counts[start:last + 1])
            start = last + 1
            buckets.append((le, cumulative))
        buckets.append(("+Inf", cumulative + sum(counts[start:])))
        return buckets


class EngineHistogram:
    """A labelled histogram family registered as a custom collector on `registry` (None: not
    exported itself, only a source for views). `resolve`: more bounds its children keep, so that
    a HistogramView can export them exactly."""

    def __init__(self, name: str, documentation: str, labelnames: Iterable[str], buckets: Sequence[float],
                 registry: CollectorRegistry | None, resolve: Iterable[float] = ()):
        exported = finite_bounds(name, buckets)
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.bounds = tuple(sorted(set(exported) | {float(b) for b in resolve}))  # what the children count
        self.exported_bounds = exported
        self._cumulative = CumulativeAt(name, self.bounds, exported)
        self._children: dict[tuple[str, ...], EngineHistogramChild] = {}
        if registry is not None:
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

    def snapshots(self) -> list[tuple[tuple[str, ...], list[int], float]]:
        """(label values, per-bucket counts over the kept bounds, sum) of every child: a copy, as the
        engine thread keeps writing."""
        return [(key, list(child.counts), child.sum) for key, child in list(self._children.items())]

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, counts, total in self.snapshots():
            family.add_metric(key, self._cumulative(counts), total)
        yield family


class HistogramView:
    """Another family over an EngineHistogram's children, built at scrape time: its own name, its
    labels from each child's (`relabel(label values) -> label values`, None to leave a child out),
    and bounds that the source keeps (`bounds_for(label values)`, or `buckets` for every child)."""

    def __init__(self, source: EngineHistogram, name: str, documentation: str, labelnames: Iterable[str],
                 buckets: Sequence[float], relabel, registry: CollectorRegistry | None):
        self.source = source
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.relabel = relabel
        self._default = CumulativeAt(name, source.bounds, finite_bounds(name, buckets))
        self._per_key: dict[tuple[str, ...], CumulativeAt] = {}
        if registry is not None:
            registry.register(self)

    def set_bounds(self, key: tuple[str, ...], buckets: Sequence[float]) -> None:
        """Bounds of the source child `key` (another replica in the registry may have others)."""
        self._per_key[tuple(key)] = CumulativeAt(self.name, self.source.bounds, finite_bounds(self.name, buckets))

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, counts, total in self.source.snapshots():
            labels = self.relabel(key)
            if labels is not None:
                family.add_metric(labels, self._per_key.get(key, self._default)(counts), total)
        yield family
