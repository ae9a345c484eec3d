"""The sidecar's HTTP server: a minimal ASGI app (run by uvicorn) around `Sidecar`.

Routes: `/ping` and `/replicas_status` (liveness, as ClickHouse), `/metrics` (Prometheus),
`/` (queries and inserts, GET and POST, as ClickHouse's HTTP interface). Bodies (chunked or
not) are read up to a limit; chdb work runs in a bounded pool of worker threads.
"""

from __future__ import annotations

import logging
from urllib.parse import parse_qsl

import anyio
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from telemetry.sidecar import protocol as p
from telemetry.sidecar.handler import Response, Sidecar

log = logging.getLogger(__name__)


class SidecarApp:
    def __init__(self, sidecar: Sidecar, worker_threads: int = 16):
        self.sidecar = sidecar
        self.limiter = anyio.CapacityLimiter(worker_threads)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if path in ("/ping", "/replicas_status") or (path == "/" and method == "HEAD"):
            return await _send(send, Response(200, b"Ok.\n", {"Content-Type": "text/plain; charset=UTF-8"}))
        if path == "/metrics":
            body = await anyio.to_thread.run_sync(generate_latest, self.sidecar.metrics.registry, limiter=self.limiter)
            return await _send(send, Response(200, body, {"Content-Type": CONTENT_TYPE_LATEST}))
        if path not in ("/", "/query"):
            return await _send(send, _plain_error(404, f"There is no handle {path}", p.BAD_ARGUMENTS))
        if method not in ("GET", "POST"):
            return await _send(send, _plain_error(405, f"method {method} is not allowed", p.BAD_ARGUMENTS))
        body = await _read_body(receive, self.sidecar.max_body_bytes)
        if body is None:
            return await _send(send, _plain_error(
                413, f"request body exceeds the limit of {self.sidecar.max_body_bytes} bytes", p.BAD_ARGUMENTS))
        try:
            params = dict(parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True,
                                    encoding="utf-8", errors="strict"))
        except UnicodeDecodeError:
            return await _send(send, _plain_error(400, "the URL query string is not valid UTF-8", p.BAD_ARGUMENTS))
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        response = await anyio.to_thread.run_sync(self.sidecar.handle_query, method, params, headers, body,
                                                  limiter=self.limiter)
        await _send(send, response)


async def _read_body(receive, limit: int) -> bytes | None:
    """The whole body (chunked or not), or None as soon as it passes `limit` (the server then
    answers 413 and closes the connection without reading the rest)."""
    chunks, size, more = [], 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        more = message.get("more_body", False)
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _plain_error(status: int, message: str, code: int) -> Response:
    return Response(status, p.error_text(message, code).encode(),
                    {"X-ClickHouse-Exception-Code": str(code), "Content-Type": "text/plain; charset=UTF-8"})


async def _send(send, response: Response) -> None:
    headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers.items()]
    headers.append((b"content-length", str(len(response.body)).encode()))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body})
