"""Can this process listen on host:port? Asked first, so a port in use fails at once, in one line.

`serve` binds only after the model is loaded, the sidecar after opening and checking its store, the
proxy after its set-up: a port someone else holds would otherwise cost all of that and end in a bind
error among the noise of a shutdown. The check binds as uvicorn will (SO_REUSEADDR, so a port left in
TIME_WAIT by a previous run is not "in use") and lets go at once; a port taken in the moment between
this check and uvicorn's bind still fails there.
"""

from __future__ import annotations

import socket
import sys


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


def refuse_busy_port(command: str, host: str, port: int) -> bool:
    """Print `command`'s one-line refusal to stderr and return True when host:port cannot be listened on."""
    busy = cannot_listen(host, port)
    if busy is None:
        return False
    print(f"infersight {command}: cannot listen on {host}:{port}: {busy} (another server there? choose another "
          "--port)", file=sys.stderr)
    return True
