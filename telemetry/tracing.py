"""TracingObserver: one OpenTelemetry span per request, with queue / prefill / decode children.

Spans are built after the fact, from the RequestRecord's timestamps, once the
request has finished: nothing stays open on the engine thread. Building four SDK
spans costs a few hundred microseconds of Python, so the engine thread only
queues the record; a worker thread builds the spans and hands them to the
exporter's batch processor. The queue is bounded: past it, spans are dropped and
counted (`dropped_spans`), the engine never waits.

The engine thread does not wake the worker per request: a woken thread asks for the GIL
and takes it from the engine thread in the middle of its step (a handoff, two context
switches and a cold cache per finished request). The worker wakes every `build_interval`
seconds (or once `wake_rows` records wait) and builds what queued meanwhile in one run;
spans are timestamped from the record, so building them later changes none of them.

Attribute names follow the OpenTelemetry GenAI semantic conventions (`gen_ai.*`);
ours are under `infersight.*` (see `telemetry/tracing_spans.py`). A caller's W3C
`traceparent` (the `trace_context` carrier given to `on_request_arrival`) makes
the request span a child of the caller's span, so its trace id is the one the
RequestRecord carries; without one, the span takes the record's own trace id.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from urllib.parse import urlsplit

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Tracer, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

from telemetry.contract.hooks import EngineObserver
from telemetry.contract.records import RequestRecord
from telemetry.tracing_spans import OPERATION_KEY, RecordTraceIds, build_span_tree

log = logging.getLogger(__name__)

EXPORTERS = ("none", "console", "otlp")
# How often the worker builds what queued (spans reach the exporter's batch processor, itself a
# 5 s schedule by default, at most this much later) and how many records wake it before that.
BUILD_INTERVAL = 1.0
WAKE_ROWS = 512
__all__ = ["EXPORTERS", "OPERATION_KEY", "TracingObserver", "traces_url"]


class TracingObserver(EngineObserver):
    """Exports a span tree per finished request.

    exporter: "none" (no spans unless `tracer_provider` is given), "console", or
    "otlp" (OTLP over HTTP to `otlp_endpoint`, e.g. http://collector:4318; the
    OTEL_EXPORTER_OTLP_* environment applies when it is None). A given
    `tracer_provider` (e.g. the SDK's, with an in-memory exporter) is used as is.
    operation: the default `gen_ai.operation.name`; a carrier's "gen_ai.operation.name"
    key overrides it per request (the server sets "chat" for chat completions).
    background: build spans on a worker thread (False: on the calling thread).
    """

    def __init__(self, model: str, replica_id: str = "", exporter: str = "none", otlp_endpoint: str | None = None,
                 tracer_provider: TracerProvider | None = None, operation: str = "text_completion",
                 background: bool = True, max_queued: int = 10_000, max_pending: int = 65_536,
                 build_interval: float = BUILD_INTERVAL, wake_rows: int = WAKE_ROWS):
        if exporter not in EXPORTERS:
            raise ValueError(f"tracing exporter must be one of {EXPORTERS}, got {exporter!r}")
        self.model = model
        self.replica_id = replica_id
        self.operation = operation
        self.max_queued = max_queued
        self.max_pending = max_pending
        self._owns_provider = tracer_provider is None
        if tracer_provider is None and exporter != "none":
            tracer_provider = TracerProvider(resource=Resource.create(
                {"service.name": "infersight", "service.instance.id": replica_id}))
            tracer_provider.add_span_processor(BatchSpanProcessor(_exporter(exporter, otlp_endpoint)))
        self.provider = tracer_provider
        self.enabled = tracer_provider is not None
        self._tracer = tracer_provider.get_tracer("infersight.engine") if tracer_provider else None
        self._ids: RecordTraceIds | None = None
        if isinstance(self._tracer, Tracer):  # the SDK's: let a root span reuse the record's trace id
            self._ids = self._tracer.id_generator = RecordTraceIds(self._tracer.id_generator)
        self._carriers: dict[str, dict] = {}  # request id -> caller's trace context, until it finishes
        self._background = background
        self.build_interval, self.wake_rows = build_interval, wake_rows
        # (record, carrier) pairs: the engine thread appends (atomic, no lock, no wake-up), the worker pops
        self._queue: deque = deque()
        self._wake = threading.Event()
        self._flushes: deque = deque()  # Events of flush() calls, set once everything queued before them is built
        self._stop = False
        self._worker: threading.Thread | None = None
        self._closed = False
        self.dropped_contexts = 0  # carriers of requests that never finished, evicted
        self.dropped_spans = 0  # span trees not built because the queue was full
        self.failures = 0  # span trees that failed to build (logged once)

    # -- hooks (engine thread) -----------------------------------------------------------

    def on_request_arrival(self, request_id, arrival_time, prompt_tokens, workload, trace_context) -> None:
        if trace_context:
            if len(self._carriers) >= self.max_pending:  # requests that never finish must not grow memory
                self._carriers.pop(next(iter(self._carriers)))
                self.dropped_contexts += 1
            self._carriers[request_id] = trace_context

    def on_request_finished(self, r: RequestRecord) -> None:
        carrier = self._carriers.pop(r.request_id, None) or {}
        if not self._background:
            self._build(r, carrier)
        elif self._closed or len(self._queue) >= self.max_queued:
            self.dropped_spans += 1
        else:
            if self._worker is None:
                self._worker = threading.Thread(target=self._run, name="infersight-tracing", daemon=True)
                self._worker.start()
            self._queue.append((r, carrier))
            if len(self._queue) >= self.wake_rows:
                self._wake.set()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued request has its spans handed to the exporter, then flush the exporter."""
        done = True
        if self._worker is not None and self._worker.is_alive():
            marker = threading.Event()
            self._flushes.append(marker)
            self._wake.set()
            done = marker.wait(timeout)
        if self.provider is not None:
            self.provider.force_flush(int(timeout * 1000))
        return done

    def close(self) -> None:
        if self.provider is None or self._closed:
            return
        self.flush()
        self._closed = True
        if self._worker is not None:
            self._stop = True
            self._wake.set()
            self._worker.join(timeout=10)
        if self._owns_provider:
            self.provider.shutdown()

    # -- worker ----------------------------------------------------------------------------

    def _run(self) -> None:
        pending = self._queue
        while True:
            self._wake.wait(self.build_interval)
            self._wake.clear()
            flushes = [self._flushes.popleft() for _ in range(len(self._flushes))]  # before the records they wait for
            for _ in range(len(pending)):
                self._build(*pending.popleft())
            for marker in flushes:
                marker.set()
            if self._stop:
                return

    def _build(self, r: RequestRecord, carrier: dict) -> None:
        try:
            build_span_tree(self._tracer, r, carrier, model=self.model, replica_id=self.replica_id,
                            operation=self.operation, ids=self._ids)
        except Exception:
            self.failures += 1
            if self.failures == 1:
                log.exception("building the spans of request %s failed (further failures counted only)",
                              getattr(r, "request_id", "?"))


def _exporter(kind: str, otlp_endpoint: str | None):
    if kind == "console":
        return ConsoleSpanExporter(service_name="infersight")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=traces_url(otlp_endpoint) if otlp_endpoint else None)


def traces_url(endpoint: str) -> str:
    """http://host:4318 -> http://host:4318/v1/traces (a full traces URL is kept as is)."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"OTLP endpoint must be an http(s) URL like http://localhost:4318, got {endpoint!r}")
    return endpoint if parts.path.strip("/") else endpoint.rstrip("/") + "/v1/traces"
