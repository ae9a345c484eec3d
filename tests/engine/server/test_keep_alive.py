"""infersight's servers keep an idle connection open longer than httpx's pool keeps it (5 s).

The other order is a race: the server closes a connection at the moment the client sends its next
request on it, and that request fails with a reset (an httpx.ReadError in the flood test on CI).
"""

from __future__ import annotations

import http.client
import time

import httpx
import pytest

from engine.serving.server.background import BackgroundServer
from engine.serving.server.keep_alive import KEEP_ALIVE_SECONDS


async def _ok(scope, receive, send):
    assert scope["type"] == "http"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(scope="module")
def server():
    with BackgroundServer(_ok) as s:
        yield s


def test_the_default_outlasts_httpx_and_a_balancer():
    client_expiry = httpx.AsyncClient()._transport._pool._keepalive_expiry
    assert KEEP_ALIVE_SECONDS > max(client_expiry, 60.0)


def test_a_connection_idle_longer_than_httpx_keeps_one_is_still_served(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("GET", "/")
        assert conn.getresponse().read() == b"ok"
        first_socket = conn.sock
        time.sleep(5.5)  # past uvicorn's own default (5 s), which closed it here
        conn.request("GET", "/")  # http.client reuses the socket; a server that closed it fails this
        assert conn.getresponse().read() == b"ok"
        assert conn.sock is first_socket
    finally:
        conn.close()
