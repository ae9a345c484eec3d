"""The Prometheus metric names infersight exports: the contract dashboards and alerts use.

Derived from the registry of names, `telemetry.metrics.definitions` (engine: its families and
the collectors' counters; sidecar: findings and its own health), never listed again here.
Dashboards and alert rules may use these names only; the tests cross-check them against a live
`/metrics` scrape of the real exporters.
"""

from __future__ import annotations

from telemetry.metrics.definitions import SIDECAR_FAMILIES, engine_families

_ENGINE = engine_families()


def _of(families: dict[str, str], kind: str) -> tuple[str, ...]:
    return tuple(name for name, t in families.items() if t == kind)


ENGINE_HISTOGRAMS = _of(_ENGINE, "histogram")
ENGINE_GAUGES = _of(_ENGINE, "gauge")
ENGINE_COUNTERS = _of(_ENGINE, "counter")
SIDECAR_GAUGES = _of(SIDECAR_FAMILIES, "gauge")
SIDECAR_COUNTERS = _of(SIDECAR_FAMILIES, "counter")
SIDECAR_HISTOGRAMS = _of(SIDECAR_FAMILIES, "histogram")

# Prometheus' own per-target metric: `up{job="infersight-replicas"} == 0` is a replica down.
PROMETHEUS_BUILTINS = ("up",)

HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def series_names(histograms=(), gauges=(), counters=()) -> set[str]:
    """The series names a scrape shows for these metrics (histograms expand to _bucket/_sum/_count)."""
    names = set(gauges) | set(counters)
    names |= {h + s for h in histograms for s in HISTOGRAM_SUFFIXES}
    return names


ENGINE_SERIES = series_names(ENGINE_HISTOGRAMS, ENGINE_GAUGES, ENGINE_COUNTERS)
SIDECAR_SERIES = series_names(SIDECAR_HISTOGRAMS, SIDECAR_GAUGES, SIDECAR_COUNTERS)
ALL_SERIES = ENGINE_SERIES | SIDECAR_SERIES | set(PROMETHEUS_BUILTINS)
