"""The OpenAI server's HTTP series, as vLLM exports them: `http_requests_total`, `http_request_duration_seconds`,
`http_request_duration_highr_seconds`, `http_request_size_bytes`, `http_response_size_bytes`.

vLLM gets them from prometheus-fastapi-instrumentator (vllm/entrypoints/serve/instrumentator/metrics.py);
so does a replica, with vLLM's excluded handlers, so that names, labels (`handler`, `method`, `status`
grouped as 2xx/4xx/5xx) and buckets are the same. They are measured by a middleware on the server's
event loop, not on the engine thread. Exported with vLLM's names (`serve --no-vllm-metrics` leaves them out).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

# what vLLM does not count (probes and the scrape itself)
EXCLUDED_HANDLERS = ["/metrics", "/health", "/load", "/ping", "/version", "/server_info"]


def instrument_http(app, registry: CollectorRegistry) -> None:
    """Count every request `app` (a FastAPI / Starlette app, not started yet) serves, on `registry`."""
    from prometheus_fastapi_instrumentator import Instrumentator

    Instrumentator(excluded_handlers=EXCLUDED_HANDLERS, registry=registry).add().instrument(app)
