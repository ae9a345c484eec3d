"""What a request carries in its headers: request id, W3C trace context, workload tag."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from starlette.datastructures import Headers

from engine.serving.server.errors import APIError

# the API that made the request, for the request span's name (telemetry.tracing.OPERATION_KEY)
OPERATION_KEY = "gen_ai.operation.name"
REQUEST_ID_HEADER = "X-Request-Id"
WORKLOAD_HEADER = "X-Workload"

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
_WORKLOAD = re.compile(r"^[A-Za-z0-9._:\-]{0,64}$")
# W3C trace-context: version-traceid-parentid-flags, all lowercase hex, ids not all zero
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")


@dataclass(frozen=True)
class RequestContext:
    request_id: str
    workload: str
    # {"traceparent", "tracestate"} from the caller, or {"trace_id"} of a new trace; plus the operation
    trace_context: dict

    @property
    def trace_id(self) -> str:
        if "traceparent" in self.trace_context:
            return self.trace_context["traceparent"].split("-")[1]
        return self.trace_context["trace_id"]


def parse_traceparent(value: str | None) -> str | None:
    """A valid traceparent header, or None (per the W3C spec an invalid one is ignored)."""
    if not value:
        return None
    m = _TRACEPARENT.match(value.strip())
    if not m:
        return None
    version, trace_id, parent_id, _flags, rest = m.groups()
    if version == "ff" or (version == "00" and rest) or set(trace_id) == {"0"} or set(parent_id) == {"0"}:
        return None
    return value.strip()


def request_context(headers: Headers, operation: str) -> RequestContext:
    """The request's id, workload tag and trace context (a new trace when the caller sent none)."""
    request_id = headers.get(REQUEST_ID_HEADER)
    if request_id is None:
        request_id = uuid.uuid4().hex
    elif not _REQUEST_ID.match(request_id):
        raise APIError(f"{REQUEST_ID_HEADER} must be 1-128 characters of [A-Za-z0-9._:-], got {request_id[:40]!r}",
                       param=REQUEST_ID_HEADER, code="invalid_request_id")
    workload = headers.get(WORKLOAD_HEADER, "")
    if not _WORKLOAD.match(workload):
        raise APIError(f"{WORKLOAD_HEADER} must be at most 64 characters of [A-Za-z0-9._:-], got {workload[:40]!r}",
                       param=WORKLOAD_HEADER, code="invalid_workload")
    traceparent = parse_traceparent(headers.get("traceparent"))
    if traceparent:
        trace_context = {"traceparent": traceparent}
        if headers.get("tracestate"):
            trace_context["tracestate"] = headers["tracestate"]
    else:  # start a trace: the stored request and its span share this id
        trace_context = {"trace_id": uuid.uuid4().hex}
    trace_context[OPERATION_KEY] = operation
    return RequestContext(request_id, workload, trace_context)
