"""Slow and idle clients cannot hold a replica's server or the recording proxy (telemetry/connections.py).

Real processes on loopback: `infersight serve` on the shipped reference model, `infersight proxy`
in front of it, each with short deadlines (--header-timeout 2, --body-timeout 2) and a small
--max-connections. Attacked over raw sockets: a slowloris of a few hundred sockets that keep
trickling header bytes (and are reopened when closed), a trickled request, a stalled body, more
idle sockets than the cap. Good requests must be served while the attack runs, and every socket
the attack holds must be closed by the server while it is still trickling. Bounded in count and
time; nothing here asserts how fast anything is.
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
from hostile_clients import open_idle_sockets, ready, request_head, send_and_read, status_of, \
    trickle_headers, wait_until_closed_by_server

from engine.serving.processes import infersight_command, process_ref, wait_healthy
from engine.util import free_port

pytestmark = pytest.mark.slow

MODEL = Path(__file__).resolve().parents[2] / "evals" / "reference" / "models" / "target"
MAX_CONNECTIONS = 128
GUARDS = ("--header-timeout", "2", "--body-timeout", "2", "--max-connections", str(MAX_CONNECTIONS))


class Server:
    def __init__(self, args: list[str], log_path: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(infersight_command(*args, "--port", str(self.port), *GUARDS),
                                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            wait_healthy(self.url, process_ref(self.process.pid), 180, log_path)
        except RuntimeError:
            self.stop()
            raise

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    logs = tmp_path_factory.mktemp("guard-logs")
    replica = Server(["serve", "--model", str(MODEL), "--threads", "1", "--log-level", "warning",
                      "--stats-interval", "0", "--no-access-log"], logs / "replica.log")
    try:
        proxy = Server(["proxy", "--upstream", replica.url, "--log-level", "warning"], logs / "proxy.log")
    except BaseException:
        replica.stop()
        raise
    yield {"replica": replica, "proxy": proxy}
    proxy.stop()
    replica.stop()


def good_request(server: Server) -> int:
    body = {"model": MODEL.name, "prompt": "The capital of France is", "max_tokens": 2, "temperature": 0}
    return httpx.post(server.url + "/v1/completions", json=body, timeout=120).status_code


class SlowLoris:
    """`n` sockets that each send a request line, then one header byte every `interval` seconds, never
    finishing their headers; a socket the server closes is replaced by a new one, so the attack holds
    `n` sockets for as long as it runs. Counts how many the server closed."""

    def __init__(self, port: int, n: int, interval: float = 0.5):
        self.port, self.interval = port, interval
        self.first = [self._open() for _ in range(n)]  # the first generation: each must be closed by the server
        self.live = list(self.first)
        self.closed_by_server: set[socket.socket] = set()
        self.opened = n
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _open(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        sock.setblocking(False)
        return sock

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            readable, _ = ready(self.live, 0)
            for sock in readable:  # the server answered (408) or closed: that socket is done
                self.closed_by_server.add(sock)
                self.live.remove(sock)
                sock.close()
                self.live.append(self._open())
                self.opened += 1
            for sock in self.live:
                try:
                    sock.send(b"a")
                except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                    pass  # seen as closed at the next round

    def running(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    def first_generation_closed(self) -> bool:
        return all(s in self.closed_by_server for s in self.first)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        for sock in self.live:
            sock.close()


@pytest.mark.parametrize("which", ["replica", "proxy"])
def test_a_slowloris_neither_holds_its_sockets_nor_blocks_good_requests(servers, which):
    server = servers[which]
    attack = SlowLoris(server.port, n=100)  # under the cap: only the header deadline can close them
    try:
        served_during_attack = []
        for _ in range(3):
            status = good_request(server)
            assert attack.running()
            served_during_attack.append(status)
        assert served_during_attack == [200, 200, 200]
        deadline = time.monotonic() + 120  # generous: a busy machine; the header deadline is 2 s
        while not attack.first_generation_closed() and time.monotonic() < deadline:
            time.sleep(0.5)
        still_open = [s for s in attack.first if s not in attack.closed_by_server]
        assert still_open == [], f"{len(still_open)} trickling sockets still held by the {which}"
        assert attack.running() and attack.opened > 100  # closed while they kept trickling; the attack went on
        assert good_request(server) == 200
    finally:
        attack.stop()


@pytest.mark.parametrize("which", ["replica", "proxy"])
def test_more_sockets_than_the_cap_cannot_lock_out_a_client(servers, which):
    server = servers[which]
    idle = open_idle_sockets(server.port, 3 * MAX_CONNECTIONS)  # far more than --max-connections
    try:
        assert good_request(server) == 200
    finally:
        still_open = wait_until_closed_by_server(idle, timeout=120)
    assert still_open == []
    assert good_request(server) == 200


@pytest.mark.parametrize("which", ["replica", "proxy"])
def test_a_trickled_request_is_cut_off_at_the_header_deadline(servers, which):
    sent, response = trickle_headers(servers[which].port, interval=0.1, max_bytes=1200)
    assert sent < 1200  # it kept sending bytes, and was cut off all the same
    assert status_of(response) == 408


@pytest.mark.parametrize("which", ["replica", "proxy"])
def test_a_stalled_body_gets_408_and_the_server_serves_on(servers, which):
    head = request_head("/v1/completions", {"Content-Type": "application/json", "Content-Length": "200"})
    response = send_and_read(servers[which].port, head + b'{"model": "x", "prompt": ', timeout=120)
    assert status_of(response) == 408 and b"body" in response
    assert good_request(servers[which]) == 200
