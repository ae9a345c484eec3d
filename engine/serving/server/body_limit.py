"""Refuse an oversized body up front, with a 413 in OpenAI's error format.

A body with a Content-Length over the limit is refused before any of it is
read. (A chunked body without one is still cut at the same limit by FastAPI's
own `max_body_size`, whose 413 is plain text.)
"""

from __future__ import annotations

import json


class BodyLimitMiddleware:
    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            length = next((v for k, v in scope.get("headers", []) if k == b"content-length"), None)
            if length is not None and length.isdigit() and int(length) > self.max_bytes:
                body = json.dumps({"error": {
                    "message": f"request body is {int(length)} bytes; the limit is {self.max_bytes}",
                    "type": "invalid_request_error", "param": None, "code": "body_too_large"}}).encode()
                await send({"type": "http.response.start", "status": 413,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)
