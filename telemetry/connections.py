"""Connections that cannot hold a server: deadlines for a request's headers and body, a cap on sockets.

One mechanism for infersight's three HTTP servers (the sidecar, a replica's `infersight serve`,
the recording proxy), all uvicorn. uvicorn has none of these bounds (its issue #157 asks for a
request-start timeout; never built): its keep-alive timer runs only between requests and every
received byte cancels it, and its `limit_concurrency` counts open sockets, so ~1,000 sockets that
never finish their headers turned every request, the replicas' inserts included, into a 503.

This h11 protocol (uvicorn's own, subclassed)
- closes a connection whose request line and headers are not complete `header_timeout` seconds
  after it opened (or after the first byte of a kept-alive connection's next request), however
  slowly the bytes trickle in (408 when part of a request came);
- with `body_timeout`, closes a connection whose request body stops arriving for that long
  (408 when no response has started): a gap, as ClickHouse's receive_timeout. Not while the
  server itself holds the body back (the app has not read what came, flow control paused the
  socket) or while the client waits for a `100 Continue` the app has not sent yet;
- past `max_connections`, closes the connection that has waited longest for its request (idle
  kept-alive ones included), so a client that sends a request always gets a socket.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import resource
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)


def _timeout_response(what: str) -> bytes:
    body = f"the request {what} did not arrive in time\n".encode()
    return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))


_HEADER_TIMEOUT_RESPONSE, _BODY_TIMEOUT_RESPONSE = _timeout_response("headers"), _timeout_response("body")
# the request's ASGI scope state: which bound closed its connection ("body_timeout"), so the app, which sees only a
# disconnect, records the request as what the client got (408). A connection closed before its headers were
# complete carried no request (no route, no id): it is counted by the bound's on_drop, not a row.
CLOSED_BY = "infersight_closed_by"


@dataclass(frozen=True)
class ConnectionLimits:
    """The bounds of `guarded_protocol`, as `infersight serve` and `infersight proxy` take them."""

    header_timeout_seconds: float = 10
    body_timeout_seconds: float = 30
    max_connections: int = 4096

    def __post_init__(self):
        if self.header_timeout_seconds <= 0 or self.body_timeout_seconds <= 0:
            raise ValueError("the header and body timeouts must be > 0")
        if self.max_connections < 1:
            raise ValueError("max_connections must be at least 1")

    def protocol(self, on_drop: Callable[[str], None] = lambda reason: None) -> type[H11Protocol]:
        return guarded_protocol(self.header_timeout_seconds, self.max_connections, on_drop,
                                body_timeout=self.body_timeout_seconds)


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    """--header-timeout, --body-timeout, --max-connections (the sidecar's names and defaults)."""
    d = ConnectionLimits()
    parser.add_argument("--header-timeout", type=float, default=d.header_timeout_seconds, metavar="SECONDS",
                        help="a request's line and headers must be complete this long after its connection opened "
                             "(or after the first byte of a kept-alive connection's next request), however slowly "
                             "they trickle: else 408 and closed (default: %(default)s)")
    parser.add_argument("--body-timeout", type=float, default=d.body_timeout_seconds, metavar="SECONDS",
                        help="a request body may pause at most this long: else 408 and closed (default: %(default)s)")
    parser.add_argument("--max-connections", type=int, default=d.max_connections, metavar="N",
                        help="open client connections; past it the one waiting longest for its request (idle "
                             "kept-alive ones included) is closed (default: %(default)s)")


def connection_limits_from_args(args) -> ConnectionLimits:
    return ConnectionLimits(args.header_timeout, args.body_timeout, args.max_connections)


def raise_open_files_limit(wanted: int) -> None:
    """Sockets share the process's descriptor limit with everything else: lift the soft limit towards the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    if soft != resource.RLIM_INFINITY and soft < wanted:
        log.warning("open files limit %d is below the %d that --max-connections needs", soft, wanted)


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: any free port; read it back from getsockname())."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


def guarded_protocol(header_timeout: float, max_connections: int,
                     on_drop: Callable[[str], None] = lambda reason: None,
                     body_timeout: float | None = None) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the bounds; pass it as `uvicorn.Config(http=...)`. `on_drop(reason)`
    counts each connection closed by them ("header_timeout", "body_timeout", "too_many_connections").
    `body_timeout` None: the app reads the body under its own deadline (the sidecar answers in
    ClickHouse's format)."""

    class GuardedH11Protocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None
        _body_deadline: asyncio.TimerHandle | None = None
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
                self._disarm()  # headers complete: the app (and the body deadline) take over
            if body_timeout is not None:
                if self._sending_body():
                    self._arm_body()  # a gap counts from the last byte that came
                else:
                    self._disarm_body()

        def on_response_complete(self) -> None:
            self._waiting_since = time.monotonic()
            super().on_response_complete()

        def connection_lost(self, exc) -> None:
            self._disarm()
            self._disarm_body()
            super().connection_lost(exc)

        def _waiting(self) -> bool:
            """True while no request's headers have arrived (new, idle or half-open connection)."""
            return self.conn.their_state is h11.IDLE

        def _sending_body(self) -> bool:
            return self.conn.their_state is h11.SEND_BODY

        def _arm(self) -> None:
            _cancel(self._deadline)
            self._deadline = self.loop.call_later(header_timeout, self._header_timeout)

        def _disarm(self) -> None:
            self._deadline = _cancel(self._deadline)

        def _arm_body(self) -> None:
            _cancel(self._body_deadline)
            self._body_deadline = self.loop.call_later(body_timeout, self._body_timeout)

        def _disarm_body(self) -> None:
            self._body_deadline = _cancel(self._body_deadline)

        def _header_timeout(self) -> None:
            self._deadline = None
            if self._waiting():
                self._drop("header_timeout")

        def _body_timeout(self) -> None:
            self._body_deadline = None
            if not self._sending_body():
                return
            cycle = getattr(self, "cycle", None)
            if self.flow.read_paused or (cycle is not None and cycle.waiting_for_100_continue):
                self._arm_body()  # the server holds the body back, not the client
                return
            self._drop("body_timeout")

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
            self._disarm_body()
            if reason == "header_timeout" and self.conn.trailing_data[0]:  # part of a request came: say why
                self.transport.write(_HEADER_TIMEOUT_RESPONSE)
            elif reason == "body_timeout":
                cycle = getattr(self, "cycle", None)
                if cycle is not None:
                    cycle.scope.setdefault("state", {})[CLOSED_BY] = reason
                if cycle is None or not cycle.response_started:
                    self.transport.write(_BODY_TIMEOUT_RESPONSE)
            self.transport.close()
            on_drop(reason)

    return GuardedH11Protocol


def _cancel(timer: asyncio.TimerHandle | None) -> None:
    if timer is not None:
        timer.cancel()
