"""Every request gets an id (the client's `X-Request-Id`, or a new one) and every response echoes it.

A pure ASGI middleware (not BaseHTTPMiddleware) so streaming responses and
client-disconnect detection pass through untouched.
"""

from __future__ import annotations

import uuid

_HEADER = b"x-request-id"


class RequestIdMiddleware:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = list(scope.get("headers", []))
        request_id = next((v for k, v in headers if k.lower() == _HEADER), None)
        if request_id is None:
            # the handlers read the id from the headers: inject the one we made
            request_id = uuid.uuid4().hex.encode()
            scope = dict(scope, headers=headers + [(_HEADER, request_id)])

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                message = dict(message, headers=list(message.get("headers", [])) + [(_HEADER, request_id)])
            await send(message)

        await self.app(scope, receive, send_with_id)
