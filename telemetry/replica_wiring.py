"""One call that wires a replica's telemetry: recorder + Prometheus metrics + tracing.

The parts sit in one GuardedFanOut (a MultiObserver guarding each part), so a bug
in one part neither reaches the engine nor starves the others, and the failures
are exported as `infersight_observer_failures_total`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from telemetry.contract.hooks import EngineObserver
from telemetry.fan_out import GuardedFanOut
from telemetry.metrics import MetricsObserver, ObserverFailuresCollector, RecorderStatsCollector
from telemetry.tracing import TracingObserver


@dataclass
class TelemetryParts:
    """What a server needs besides the observer: `/metrics` (registry) and shutdown (close)."""

    registry: CollectorRegistry
    recorder: Any = None  # telemetry.recorder.Recorder when a store target was given
    metrics: MetricsObserver | None = None
    tracing: TracingObserver | None = None
    observer: GuardedFanOut = field(default_factory=lambda: GuardedFanOut([]))

    def failures(self) -> int:
        """Exceptions swallowed so far, all parts together (span building fails on its own thread)."""
        return self.observer.failures + (self.tracing.failures if self.tracing else 0)

    def close(self) -> None:
        """Flush and close every part (the recorder's final flush included); never raises."""
        self.observer.close()


def build_observer(replica_id: str, model: str, *, store_target=None, metrics: bool = True, tracing: str = "none",
                   otlp_endpoint: str | None = None, registry: CollectorRegistry | None = None,
                   recorder_kwargs: dict | None = None, tracer_provider=None) -> tuple[EngineObserver, TelemetryParts]:
    """(observer for the engine, its parts).

    store_target: a data directory or a ClickHouse URL for the Recorder (None: no recorder).
    tracing: "none" | "console" | "otlp" (or pass an SDK `tracer_provider`).
    registry: where the metrics go (a new CollectorRegistry by default; see parts.registry).
    """
    parts = TelemetryParts(registry=registry if registry is not None else CollectorRegistry())
    if store_target is not None:
        from telemetry.recorder import Recorder  # lazily: it pulls in the store client

        parts.recorder = Recorder(store_target, replica_id, **(recorder_kwargs or {}))
        parts.registry.register(RecorderStatsCollector(parts.recorder, replica_id, model))
    if metrics:
        parts.metrics = MetricsObserver(replica_id, model, registry=parts.registry)
    tracer = TracingObserver(model, replica_id, exporter=tracing, otlp_endpoint=otlp_endpoint,
                             tracer_provider=tracer_provider)
    parts.tracing = tracer if tracer.enabled else None
    parts.observer = GuardedFanOut([p for p in (parts.recorder, parts.metrics, parts.tracing) if p is not None])
    parts.registry.register(ObserverFailuresCollector(parts.failures, replica_id, model))
    return parts.observer, parts
