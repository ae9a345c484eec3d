"""Prometheus metrics of a replica: the `infersight_*` families, their observer, and collectors.

Every name, type and label is listed in `telemetry/METRICS.md`.
"""

from telemetry.metrics.collectors import ObserverFailuresCollector, RecorderStatsCollector
from telemetry.metrics.definitions import LABELS, REPLICA_INFO_LABELS, EngineMetrics, engine_metrics
from telemetry.metrics.observer import MetricsObserver

__all__ = [
    "LABELS",
    "REPLICA_INFO_LABELS",
    "EngineMetrics",
    "MetricsObserver",
    "ObserverFailuresCollector",
    "RecorderStatsCollector",
    "engine_metrics",
]
