"""The request id vLLM's OpenAI server gives a request, which the plugin's `requests` rows carry.

vLLM takes the client's `X-Request-Id` header (else the body's `request_id`, else a random id) as
the base and names the engine request after the endpoint (vllm/entrypoints/openai/*/serving.py):
`/v1/completions` -> `cmpl-<base>-<prompt index>` (one engine request per prompt; the response's
`id` is `cmpl-<base>`), `/v1/chat/completions` -> `chatcmpl-<base>` (also the response's `id`).
A proxy that sets `X-Request-Id` can so name the row the plugin writes for the same request, and
`proxy_request_id` goes the other way: the id of the row `infersight proxy` wrote for an engine
request (engine/serving/proxy/request_row.py: the base, or `<base>-<index>` for a prompt of several).
"""

from __future__ import annotations

PREFIXES = {"/v1/completions": "cmpl", "/v1/chat/completions": "chatcmpl"}


def vllm_request_id(endpoint: str, base: str, prompt_index: int = 0) -> str:
    """The id of the plugin's row for a request sent to `endpoint` with `X-Request-Id: base`."""
    if endpoint not in PREFIXES:
        raise ValueError(f"unknown endpoint {endpoint!r}; known: {sorted(PREFIXES)}")
    if endpoint == "/v1/completions":
        return f"cmpl-{base}-{prompt_index}"
    return f"chatcmpl-{base}"


def proxy_request_id(engine_request_id: str) -> str:
    """The id of the proxy's `requests` row for vLLM's engine request `engine_request_id`:
    `cmpl-<base>-0` -> base, `cmpl-<base>-k` -> `<base>-k` (one row per prompt of a list),
    `chatcmpl-<base>` -> base; an id of no known form is its own (the offline `LLM`'s "0", "1" ...)."""
    if engine_request_id.startswith("chatcmpl-"):
        return engine_request_id[len("chatcmpl-"):]
    if engine_request_id.startswith("cmpl-"):
        base, dash, index = engine_request_id[len("cmpl-"):].rpartition("-")
        if dash and base and index.isdigit():
            return base if index == "0" else f"{base}-{index}"
    return engine_request_id
