"""Can this process listen on host:port? Asked before the weights load, so a port in use fails at once.

uvicorn binds only after the model is loaded; a port someone else holds would otherwise cost the whole
load and end in uvicorn's bind error. The check binds as uvicorn will (SO_REUSEADDR, so a port left in
TIME_WAIT by a previous run is not "in use") and lets go at once; a port taken in the moment between
this check and uvicorn's bind still fails there.
"""

from __future__ import annotations

import socket


def cannot_listen(host: str, port: int) -> str | None:
    """Why `host:port` cannot be listened on (the OS's reason), None when it can (port 0: any free one)."""
    if port == 0:
        return None
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        return f"cannot resolve {host!r} ({e.strerror})"
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(address)
            except OSError as e:
                return (e.strerror or str(e)).lower()
    return None
