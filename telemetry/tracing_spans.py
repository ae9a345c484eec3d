"""Building one request's span tree from its finished RequestRecord (GenAI semantic conventions)."""

from __future__ import annotations

import functools
import json
import threading

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from telemetry.contract.derived import known
from telemetry.contract.records import RequestRecord

SYSTEM = "infersight"
# optional carrier key: the API that made the request ("chat" | "text_completion"), set by the server
OPERATION_KEY = "gen_ai.operation.name"
_PROPAGATOR = TraceContextTextMapPropagator()


def build_span_tree(tracer: Tracer, r: RequestRecord, carrier: dict, *, model: str, replica_id: str,
                    operation: str, ids: "RecordTraceIds | None" = None) -> None:
    """The request span (child of the carrier's traceparent, if any) and its queue / prefill / decode children."""
    parent = _PROPAGATOR.extract(carrier) if carrier else Context()
    operation = carrier.get(OPERATION_KEY) or operation
    if ids is not None and not trace.get_current_span(parent).get_span_context().is_valid:
        ids.next_trace_id(r.trace_id)
    root = tracer.start_span(f"{operation} {model}", context=parent, kind=SpanKind.INTERNAL,
                             attributes=request_attributes(r, operation, model, replica_id),
                             start_time=_ns(r.arrival_time))
    if r.finish_reason == "error":
        root.set_status(Status(StatusCode.ERROR, r.error or "error"))
        root.set_attribute("error.type", (r.error.split(":", 1)[0].strip() or "_OTHER")[:100])
    in_root = trace.set_span_in_context(root, parent)
    for name, start, end, attributes in phases(r):
        tracer.start_span(name, context=in_root, start_time=_ns(start), attributes=attributes).end(end_time=_ns(end))
    root.end(end_time=_ns(r.finish_time))


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
    }
    # a duration the writer could not measure (derived.UNKNOWN: a recording proxy's queue) is left out
    for name in ("queue_seconds", "prefill_seconds", "ttft_seconds", "e2e_seconds"):
        if known(getattr(r, name)):
            attributes[f"infersight.{name}"] = getattr(r, name)
    if r.spec_proposed:
        attributes["infersight.request.spec_proposed"] = r.spec_proposed
        attributes["infersight.request.spec_accepted"] = r.spec_accepted
    attributes.update(sampling_attributes(r.sampling_params_json))
    return attributes


def sampling_attributes(sampling_params_json: str) -> dict:
    """gen_ai.request.* from the record's SamplingParams JSON (unset or "off" values are left out)."""
    return dict(_sampling_attributes(sampling_params_json))


@functools.lru_cache(maxsize=256)  # a replica's requests mostly share a few parameter sets: parse each once
def _sampling_attributes(sampling_params_json: str) -> tuple:
    return tuple(_parse_sampling_attributes(sampling_params_json).items())


def _parse_sampling_attributes(sampling_params_json: str) -> dict:
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


class RecordTraceIds(IdGenerator):
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


def _ns(epoch_seconds: float) -> int:
    return int(epoch_seconds * 1e9)
