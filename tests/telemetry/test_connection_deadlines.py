"""Every way a client can stop short is cut off; every complete request is served (telemetry/connections.py).

The guarded protocol in front of a small ASGI app that reads the whole body and answers its length,
in this process. Generated clients: a request (head and a body of any size) sent up to any byte,
in pieces with short pauses, then silence or a header trickle that never ends. A client that sent
everything gets its 200; any other is closed by the server, with a 408 when it had sent part of a
request. The deadlines are short (header 2 s, body 1 s); each wait for the server has a generous
deadline of its own, and nothing asserts how soon the server acted.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
import uvicorn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hostile_clients import read_response, status_of

from engine.util import free_port
from telemetry.connections import guarded_protocol

HEADER_TIMEOUT, BODY_TIMEOUT = 2.0, 1.0


async def echo_length(scope, receive, send):
    size, more = 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    body = str(size).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def server():
    drops: list[str] = []
    port = free_port()
    protocol = guarded_protocol(HEADER_TIMEOUT, 64, drops.append, body_timeout=BODY_TIMEOUT)
    uv = uvicorn.Server(uvicorn.Config(echo_length, host="127.0.0.1", port=port, lifespan="off", log_level="error",
                                       http=protocol))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not uv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    yield port, drops
    uv.should_exit = True
    thread.join(30)


def _request(body: bytes) -> tuple[bytes, int]:
    head = (b"POST /x HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/octet-stream\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body))
    return head + body, len(head)


def _closed_by_server(sock: socket.socket, timeout: float = 60) -> bytes | None:
    """What the server sent before closing (None: still open after `timeout` seconds)."""
    sock.settimeout(timeout)
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except (TimeoutError, socket.timeout):
        return None
    except ConnectionResetError:
        pass
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.binary(max_size=300), cut=st.floats(0, 1), pieces=st.integers(1, 4),
       pause=st.floats(0, 0.05), trickle=st.booleans())
def test_a_client_that_stops_short_is_cut_off_and_a_complete_one_served(server, body, cut, pieces, pause, trickle):
    port, drops = server
    data, head_size = _request(body)
    sent = round(cut * len(data))
    line_end = data.rfind(b"\r\n", 0, sent)
    trickle = trickle and sent < head_size and line_end > 0
    if trickle:  # stop at a line's end, then trickle a header that never ends
        sent = line_end + 2
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        step = max(1, -(-sent // pieces))
        for start in range(0, sent, step):
            sock.sendall(data[start:start + step])
            time.sleep(pause)
        if sent == len(data):
            response = read_response(sock, 60)
            assert status_of(response) == 200 and response.endswith(str(len(body)).encode())
            return
        if trickle:
            sock.sendall(b"X-Slow: ")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    sock.sendall(b"a")
                except (BrokenPipeError, ConnectionResetError):
                    break
                sock.settimeout(0.2)
                try:
                    if sock.recv(65536, socket.MSG_PEEK) is not None:
                        break
                except (TimeoutError, socket.timeout):
                    continue
                except ConnectionResetError:
                    break
        answer = _closed_by_server(sock)
    assert answer is not None, f"a client that sent {sent} of {len(data)} bytes is still connected"
    if sent == 0:
        assert answer == b""  # nothing came: closed without a word
    else:
        assert status_of(answer) == 408
    assert drops  # counted
