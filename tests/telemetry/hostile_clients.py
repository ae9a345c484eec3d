"""Clients that misbehave on purpose, over raw loopback sockets: half-open connections, trickled
headers, stalled and oversized bodies, compression bombs. Every loop is bounded in count and time."""

from __future__ import annotations

import base64
import selectors
import socket
import time
import zlib

import lz4.frame

try:
    from compression import zstd
except ImportError:
    from backports import zstd

MiB = 1 << 20


def basic_auth(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def request_head(path: str = "/", headers: dict[str, str] | None = None, method: str = "POST") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in (headers or {}).items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def read_response(sock: socket.socket, timeout: float = 30) -> bytes:
    """What the server sends until it closes the connection or goes quiet for `timeout` seconds
    (b"" when it closed without a word)."""
    sock.settimeout(timeout)
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
            if b"\r\n\r\n" in out and _complete(out):
                break
    except (TimeoutError, ConnectionResetError):
        pass
    return out


def _complete(response: bytes) -> bool:
    head, _, body = response.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":", 1)[1])
    return False


def status_of(response: bytes) -> int | None:
    return int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/1.1 ") else None


def send_and_read(port: int, data: bytes, timeout: float = 30) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        return read_response(sock, timeout)


def ready(socks, timeout: float, write: bool = False) -> tuple[list, list]:
    """(readable, writable) among `socks` within `timeout` seconds. A selector (epoll), not select():
    a test process deep in the suite holds descriptors past select()'s FD_SETSIZE of 1024."""
    events = selectors.EVENT_READ | (selectors.EVENT_WRITE if write else 0)
    with selectors.DefaultSelector() as sel:
        for sock in socks:
            sel.register(sock, events)
        hits = sel.select(timeout)
    return ([k.fileobj for k, e in hits if e & selectors.EVENT_READ],
            [k.fileobj for k, e in hits if e & selectors.EVENT_WRITE])


def flood_body(port: int, head: bytes, block: bytes, total: int, timeout: float = 60) -> tuple[int, bytes]:
    """Send `head`, then `block` again and again (up to `total` bytes), stopping as soon as the
    server answers or stops reading. Returns (body bytes sent, the response)."""
    sent, pending, deadline = 0, memoryview(block), time.monotonic() + timeout
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head)
        sock.setblocking(False)
        while sent < total and time.monotonic() < deadline:
            readable, writable = ready([sock], 1, write=True)
            if readable:
                break
            if writable:
                try:
                    n = sock.send(pending)
                except BlockingIOError:
                    continue
                except (BrokenPipeError, ConnectionResetError):
                    break
                sent, pending = sent + n, pending[n:] or memoryview(block)
        sock.setblocking(True)
        return sent, read_response(sock, 30)


def trickle_headers(port: int, interval: float = 0.1, max_bytes: int = 600) -> tuple[int, bytes]:
    """A slowloris client: a request line, then one header byte every `interval` seconds, never
    finishing. Returns (header bytes sent, what the server answered when it cut us off)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        for sent in range(max_bytes):
            if ready([sock], interval)[0]:
                return sent, read_response(sock, 10)
            try:
                sock.send(b"a")
            except (BrokenPipeError, ConnectionResetError):
                return sent, b""
        return max_bytes, b""


def open_idle_sockets(port: int, n: int, partial_every: int = 2) -> list[socket.socket]:
    """`n` connections that never complete a request: every `partial_every`-th sends half a request."""
    socks = []
    for i in range(n):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        if i % partial_every == 0:
            sock.sendall(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        socks.append(sock)
    return socks


def wait_until_closed_by_server(socks: list[socket.socket], timeout: float = 60) -> list[socket.socket]:
    """The sockets the server has not closed within `timeout` seconds (ideally none)."""
    open_ = {s.fileno(): s for s in socks}
    deadline = time.monotonic() + timeout
    while open_ and time.monotonic() < deadline:
        readable, _ = ready(list(open_.values()), 1)
        for sock in readable:
            try:
                data = sock.recv(65536)
            except (ConnectionResetError, OSError):
                data = b""
            if not data or data.startswith(b"HTTP/1.1 408"):  # closed, or cut off with 408 then closed
                del open_[sock.fileno()]
    for sock in socks:
        sock.close()
    return list(open_.values())


def compression_bomb(encoding: str, inflated_bytes: int) -> bytes:
    """`inflated_bytes` of zeros, compressed (a few hundred times smaller, or much more)."""
    zeros, n = bytes(MiB), inflated_bytes // MiB
    if encoding == "gzip":
        c = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
        return b"".join(c.compress(zeros) for _ in range(n)) + c.flush()
    if encoding == "zstd":
        c = zstd.ZstdCompressor()
        return b"".join(c.compress(zeros) for _ in range(n)) + c.flush()
    if encoding == "lz4":
        c = lz4.frame.LZ4FrameCompressor()
        return c.begin() + b"".join(c.compress(zeros) for _ in range(n)) + c.flush()
    raise ValueError(encoding)


def peak_rss_bytes(pid: int) -> int:
    """The process's peak resident memory so far (VmHWM)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc status")
