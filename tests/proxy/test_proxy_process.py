"""`infersight proxy` as the process a fleet runs: nothing it recorded is lost across a sidecar
kill -9 and restart, and SIGTERM drains, flushes and exits 0."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid

import httpx
import pytest

from engine.util import free_port
from telemetry.sidecar.process import start_sidecar
from telemetry.store import open_store

pytestmark = pytest.mark.slow


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"proxy at {url} not healthy after {timeout} s")


def test_nothing_is_lost_across_a_sidecar_kill_and_sigterm_flushes(upstream, tmp_path):
    sidecar = start_sidecar(tmp_path / "store")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dashboards.console.cli", "proxy", "--upstream", upstream.url,
         "--store", sidecar.store_url, "--port", str(port), "--replica-id", "px-proc",
         "--spool-dir", str(tmp_path / "spool"), "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    sent: list[str] = []

    def send(n: int) -> None:
        with httpx.Client(base_url=url, timeout=60) as client:
            for i in range(n):
                request_id = uuid.uuid4().hex
                r = client.post("/v1/completions", headers={"X-Request-Id": request_id},
                                json={"model": upstream.model, "prompt": f"request {len(sent)}", "max_tokens": 4,
                                      "stream": i % 2 == 0})
                assert r.status_code == 200
                sent.append(request_id)

    try:
        _wait_healthy(url, proc)
        send(3)
        time.sleep(2.5)  # a flush interval: the first rows reach the store before the kill
        sidecar.kill()  # kill -9: no goodbye
        send(4)  # answered while the store is gone: spooled
        sidecar = start_sidecar(tmp_path / "store", port=sidecar.port)
        send(2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, proc.stdout.read()
        store = open_store(sidecar.store_url)
        try:
            got = store.query_df("SELECT request_id, count() AS n FROM requests WHERE replica_id = 'px-proc' "
                                 "GROUP BY request_id")
        finally:
            store.close()
        counts = dict(zip(got["request_id"], got["n"]))
        assert set(counts) == set(sent)  # every answered request, once each
        assert set(counts.values()) == {1}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sidecar.stop()
