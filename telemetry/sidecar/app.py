"""The sidecar's HTTP server: a minimal ASGI app (run by uvicorn) around `Sidecar`.

Routes: `/ping` and `/replicas_status` (liveness, as ClickHouse), `/health` (store damage, JSON),
`/metrics` (Prometheus), `/` (queries and inserts, GET and POST, as ClickHouse's HTTP interface).

Bounds (telemetry/sidecar/limits.py), checked as early as possible: credentials before any of
the body is read; a body's size while it arrives (INSERT data up to --max-body-mb, any other
statement up to max_statement_bytes), its decompressed size while it inflates (bodies.py), and
the gap between its chunks. chdb work runs in separate lanes (lanes.py): statements, inserts,
scrapes.
"""

from __future__ import annotations

import json
import logging
from urllib.parse import parse_qsl

import anyio
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from telemetry.sidecar import protocol as p
from telemetry.sidecar.bodies import BadEncoding, BodyTooLarge, decompress, peek
from telemetry.sidecar.handler import RequestError, Response, Sidecar, credentials
from telemetry.sidecar.lanes import Busy, Lanes
from telemetry.sidecar.limits import Limits
from telemetry.sidecar.statements import LOOKS_LIKE_INSERT

log = logging.getLogger(__name__)

TOO_MANY_SIMULTANEOUS_QUERIES = 202
SOCKET_TIMEOUT = 209
_TEXT = {"Content-Type": "text/plain; charset=UTF-8"}


class ClientGone(Exception):
    """The client disconnected before its body was complete: nothing of it may be run."""


class TooLarge(Exception):
    def __init__(self, limit: int):
        super().__init__(limit)
        self.limit = limit


class SidecarApp:
    def __init__(self, sidecar: Sidecar, limits: Limits = Limits(), health=None):
        self.sidecar, self.limits, self.health = sidecar, limits, health
        self.lanes = Lanes(limits)

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
            return await _send(send, Response(200, b"Ok.\n", dict(_TEXT)))
        try:
            if path == "/metrics":
                body = await self.lanes.run_scrape(generate_latest, self.sidecar.metrics.registry)
                return await _send(send, Response(200, body, {"Content-Type": CONTENT_TYPE_LATEST}))
            if path == "/health" and self.health is not None:
                return await _send(send, await self.lanes.run_scrape(self._health))
        except Busy as e:
            return await _send(send, self._busy(str(e), "scrapes_busy"))
        if path not in ("/", "/query"):
            return await _send(send, self._refuse(404, f"There is no handle {path}", p.BAD_ARGUMENTS))
        if method not in ("GET", "POST"):
            return await _send(send, self._refuse(405, f"method {method} is not allowed", p.BAD_ARGUMENTS))
        try:
            params = dict(parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True,
                                    encoding="utf-8", errors="strict"))
        except UnicodeDecodeError:
            return await _send(send, self._refuse(400, "the URL query string is not valid UTF-8", p.BAD_ARGUMENTS))
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            response = await self._query(method, params, headers, receive)
        except ClientGone:  # nobody to answer, and a partial body must not run (a partial insert would be stored)
            self.sidecar.metrics.reject("incomplete_body")
            return
        await _send(send, response)

    # queries and inserts ---------------------------------------------------------------------------

    async def _query(self, method: str, params: dict, headers: dict, receive) -> Response:
        try:  # who is asking decides what may follow: nothing of a stranger's body is read
            role = self.sidecar.users.role(*credentials(params, headers))
        except RequestError as e:
            return self._refuse(e.status, str(e), e.code)
        query, encoding = params.get("query", ""), headers.get("content-encoding", "")
        insert = bool(LOOKS_LIKE_INSERT.match(query.encode())) if query else None  # None: the body says
        ceiling = self.sidecar.max_body_bytes if role == "full" and insert is not False \
            else self.limits.max_statement_bytes
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > ceiling:
            return self._too_large(ceiling, insert)
        try:
            body, insert = await self._read_body(receive, role, insert, encoding)
        except TooLarge as e:
            return self._too_large(e.limit, insert)
        except TimeoutError:
            self.sidecar.metrics.reject("receive_timeout")
            return self._refuse(408, f"Timeout exceeded while reading the request body: no data for "
                                     f"{self.limits.receive_timeout_seconds:g} s", SOCKET_TIMEOUT, "SOCKET_TIMEOUT")
        try:
            if insert and role == "full":  # (the read-only user's INSERT is refused, in its own lane)
                return await self.lanes.run_insert(self._serve, method, params, headers, body, True)
            return await self.lanes.run_statement(role, self._serve, method, params, headers, body, False)
        except Busy as e:
            return self._busy(str(e), "inserts_busy" if insert and role == "full" else "queries_busy")

    async def _read_body(self, receive, role: str, insert: bool | None, encoding: str) -> tuple[bytes, bool]:
        """The whole body, and whether it is an INSERT. Raises TooLarge(limit) as soon as the
        body passes its limit (the rest is never read), TimeoutError when it stops arriving."""
        chunks, size, more = [], 0, True
        limit = self.limits.max_statement_bytes
        while more:
            with anyio.fail_after(self.limits.receive_timeout_seconds):
                message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunk = message.get("body", b"")
            more = message.get("more_body", False)
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                if insert is None:
                    insert = _starts_an_insert(chunks, encoding)
                if insert and role == "full" and limit < self.sidecar.max_body_bytes:
                    limit = self.sidecar.max_body_bytes  # INSERT data: the larger limit
                if size > limit:
                    raise TooLarge(limit)
        if insert is None:
            insert = _starts_an_insert(chunks, encoding)
        return b"".join(chunks), insert

    def _serve(self, method: str, params: dict, headers: dict, body: bytes, insert: bool) -> Response:
        """In a lane's thread: inflate the body (bounded), then ClickHouse semantics (handler.py)."""
        limit = self.sidecar.max_body_bytes if insert else self.limits.max_statement_bytes
        try:
            body = decompress(body, headers.pop("content-encoding", ""), limit)
        except BodyTooLarge:
            return self._too_large(limit, insert, decompressed=True)
        except BadEncoding as e:
            return self._refuse(400, str(e), p.BAD_ARGUMENTS)
        response = self.sidecar.handle_query(method, params, headers, body)
        code = response.headers.get("X-ClickHouse-Exception-Code", "")
        if self.health is not None and code.isdigit():
            self.health.on_error_code(int(code))
        return response

    # other routes and errors -----------------------------------------------------------------------

    def _health(self) -> Response:
        """damaged (store_health.py), else degraded while inserts are not being stored
        (write_health.py), else the store check's state; 503 unless sound."""
        status = self.health.status()
        status["writes"] = self.sidecar.writes.status()
        if status["status"] != "damaged" and status["writes"]["failing"]:
            status["status"] = "degraded"
            status["reason"] = f"inserts are not being stored: {status['writes']['reason']}"
        return Response(503 if status["status"] in ("damaged", "degraded") else 200,
                        json.dumps(status, indent=1).encode() + b"\n", {"Content-Type": "application/json"})

    def _busy(self, message: str, reason: str) -> Response:
        self.sidecar.metrics.reject(reason)
        response = self._refuse(503, message, TOO_MANY_SIMULTANEOUS_QUERIES, "TOO_MANY_SIMULTANEOUS_QUERIES")
        response.headers["Retry-After"] = "1"
        return response

    def _too_large(self, limit: int, insert: bool | None, decompressed: bool = False) -> Response:
        self.sidecar.metrics.reject("body_too_large")
        what = "INSERT data" if insert else "a statement (only INSERT data may be larger)"
        body = "decompressed body" if decompressed else "request body"
        return self._refuse(413, f"{body} exceeds the limit of {limit} bytes for {what}", p.BAD_ARGUMENTS)

    def _refuse(self, status: int, message: str, code: int, name: str | None = None) -> Response:
        self.sidecar.metrics.errors.labels(self.sidecar.metrics.name).inc()
        if name:  # a code protocol.py has no name for: write the ClickHouse text here
            message = f"Code: {code}. DB::Exception: {message}. ({name})"
        return Response(status, p.error_text(message, code).encode(),
                        {"X-ClickHouse-Exception-Code": str(code), **_TEXT})


def _starts_an_insert(chunks: list[bytes], encoding: str, head_bytes: int = 64 << 10) -> bool:
    """Whether the (decoded) body starts with INSERT; its first 64 KiB are plenty, compressed or not."""
    head, size = [], 0
    for chunk in chunks:
        if size >= head_bytes:
            break
        head.append(chunk)
        size += len(chunk)
    return bool(LOOKS_LIKE_INSERT.match(peek(b"".join(head)[:head_bytes], encoding)))


async def _send(send, response: Response) -> None:
    headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers.items()]
    headers.append((b"content-length", str(len(response.body)).encode()))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body})
