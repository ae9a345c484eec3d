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
        """Exceptions swallowed so far, all parts together (span building fails on its own thread, a
        deferred metrics record in the fold: folded first, so that none is missed)."""
        if self.metrics is not None:
            self.metrics.fold()
        return (self.observer.failures + (self.tracing.failures if self.tracing else 0)
                + (self.metrics.failures if self.metrics else 0))

    def close(self) -> None:
        """Flush and close every part (the recorder's final flush included); never raises."""
        self.observer.close()


def build_observer(replica_id: str, model: str, *, store_target=None, store_text: bool = False, metrics: bool = True,
                   tracing: str = "none", otlp_endpoint: str | None = None, registry: CollectorRegistry | None = None,
                   recorder_kwargs: dict | None = None, tracer_provider=None,
                   vllm_names: bool = True) -> tuple[EngineObserver, TelemetryParts]:
    """(observer for the engine, its parts).

    store_target: a data directory or a ClickHouse URL for the Recorder (None: no recorder).
    store_text: may the Recorder store prompt and output text (`serve --store-text`)? The records
      carry the text; the Recorder is the one place that decides whether it reaches the store
      (metrics and tracing never export it).
    tracing: "none" | "console" | "otlp" (or pass an SDK `tracer_provider`).
    registry: where the metrics go (a new CollectorRegistry by default; see parts.registry).
    vllm_names: the metrics under vLLM's names and labels too (`vllm:*`, telemetry/metrics/vllm_names.py).
    """
    recorder_kwargs = dict(recorder_kwargs or {})
    if "store_text" in recorder_kwargs:
        raise ValueError("pass store_text to build_observer itself, not in recorder_kwargs")
    parts = TelemetryParts(registry=registry if registry is not None else CollectorRegistry())
    if store_target is not None:
        from telemetry.recorder import Recorder  # lazily: it pulls in the store client

        parts.recorder = Recorder(store_target, replica_id, store_text=store_text, **recorder_kwargs)
        parts.registry.register(RecorderStatsCollector(parts.recorder, replica_id, model))
    if metrics:
        parts.metrics = MetricsObserver(replica_id, model, registry=parts.registry, vllm_names=vllm_names)
    tracer = TracingObserver(model, replica_id, exporter=tracing, otlp_endpoint=otlp_endpoint,
                             tracer_provider=tracer_provider)
    parts.tracing = tracer if tracer.enabled else None
    parts.observer = GuardedFanOut([p for p in (parts.recorder, parts.metrics, parts.tracing) if p is not None])
    parts.registry.register(ObserverFailuresCollector(parts.failures, replica_id, model))
    return parts.observer, parts
