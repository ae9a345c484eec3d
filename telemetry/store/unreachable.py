"""Why a ClickHouse HTTP endpoint could not be reached, said plainly.

clickhouse-connect wraps urllib3's failure as "Error HTTPConnectionPool(host=..., port=...): Max retries
exceeded with url: /?query_id=... (Caused by NewConnectionError(...)) executing HTTP request attempt 1";
a person needs the URL and one of: connection refused, timed out, host not found, connection closed.
"""

from __future__ import annotations

import socket
import ssl
from http.client import RemoteDisconnected

from urllib3 import exceptions as u3

# (exception types anywhere in the failure's chain, what to say), the first match wins
_REASONS: tuple[tuple[tuple[type, ...], str], ...] = (
    ((ConnectionRefusedError,), "connection refused (is the store running, on that port?)"),
    ((u3.ConnectTimeoutError,), "timed out connecting"),
    ((u3.ReadTimeoutError, socket.timeout, TimeoutError), "timed out waiting for an answer"),
    ((u3.NameResolutionError, socket.gaierror), "host name not found"),
    ((u3.SSLError,), "TLS failed"),
    ((ConnectionResetError, RemoteDisconnected, u3.ProtocolError), "the connection was closed before an answer"),
)


def _chain(e: BaseException):
    seen: set[int] = set()
    todo = [e]
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        yield x
        linked = [x.__cause__, x.__context__, getattr(x, "reason", None), *getattr(x, "args", ())]
        todo += [a for a in linked if isinstance(a, BaseException)]  # ssl's `reason` is a str


def unreachable_reason(e: BaseException) -> str | None:
    """'connection refused', 'timed out connecting' ... for a transport failure; None when it is not one."""
    chain = list(_chain(e))
    tls = next((x for x in chain if isinstance(x, ssl.SSLError)), None)
    if tls is not None:  # its own words say which: an unverified certificate, a wrong host name ...
        return f"TLS failed ({getattr(tls, 'verify_message', '') or getattr(tls, 'reason', '') or tls})"
    for kinds, reason in _REASONS:
        if any(isinstance(x, kinds) for x in chain):
            return reason
    text = " ".join(str(x) for x in chain)
    if "Connection refused" in text:  # the errno survives only as text in some urllib3 versions
        return _REASONS[0][1]
    if "timed out" in text:
        return "timed out"
    return None
