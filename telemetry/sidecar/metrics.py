"""The sidecar's /metrics: its own request counters, store damage, and the findings table as gauges.

`infersight_finding_active` is 1 per finding whose last_seen lies within the active window
(diagnostics refresh last_seen each time they confirm a finding), so Prometheus alert rules
can fire on findings; `infersight_finding_severity_level` carries the severity as a number.
`infersight_sidecar_store_damage` is the number of problems the store check found per table (0:
sound), `infersight_sidecar_rejected_total` the requests and connections refused by a bound,
`infersight_sidecar_failed_writes_total` the inserts the store did not store (answered 503, so the
writer sends them again).
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily

from telemetry.metrics.definitions import (
    FINDING_ACTIVE, FINDING_SEVERITY_LEVEL, FINDINGS, SIDECAR_ERRORS, SIDECAR_FAILED_WRITES, SIDECAR_INSERT_ROWS,
    SIDECAR_QUERIES, SIDECAR_REJECTED, SIDECAR_REQUEST_DURATION, SIDECAR_STORE_DAMAGE,
)

log = logging.getLogger(__name__)

# no `*_created` companion series: they are off the metric contract (telemetry/METRICS.md)
disable_created_metrics()

SEVERITY_LEVELS = {"info": 0, "warning": 1, "critical": 2}
FINDING_LABELS = ("sidecar", "kind", "severity", "subject", "diagnostic")
# why a request or connection was refused by one of the sidecar's bounds (telemetry/sidecar/limits.py)
REJECT_REASONS = ("body_too_large", "receive_timeout", "incomplete_body", "queries_busy", "inserts_busy",
                  "scrapes_busy", "header_timeout", "too_many_connections")

# the latest version of every finding (ReplacingMergeTree merges lazily: never rely on it)
_ACTIVE_FINDINGS = """
SELECT kind, severity, subject, diagnostic, count() AS n
FROM (
    SELECT finding_id, argMax(kind, last_seen) AS kind, argMax(severity, last_seen) AS severity,
           argMax(subject, last_seen) AS subject, argMax(diagnostic, last_seen) AS diagnostic,
           max(last_seen) AS seen
    FROM findings GROUP BY finding_id
)
WHERE seen >= now64(6, 'UTC') - toIntervalSecond({window:UInt32})
GROUP BY kind, severity, subject, diagnostic
"""
_FINDINGS_TOTAL = "SELECT kind, severity, uniqExact(finding_id) AS n FROM findings GROUP BY kind, severity"


class FindingsCollector:
    """Reads the findings table at scrape time."""

    def __init__(self, store, sidecar: str, active_window_seconds: float):
        self.store, self.sidecar, self.window = store, sidecar, int(active_window_seconds)

    def collect(self):
        active = GaugeMetricFamily(FINDING_ACTIVE, "1 per finding seen within the active window",
                                   labels=FINDING_LABELS)
        level = GaugeMetricFamily(FINDING_SEVERITY_LEVEL,
                                  "Severity of each active finding: 0 info, 1 warning, 2 critical",
                                  labels=FINDING_LABELS)
        total = CounterMetricFamily(FINDINGS, "Distinct findings recorded",
                                    labels=("sidecar", "kind", "severity"))
        try:
            rows = self.store.query_arrow(_ACTIVE_FINDINGS, {"window": self.window}).to_pylist()
            for row in rows:
                labels = (self.sidecar, row["kind"], row["severity"], row["subject"], row["diagnostic"])
                active.add_metric(labels, float(row["n"]))
                level.add_metric(labels, float(SEVERITY_LEVELS.get(row["severity"], 0)))
            for row in self.store.query_arrow(_FINDINGS_TOTAL).to_pylist():
                total.add_metric((self.sidecar, row["kind"], row["severity"]), float(row["n"]))
        except Exception:  # a scrape must not fail because the store is busy or not migrated yet
            log.exception("findings unavailable for this scrape")
        yield from (active, level, total)


class StoreDamageCollector:
    """Asks the store health check (telemetry/sidecar/store_health.py) at scrape time."""

    def __init__(self, health, sidecar: str):
        self.health, self.sidecar = health, sidecar

    def collect(self):
        damage = GaugeMetricFamily(SIDECAR_STORE_DAMAGE, "Problems the store check found per table (0: sound)",
                                   labels=("sidecar", "table"))
        try:
            for table, n in sorted(self.health.damage_by_table().items()):
                damage.add_metric((self.sidecar, table), float(n))
        except Exception:
            log.exception("store health unavailable for this scrape")
        yield damage


class SidecarMetrics:
    def __init__(self, store, name: str, finding_active_window_seconds: float):
        self.registry = CollectorRegistry()
        self.name = name
        self.insert_rows = Counter(SIDECAR_INSERT_ROWS, "Rows inserted through the sidecar",
                                   ("sidecar", "table"), registry=self.registry)
        self.queries = Counter(SIDECAR_QUERIES, "Queries and inserts served", ("sidecar",),
                               registry=self.registry)
        self.errors = Counter(SIDECAR_ERRORS, "Requests answered with an error", ("sidecar",),
                              registry=self.registry)
        self.duration = Histogram(SIDECAR_REQUEST_DURATION, "Time to serve a request",
                                  ("sidecar",), registry=self.registry,
                                  buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        self.rejected = Counter(SIDECAR_REJECTED, "Requests and connections refused by a bound (see reason)",
                                ("sidecar", "reason"), registry=self.registry)
        self.failed_writes = Counter(SIDECAR_FAILED_WRITES, "Inserts the store did not store (answered 503)",
                                     ("sidecar",), registry=self.registry)
        self.queries.labels(name)
        self.errors.labels(name)
        self.failed_writes.labels(name)
        for reason in REJECT_REASONS:
            self.rejected.labels(name, reason)
        self.registry.register(FindingsCollector(store, name, finding_active_window_seconds))

    def reject(self, reason: str) -> None:
        self.rejected.labels(self.name, reason).inc()

    def watch_store_health(self, health) -> None:
        self.registry.register(StoreDamageCollector(health, self.name))
