"""The row of a generation request the upstream refused or failed (or could not be reached for), as the
replica's own server writes it (engine/server/rejections.py builds both): the status the client got,
the upstream's status and its error body, the error code of telemetry/contract/outcomes.py, and for a
length refusal the prompt length and the limit as vLLM's message states them."""

from __future__ import annotations

import re

from engine.server.rejections import error_fields, refused_record

# vLLM: "This model's maximum context length is 96 tokens. However, your prompt contains [at least] 120 input
# tokens ..." (or "... contains 9000 characters ...", refused before tokenizing); infersight: "the prompt is 120
# tokens but this model's maximum context length is 96 tokens"
_LIMIT = re.compile(r"maximum context length is (\d+) tokens")
_PROMPT_TOKENS = re.compile(r"contains (?:at least )?(\d+) input tokens|request has (\d+) input tokens"
                            r"|\((\d+) in the messages|the prompt is (\d+) tokens|asks for (\d+) prompt")
_PROMPT_CHARS = re.compile(r"contains (\d+) characters")


def length_numbers(message: str) -> dict:
    """A length refusal's numbers from its message: max_model_len, prompt_tokens (or prompt_chars)."""
    numbers = {}
    if m := _LIMIT.search(message):
        numbers["max_model_len"] = int(m.group(1))
    if m := _PROMPT_TOKENS.search(message):
        numbers["prompt_tokens"] = int(next(g for g in m.groups() if g))
    elif m := _PROMPT_CHARS.search(message):
        numbers["prompt_chars"] = int(m.group(1))
    return numbers


def upstream_refusal(scope, *, replica_id: str, model_name: str, request_id: str, status: int, upstream_status: int,
                     body: bytes, arrival: float, finish: float):
    """The row of a request the proxy answered `status` because its upstream answered `upstream_status`
    (0: unreachable) with `body`."""
    message = str(error_fields(body).get("message") or "")
    return refused_record(scope, replica_id=replica_id, model_name=model_name, status=status, body=body,
                          arrival=arrival, finish=finish, request_id=request_id, upstream_status=upstream_status,
                          detail=length_numbers(message))
