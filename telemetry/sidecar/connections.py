"""Connections that cannot hold the server: a deadline for each request's headers, a cap on sockets.

uvicorn has neither (its issue #157 asks for a request-start timeout; never built): its
keep-alive timer runs only between requests and every received byte cancels it, and its
`limit_concurrency` counts open sockets, so ~1,000 sockets that never finish their headers turned
every request, the replicas' inserts included, into a 503. This h11 protocol (uvicorn's own,
subclassed) closes a connection whose request line and headers are not complete
`header_timeout` seconds after it opened (or after the first byte of a kept-alive
connection's next request), however slowly the bytes trickle in; and past `max_connections` it
closes the connection that has waited longest for its request, so a client that sends a request
always gets a socket.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

_TIMEOUT_BODY = b"the request headers did not arrive in time\n"
_TIMEOUT_RESPONSE = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
                     b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_TIMEOUT_BODY), _TIMEOUT_BODY))


def guarded_protocol(header_timeout: float, max_connections: int,
                     on_drop: Callable[[str], None] = lambda reason: None) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the two bounds; pass it as `uvicorn.Config(http=...)`.
    `on_drop(reason)` counts each connection closed by them ("header_timeout", "too_many_connections")."""

    class GuardedH11Protocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None
        _dropped = False
        _waiting_since = 0.0

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._waiting_since = time.monotonic()
            self._arm()
            if len(self.connections) > max_connections:
                self._make_room()

        def data_received(self, data: bytes) -> None:
            if self._deadline is None and self._waiting():
                self._arm()  # the first byte of a kept-alive connection's next request
            super().data_received(data)
            if not self._waiting():
                self._disarm()  # headers complete: the app and the receive timeout take over

        def on_response_complete(self) -> None:
            self._waiting_since = time.monotonic()
            super().on_response_complete()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _waiting(self) -> bool:
            """True while no request's headers have arrived (new, idle or half-open connection)."""
            return self.conn.their_state is h11.IDLE

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(header_timeout, self._header_timeout)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _header_timeout(self) -> None:
            self._deadline = None
            if self._waiting():
                self._drop("header_timeout")

        def _make_room(self) -> None:
            waiting = [c for c in self.connections
                       if isinstance(c, GuardedH11Protocol) and not c._dropped and c._waiting()]
            oldest = min(waiting, key=lambda c: c._waiting_since, default=self)
            oldest._drop("too_many_connections")

        def _drop(self, reason: str) -> None:
            if self._dropped:
                return
            self._dropped = True
            self._disarm()
            if reason == "header_timeout" and self.conn.trailing_data[0]:  # part of a request came: say why
                self.transport.write(_TIMEOUT_RESPONSE)
            self.transport.close()
            on_drop(reason)

    return GuardedH11Protocol
