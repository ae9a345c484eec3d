"""The recording proxy's journal: an `infersight proxy` killed (-9) mid-traffic loses no row of a request whose
answer a client got, as a replica's server does (tests/telemetry/test_delivery.py): its rows are journaled
before the answer's last byte leaves, and the next proxy on the same spool directory stores them, once."""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

import httpx
import pytest
from delivery_processes import Replica, Traffic, stored_request_ids, wait_for

from engine.serving.processes import infersight_command, process_ref, wait_healthy
from engine.util import free_port
from telemetry.sidecar.process import start_sidecar

pytestmark = pytest.mark.slow

REFERENCE_MODEL = Path(__file__).resolve().parents[2] / "evals" / "reference" / "models" / "target"


class Proxy:
    """`infersight proxy` in front of `upstream`, recording as `px` with its own spool directory."""

    def __init__(self, upstream: Replica, store_url: str, spool_dir: Path, log_path: Path):
        self.model = upstream.model
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = infersight_command("proxy", "--upstream", upstream.url, "--store", store_url, "--replica-id", "px",
                                 "--spool-dir", str(spool_dir), "--port", str(self.port), "--no-logprobs",
                                 "--log-level", "warning")
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            wait_healthy(self.url, process_ref(self.process.pid), 120, log_path)
        except RuntimeError:
            self.kill()
            raise

    def complete(self, request_id: str) -> int:
        body = {"model": self.model.name, "prompt": f"deliver {request_id}", "max_tokens": 3, "temperature": 0,
                "ignore_eos": True, "stream": request_id.endswith(("0", "2", "4"))}  # streamed and not
        return httpx.post(self.url + "/v1/completions", json=body, headers={"X-Request-Id": request_id},
                          timeout=60).status_code

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.terminate()
        return self.process.wait(60)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def test_a_proxy_killed_mid_traffic_loses_no_answered_request(tmp_path):
    sidecar = start_sidecar(tmp_path / "store")
    spool_dir = tmp_path / "proxy-spool"
    upstream = Replica(REFERENCE_MODEL, sidecar.store_url, "up", tmp_path / "up-spool", tmp_path / "up.log")
    proxy = clients = None
    try:
        proxy = Proxy(upstream, sidecar.store_url, spool_dir, tmp_path / "proxy.log")
        clients = [Traffic(proxy, f"px-{c}") for c in range(2)]
        wait_for(lambda: stored_request_ids(sidecar.store_url, "px"), 120, "the proxy's first rows stored")
        seen = sum(len(c.answered) for c in clients)
        wait_for(lambda: sum(len(c.answered) for c in clients) >= seen + 10, 120, "more requests answered")
        proxy.kill()  # between flushes: rows of answered requests the recorder held only in memory
        answered = [rid for c in clients for rid in c.stop()]
        unanswered = {rid for c in clients for rid in c.refused}
        before_restart = set(stored_request_ids(sidecar.store_url, "px"))
        again = Proxy(upstream, sidecar.store_url, spool_dir, tmp_path / "proxy2.log")
        assert again.stop() == 0  # its final flush
        stored = Counter(stored_request_ids(sidecar.store_url, "px"))
    finally:
        for c in clients or []:
            c.stop()
        if proxy is not None:
            proxy.kill()
        upstream.kill()
        sidecar.stop()
    assert set(answered) - before_restart, "the kill should have caught answered requests in memory"
    assert set(stored.values()) == {1}, "nothing stored twice"
    assert set(answered) <= set(stored), f"answered and lost: {sorted(set(answered) - set(stored))}"
    assert set(stored) - set(answered) <= unanswered  # stored without an answer: cut off by the kill
