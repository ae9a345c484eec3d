"""Custom collectors: counters that live elsewhere, read at scrape time.

The Recorder and the observer guards keep plain integer counts (they must not
depend on prometheus); these collectors expose them as `_total` counters when
Prometheus scrapes, so nothing on the engine thread pays for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping

from prometheus_client.metrics_core import CounterMetricFamily

from telemetry.metrics.definitions import LABELS

log = logging.getLogger(__name__)

# Recorder.stats() key -> (metric name, help)
ROW_COUNTERS = {
    "written": ("infersight_telemetry_rows_written_total", "Telemetry rows the recorder stored"),
    "spooled": ("infersight_telemetry_rows_spooled_total",
                "Telemetry rows the recorder spooled to disk because the store was unreachable"),
    "replayed": ("infersight_telemetry_rows_replayed_total", "Spooled telemetry rows replayed into the store"),
    "dropped": ("infersight_telemetry_rows_dropped_total",
                "Telemetry rows dropped (buffer or spool full, unrecoverable error)"),
}


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
                for key, (name, doc) in ROW_COUNTERS.items()}

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

    NAME = "infersight_observer_failures_total"

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
