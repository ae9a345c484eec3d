"""How a request ended, for availability: the fixed vocabulary of `requests.error_code` and the outcome
each code means.

Every request a replica or a recording proxy received is a `requests` row, answered or not. The engine
writes the rows of the requests it took (answered, aborted by the client, failed in the engine); the
HTTP layer writes the rows of those it refused before the engine had them (engine/serving/server/rejections.py,
engine/serving/proxy/rejections.py). `error_code` says why a request was not answered, in these words only:
API error codes (OpenAI's, vLLM's, ours) are many and grow, so each writer maps its own onto these
(`code_for`), keeps the API's own code in `error_detail_json`, and readers group by these.

Outcomes: answered (a 200 with the model's answer), rejected (the request could not be served as sent:
400 / 401 / 409 / 413), shed (the replica refused it for lack of room: 429, or 503 while it cannot
serve), failed (the engine or the upstream failed it: 5xx, or an in-band stream error), timed_out (504), and
aborted (the client went away, 499, or its request stopped arriving, 408).
"""

from __future__ import annotations

ANSWERED, REJECTED, SHED, FAILED, TIMED_OUT, ABORTED = "answered", "rejected", "shed", "failed", "timed_out", "aborted"
OUTCOMES = (ANSWERED, REJECTED, SHED, FAILED, TIMED_OUT, ABORTED)

# error_code -> outcome; "" is an answered request
ERROR_CODES: dict[str, str] = {
    "invalid_request": REJECTED,  # 400 (404 for an unknown model): a field is invalid (error_param names it)
    "context_length": REJECTED,  # 400: the prompt (and max_tokens) longer than the context (detail: length, limit)
    "unauthorized": REJECTED,  # 401: missing or wrong API key
    "duplicate_request_id": REJECTED,  # 409: a request with this id is in flight
    "body_too_large": REJECTED,  # 413
    "queue_full": SHED,  # 429: the running batch and the queue are full (detail: the queue's state)
    "unavailable": SHED,  # 503: shutting down, or the engine is dead
    "timeout": TIMED_OUT,  # 504: the upstream's answer came too late
    "client_abort": ABORTED,  # 499: the client went away before the answer
    # 408: the client's request stopped arriving (a body deadline closed its connection): the client's doing, as an
    # abort is, so one slow client never gets a healthy replica named
    "client_timeout": ABORTED,
    "engine_error": FAILED,  # 500 (or an in-band stream error): the engine failed the request
    "internal_error": FAILED,  # 500: the server failed outside the engine
    "upstream_error": FAILED,  # a recording proxy: the upstream answered 5xx, or could not be reached
}

# the API codes that are not plain validation errors (any other 400 is invalid_request)
_API_CODES = {"context_length_exceeded": "context_length", "body_too_large": "body_too_large",
              "duplicate_request_id": "duplicate_request_id", "invalid_api_key": "unauthorized",
              "queue_full": "queue_full"}
_STATUS_CODES = {401: "unauthorized", 403: "unauthorized", 408: "client_timeout", 409: "duplicate_request_id",
                 413: "body_too_large", 429: "queue_full", 499: "client_abort", 503: "unavailable", 504: "timeout"}
# how vLLM (and OpenAI) word a context-length refusal, which vLLM sends as a plain 400; and how an engine words
# the limits below the context that its configuration sets (a prompt longer than the batch budget with chunked
# prefill off, or than the whole KV cache), refused as plainly: a length refusal under another key
_LENGTH_WORDS = ("maximum context length", "context length", "max_model_len", "max_num_batched_tokens",
                 "whole kv cache")


def code_for(status: int, api_code: str | None = None, message: str = "", upstream: bool = False) -> str:
    """The error_code of a refused or failed request: from the HTTP status and the API's own code (and its
    message, for servers that give no code); `upstream`: a proxy's upstream answered it."""
    if status < 400:
        return ""
    if api_code in _API_CODES:
        return _API_CODES[api_code]
    if status == 400 and any(w in message.lower() for w in _LENGTH_WORDS):
        return "context_length"
    if status in _STATUS_CODES:
        return _STATUS_CODES[status]
    if status >= 500:
        return "upstream_error" if upstream else "internal_error"
    return "invalid_request"


def outcome_of(error_code: str, finish_reason: str = "") -> str:
    """A row's outcome: its error code's, else its finish reason's (the engine's rows: an abort is the
    client's, an error the engine's)."""
    if error_code:
        return ERROR_CODES.get(error_code, FAILED)
    return {"abort": ABORTED, "error": FAILED}.get(finish_reason, ANSWERED)


def engine_error_code(finish_reason: str) -> str:
    """The error_code of a row the engine writes: client_abort, engine_error, or "" (answered)."""
    return {"abort": "client_abort", "error": "engine_error"}.get(finish_reason, "")


def outcome_sql(error_code: str = "error_code", finish_reason: str = "finish_reason") -> str:
    """`outcome_of` as a ClickHouse expression over a row's columns (the diagnostics and the dashboards group
    by it; tests/telemetry/test_outcomes.py holds the two equal)."""
    codes = sorted(ERROR_CODES)
    return (f"if({error_code} != '', transform({error_code}, {codes!r}, {[ERROR_CODES[c] for c in codes]!r}, "
            f"'{FAILED}'), multiIf({finish_reason} = 'abort', '{ABORTED}', {finish_reason} = 'error', '{FAILED}', "
            f"'{ANSWERED}'))")


# the rows of requests the engine had (answered, aborted, failed in it): the latency aggregates' rows; a
# refused request's row has no latency to speak of (its e2e is the refusal's microseconds)
ENGINE_HAD_SQL = "error_code IN ('', 'client_abort', 'engine_error')"


def outcome_counts_sql() -> str:
    """`countIf(<outcome>) AS <outcome>` for each outcome, as the reports' availability columns."""
    expr = outcome_sql()
    return ", ".join(f"countIf({expr} = '{o}') AS {o}" for o in OUTCOMES)
