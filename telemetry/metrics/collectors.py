"""Custom collectors: counters that live elsewhere, read at scrape time.

The Recorder and the observer guards keep plain integer counts (they must not
depend on prometheus); these collectors expose them as `_total` counters when
Prometheus scrapes, so nothing on the engine thread pays for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping

from prometheus_client.metrics_core import CounterMetricFamily

from telemetry.metrics.definitions import LABELS, OBSERVER_FAILURES, RECORDER_ROW_COUNTERS

log = logging.getLogger(__name__)


class RecorderStatsCollector:
    """Exports `stats() -> {table: {"written", "spooled", "replayed", "dropped"}}` as four counters.

    `source` is a Recorder (anything with `.stats()`) or a callable returning that dict.
    """

    def __init__(self, source, replica_id: str, model: str):
        stats = source.stats if hasattr(source, "stats") else source
        self._stats: Callable[[], Mapping[str, Mapping[str, int]]] = stats
        self._ids = (replica_id, model)

    def _families(self) -> dict[str, CounterMetricFamily]:
        return {key: CounterMetricFamily(name, doc, labels=LABELS + ("table",))
                for key, (name, doc) in RECORDER_ROW_COUNTERS.items()}

    def describe(self) -> Iterator[CounterMetricFamily]:
        yield from self._families().values()  # names only: registering must not call stats()

    def collect(self) -> Iterator[CounterMetricFamily]:
        families = self._families()
        try:
            stats = self._stats()
        except Exception:  # a broken source must not fail the whole scrape
            log.exception("recorder stats unavailable for this scrape")
            stats = {}
        for table, counts in sorted(stats.items()):
            for key, family in families.items():
                family.add_metric((*self._ids, table), float(counts.get(key, 0)))
        yield from families.values()


class ObserverFailuresCollector:
    """Exports `failures() -> int` (exceptions swallowed by observer guards) as a counter."""

    NAME = OBSERVER_FAILURES

    def __init__(self, failures: Callable[[], int], replica_id: str, model: str):
        self._failures = failures
        self._ids = (replica_id, model)

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self.NAME, "Exceptions raised by telemetry observers (swallowed, engine unaffected)",
                                   labels=LABELS)

    def describe(self) -> Iterator[CounterMetricFamily]:
        yield self._family()

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = self._family()
        try:
            family.add_metric(self._ids, float(self._failures()))
        except Exception:
            log.exception("observer failure count unavailable for this scrape")
        yield family


def register_process_collector(registry) -> bool:
    """Add prometheus_client's ProcessCollector (process_resident_memory_bytes, process_cpu_seconds_total,
    process_open_fds ...) to a custom `registry` (the default registry has it already). Idempotent: a
    registry holding it already is left as is. False where the platform has no /proc."""
    from prometheus_client import REGISTRY, ProcessCollector

    if registry is None or registry is REGISTRY:
        return False
    if getattr(registry, "_infersight_process_collector", False):
        return True
    try:
        ProcessCollector(registry=registry)
    except ValueError:  # registered by someone else: the names are taken, which is what we want
        pass
    registry._infersight_process_collector = True
    return True
