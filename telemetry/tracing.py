"""TracingObserver: one OpenTelemetry span per request, with queue / prefill / decode children.

Spans are built after the fact, from the RequestRecord's timestamps, when the
request finishes: nothing stays open on the engine thread, and a request costs
four span objects handed to a batch processor (exported on its own thread).

Attribute names follow the OpenTelemetry GenAI semantic conventions
(`gen_ai.*`); ours are under `infersight.*`. A caller's W3C `traceparent`
(the `trace_context` carrier given to `on_request_arrival`) makes the request
span a child of the caller's span, so its trace id is the one the RequestRecord
carries. Without one, the span takes the record's own trace id when it has one.
"""

from __future__ import annotations

import json
import logging
import threading
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Tracer, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from engine.observer import EngineObserver
from telemetry.records import RequestRecord

log = logging.getLogger(__name__)

SYSTEM = "infersight"
EXPORTERS = ("none", "console", "otlp")
# optional carrier key: the API that made the request ("chat" | "text_completion"), set by the server
OPERATION_KEY = "gen_ai.operation.name"
_PROPAGATOR = TraceContextTextMapPropagator()


class TracingObserver(EngineObserver):
    """Exports a span tree per finished request.

    exporter: "none" (no spans unless `tracer_provider` is given), "console", or
    "otlp" (OTLP over HTTP to `otlp_endpoint`, e.g. http://collector:4318; the
    OTEL_EXPORTER_OTLP_* environment applies when it is None). A given
    `tracer_provider` (e.g. the SDK's, with an in-memory exporter) is used as is.
    """

    def __init__(self, model: str, replica_id: str = "", exporter: str = "none", otlp_endpoint: str | None = None,
                 tracer_provider: TracerProvider | None = None, operation: str = "text_completion",
                 max_pending: int = 65536):
        if exporter not in EXPORTERS:
            raise ValueError(f"tracing exporter must be one of {EXPORTERS}, got {exporter!r}")
        self.model = model
        self.replica_id = replica_id
        self.operation = operation
        self.max_pending = max_pending
        self._owns_provider = tracer_provider is None
        if tracer_provider is None and exporter != "none":
            tracer_provider = TracerProvider(resource=Resource.create(
                {"service.name": "infersight", "service.instance.id": replica_id}))
            tracer_provider.add_span_processor(BatchSpanProcessor(_exporter(exporter, otlp_endpoint)))
        self.provider = tracer_provider
        self.enabled = tracer_provider is not None
        self._tracer = tracer_provider.get_tracer("infersight.engine") if tracer_provider else None
        self._ids: _RecordTraceIds | None = None
        if isinstance(self._tracer, Tracer):  # the SDK's: let a root span reuse the record's trace id
            self._ids = self._tracer.id_generator = _RecordTraceIds(self._tracer.id_generator)
        self._closed = False
        self._carriers: dict[str, dict] = {}  # request id -> caller's trace context, until it finishes
        self.dropped_contexts = 0

    # -- hooks -------------------------------------------------------------------------

    def on_request_arrival(self, request_id, arrival_time, prompt_tokens, workload, trace_context) -> None:
        if trace_context:
            if len(self._carriers) >= self.max_pending:  # requests that never finish must not grow memory
                self._carriers.pop(next(iter(self._carriers)))
                self.dropped_contexts += 1
            self._carriers[request_id] = trace_context

    def on_request_finished(self, r: RequestRecord) -> None:
        carrier = self._carriers.pop(r.request_id, None) or {}
        parent = _PROPAGATOR.extract(carrier) if carrier else Context()
        operation = carrier.get(OPERATION_KEY) or self.operation
        if self._ids is not None and not trace.get_current_span(parent).get_span_context().is_valid:
            self._ids.next_trace_id(r.trace_id)
        root = self._tracer.start_span(
            f"{operation} {self.model}", context=parent, kind=SpanKind.INTERNAL,
            attributes=request_attributes(r, operation, self.model, self.replica_id), start_time=_ns(r.arrival_time))
        if r.finish_reason == "error":
            root.set_status(Status(StatusCode.ERROR, r.error or "error"))
            root.set_attribute("error.type", (r.error.split(":", 1)[0].strip() or "_OTHER")[:100])
        in_root = trace.set_span_in_context(root, parent)
        for name, start, end, attributes in phases(r):
            self._tracer.start_span(name, context=in_root, start_time=_ns(start),
                                    attributes=attributes).end(end_time=_ns(end))
        root.end(end_time=_ns(r.finish_time))

    def close(self) -> None:
        if self.provider is None or self._closed:
            return
        self._closed = True
        if self._owns_provider:
            self.provider.shutdown()  # flushes the batch processor
        else:
            self.provider.force_flush()


def request_attributes(r: RequestRecord, operation: str, model: str, replica_id: str) -> dict:
    """The request span's attributes: GenAI semantic conventions, then ours."""
    attributes = {
        "gen_ai.operation.name": operation,
        "gen_ai.system": SYSTEM,
        "gen_ai.provider.name": SYSTEM,
        "gen_ai.request.model": model,
        "gen_ai.response.model": r.model_name or model,
        "gen_ai.response.id": r.request_id,
        "gen_ai.response.finish_reasons": [r.finish_reason],
        "gen_ai.usage.input_tokens": r.prompt_tokens,
        "gen_ai.usage.output_tokens": r.output_tokens,
        "infersight.replica.id": replica_id or r.replica_id,
        "infersight.workload": r.workload,
        "infersight.request.cached_tokens": r.cached_tokens,
        "infersight.request.preemptions": r.preemptions,
        "infersight.queue_seconds": r.queue_seconds,
        "infersight.prefill_seconds": r.prefill_seconds,
        "infersight.ttft_seconds": r.ttft_seconds,
        "infersight.e2e_seconds": r.e2e_seconds,
    }
    if r.spec_proposed:
        attributes["infersight.request.spec_proposed"] = r.spec_proposed
        attributes["infersight.request.spec_accepted"] = r.spec_accepted
    attributes.update(sampling_attributes(r.sampling_params_json))
    return attributes


def sampling_attributes(sampling_params_json: str) -> dict:
    """gen_ai.request.* from the record's SamplingParams JSON (unset or "off" values are left out)."""
    try:
        params = json.loads(sampling_params_json or "{}")
    except ValueError:
        return {}
    if not isinstance(params, dict):
        return {}
    out = {}
    for key, attribute in (("max_tokens", "gen_ai.request.max_tokens"), ("temperature", "gen_ai.request.temperature"),
                           ("top_p", "gen_ai.request.top_p"), ("seed", "gen_ai.request.seed")):
        if isinstance(params.get(key), (int, float)) and not isinstance(params.get(key), bool):
            out[attribute] = params[key]
    top_k = params.get("top_k")
    if isinstance(top_k, int) and top_k > 0:  # -1 means off
        out["gen_ai.request.top_k"] = top_k
    return out


def phases(r: RequestRecord) -> list[tuple[str, float, float, dict]]:
    """(name, start, end, attributes) of the child spans a request got as far as."""
    out = []
    queued_until = r.scheduled_time or r.finish_time
    out.append(("queue", r.arrival_time, queued_until, {}))
    if r.scheduled_time:
        prefill_end = r.first_token_time or r.finish_time
        out.append(("prefill", r.scheduled_time, prefill_end, {
            "gen_ai.usage.input_tokens": r.prompt_tokens, "infersight.request.cached_tokens": r.cached_tokens}))
    if r.first_token_time:
        out.append(("decode", r.first_token_time, r.finish_time, {"gen_ai.usage.output_tokens": r.output_tokens}))
    return out


class _RecordTraceIds(IdGenerator):
    """Hands out a given trace id for the next root span, random ids otherwise."""

    def __init__(self, inner: IdGenerator):
        self.inner = inner
        self._next = threading.local()

    def next_trace_id(self, trace_id_hex: str) -> None:
        try:
            value = int(trace_id_hex, 16) if len(trace_id_hex) == 32 else 0
        except ValueError:
            value = 0
        self._next.value = value

    def generate_trace_id(self) -> int:
        value = getattr(self._next, "value", 0)
        self._next.value = 0
        return value or self.inner.generate_trace_id()

    def generate_span_id(self) -> int:
        return self.inner.generate_span_id()


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


def _ns(epoch_seconds: float) -> int:
    return int(epoch_seconds * 1e9)
