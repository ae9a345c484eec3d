"""The row of every generation request the server answers without the engine: one place.

The engine writes the rows of the requests it took (answered, aborted, failed in the engine). A
request refused before it got there — a 400 from validation or for its length, 401, 409, 413, a
429 when the queue is full, a 503 while the engine cannot serve, a 500 from the server itself —
would leave no trace in the store, so an operator could not tell a replica that refuses half its
traffic from one that gets half as much. This ASGI middleware watches the status of every
POST to a generation route and, for an error the engine did not record (`ENGINE_ROW` in the
request's scope state: generate_full sets it for a client abort and an engine failure), writes one
`requests` row through the engine's own observer (the Recorder, the metrics, tracing): its HTTP
status, the error code from telemetry/contract/outcomes.py, the field the 400 named, the numbers
the refusal noted (errors.note_detail: prompt length and limit, the queue's state), the workload
tag, the request and trace ids. The prompt's text is never in it: the message names the field and
the limit, not the content.

It sits inside RequestIdMiddleware (the id it records is the one the client gets back) and outside
everything that can refuse (the body limit, the routes, the error handlers).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid

from engine.serving.server.errors import ROW_DETAIL
from engine.serving.server.headers import WORKLOAD_HEADER, parse_traceparent
from telemetry.contract.derived import e2e_seconds
from telemetry.contract.hooks import replay_request
from telemetry.connections import CLOSED_BY
from telemetry.contract.outcomes import ABORTED, code_for, outcome_of
from telemetry.contract.records import RequestRecord

log = logging.getLogger(__name__)

GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")
ENGINE_ROW = "infersight_engine_row"  # scope state: the engine wrote (or will write) this request's row
MAX_ERROR_BODY = 16 << 10  # an error body is read up to here for its message, code and field
MAX_ID_CHARS, MAX_WORKLOAD_CHARS, MAX_MESSAGE_CHARS, MAX_PARAM_CHARS = 128, 64, 1000, 200
# the codes whose upstream messages state numbers, not the request's content
MESSAGE_KEPT = frozenset({"context_length", "queue_full", "unavailable", "timeout", "unauthorized", "body_too_large"})
_WORKLOAD = re.compile(r"^[A-Za-z0-9._:\-]{0,64}$")


def _header(scope, name: bytes) -> str:
    value = next((v for k, v in scope.get("headers", []) if k.lower() == name), b"")
    return value.decode("latin-1")


# vLLM: "This model's maximum context length is 96 tokens. However, your prompt contains [at least] 120 input
# tokens ..." (or "... contains 9000 characters ...", refused before tokenizing); infersight: "the prompt is 120
# tokens but this model's maximum context length is 96 tokens"
_LIMIT = re.compile(r"maximum context length is (\d+) tokens")
_PROMPT_TOKENS = re.compile(r"contains (?:at least )?(\d+) input tokens|request has (\d+) input tokens"
                            r"|\((\d+) in the messages|the prompt (?:is|has) (\d+) tokens|asks for (\d+) prompt")
# an engine's limit below the context: "without chunked prefill a prompt must fit in max_num_batched_tokens (64)"
_BATCH_LIMIT = re.compile(r"max_num_batched_tokens \((\d+)\)")
_PROMPT_CHARS = re.compile(r"contains (\d+) characters")


def length_numbers(message: str) -> dict:
    """A length refusal's numbers from its message: max_model_len (or max_num_batched_tokens), prompt_tokens (or
    prompt_chars)."""
    numbers = {}
    if m := _LIMIT.search(message):
        numbers["max_model_len"] = int(m.group(1))
    elif m := _BATCH_LIMIT.search(message):
        numbers["max_num_batched_tokens"] = int(m.group(1))
    if m := _PROMPT_TOKENS.search(message):
        numbers["prompt_tokens"] = int(next(g for g in m.groups() if g))
    elif m := _PROMPT_CHARS.search(message):
        numbers["prompt_chars"] = int(m.group(1))
    return numbers


def error_fields(body: bytes) -> dict:
    """OpenAI's {"error": {"message", "type", "param", "code"}} (FastAPI's {"detail": ...} too), or {}."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return {"message": body[:MAX_MESSAGE_CHARS].decode("utf-8", "replace")} if body else {}
    error = parsed.get("error", parsed) if isinstance(parsed, dict) else {}
    if not isinstance(error, dict):
        return {"message": str(error)}
    if "message" not in error and "detail" in error:
        error = {"message": str(error["detail"])}
    return error


def refused_record(scope, *, replica_id: str, model_name: str, status: int, body: bytes, arrival: float,
                   finish: float, request_id: str | None = None, upstream_status: int | None = None,
                   detail: dict | None = None) -> RequestRecord:
    """The row of a request answered `status` with error `body`, without the engine. A recording proxy
    passes `upstream_status` (0: the upstream could not be reached): the body is then the upstream's, kept
    whole in upstream_error_body (text: the Recorder stores it only where text is allowed), and the message
    only where its code says it quotes no input (engine/serving/proxy/refusals.py)."""
    error = error_fields(body)
    message = str(error.get("message") or "")[:MAX_MESSAGE_CHARS]
    api_code = error.get("code") if isinstance(error.get("code"), str) else None
    code = code_for(status, api_code, message, upstream=upstream_status is not None)
    detail = {**(scope.get("state", {}).get(ROW_DETAIL) or {}), **(detail or {})}
    if code == "context_length":  # the numbers its message states (the engine's own limits, vLLM's): the stratum
        detail = {**length_numbers(message), **detail}  # and the limit; what the caller counted wins
    if api_code:
        detail["api_code"] = api_code
    if isinstance(error.get("type"), str):
        detail["type"] = error["type"]
    if upstream_status is not None and code not in MESSAGE_KEPT:  # a validation error may quote the input
        message = f"the upstream answered {upstream_status}" + (f" ({error['type']})" if "type" in detail else "")
    workload = _header(scope, WORKLOAD_HEADER.lower().encode())
    traceparent = parse_traceparent(_header(scope, b"traceparent"))
    return RequestRecord(
        replica_id=replica_id,
        request_id=(request_id or _header(scope, b"x-request-id"))[:MAX_ID_CHARS] or uuid.uuid4().hex,
        trace_id=traceparent.split("-")[1] if traceparent else "", model_name=model_name,
        workload=workload if _WORKLOAD.match(workload) else "",  # an invalid tag is what the 400 is about
        arrival_time=arrival, scheduled_time=0.0, first_token_time=0.0, finish_time=finish,
        queue_seconds=0.0, prefill_seconds=0.0, ttft_seconds=0.0, e2e_seconds=e2e_seconds(arrival, finish),
        prompt_tokens=int(detail.get("prompt_tokens", 0)), output_tokens=0, cached_tokens=0,
        prompt_token_ids=[], output_token_ids=[], token_times=[], sampling_params_json="",
        finish_reason="abort" if outcome_of(code) == ABORTED else "error", error=message, http_status=status,
        error_code=code,
        error_param=str(error.get("param") or "")[:MAX_PARAM_CHARS],
        error_detail_json=json.dumps(detail, sort_keys=True, default=str),
        upstream_status=upstream_status or 0,
        upstream_error_body=body.decode("utf-8", "replace") if upstream_status is not None else "")


class RefusalRecorder:
    """ASGI middleware: the row of each generation request answered >= 400 that the engine did not record."""

    def __init__(self, app, *, observer, replica_id: str, model_name: str):
        self.app, self.observer = app, observer
        self.replica_id, self.model_name = replica_id, model_name
        self.recorded = 0
        self.failures = 0

    async def __call__(self, scope, receive, send):
        if (scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") not in GENERATION_PATHS
                or not getattr(self.observer, "enabled", False)):
            return await self.app(scope, receive, send)
        arrival = time.time()
        state = scope.setdefault("state", {})
        seen = {"status": 0, "recorded": False, "gone": False}
        body = bytearray()

        async def watched_receive():
            message = await receive()
            if message["type"] == "http.disconnect" and not seen["status"]:
                # the client left (or a body deadline closed it: 408) before its request was read: whatever the app
                # answers now (FastAPI: a 400 "error parsing the body") reaches nobody; the client's doing
                seen["gone"] = True
            return message

        def answered(status: int) -> int:
            if not seen["gone"]:
                return status
            return 408 if state.get(CLOSED_BY) == "body_timeout" else 499  # what the client got: its 408, or nothing

        async def watch(message):
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
            elif message["type"] == "http.response.body" and seen["status"] >= 400:
                if len(body) < MAX_ERROR_BODY:
                    body.extend(message.get("body", b"")[:MAX_ERROR_BODY - len(body)])
                if not message.get("more_body") and not state.get(ENGINE_ROW):
                    # recorded before its last byte goes out: the journal barrier outside (journal_barrier.py)
                    # makes it survive a kill -9 like any answered request's row
                    seen["recorded"] = True
                    self._record(scope, answered(seen["status"]), bytes(body), arrival)
            await send(message)

        status = 0
        try:
            await self.app(scope, watched_receive, watch)
            status = answered(seen["status"])
        except asyncio.CancelledError:  # before any answer: the client is gone
            status = seen["status"] or 499
            raise
        except BaseException:  # past every handler: Starlette answers it 500, outside us
            status = seen["status"] or 500
            raise
        finally:
            if status >= 400 and not state.get(ENGINE_ROW) and not seen["recorded"]:
                self._record(scope, status, bytes(body), arrival)

    def _record(self, scope, status: int, body: bytes, arrival: float) -> None:
        """Hand the row to the observer; never raises (telemetry never breaks serving)."""
        try:
            record = refused_record(scope, replica_id=self.replica_id, model_name=self.model_name, status=status,
                                    body=body, arrival=arrival, finish=time.time())
            replay_request(self.observer, record)
            self.recorded += 1
        except Exception:  # noqa: BLE001
            self.failures += 1
            if self.failures == 1:
                log.exception("cannot record a refused request (further failures only counted)")

