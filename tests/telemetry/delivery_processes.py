"""Real processes for the delivery tests: `infersight serve` replicas with their own spool
directory, loopback traffic with known request ids, the replica's telemetry counters from its
/metrics, and the rows the store holds. Every wait polls with a deadline."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from engine.serving.processes import infersight_command, log_tail, process_ref, wait_healthy
from engine.util import free_port
from telemetry.store import StoreError, open_store

COUNTER_PREFIX = "infersight_telemetry_rows_"


def wait_for(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.2):
    """Poll `predicate` until it returns something true (and return that); AssertionError at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        time.sleep(interval)


class Replica:
    """One `infersight serve` process on a free loopback port, its output in `log_path`."""

    def __init__(self, model: Path, store_url: str, replica_id: str, spool_dir: Path, log_path: Path, *flags: str):
        self.model, self.replica_id, self.log_path = model, replica_id, log_path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = infersight_command("serve", "--model", str(model), "--port", str(self.port), "--replica-id", replica_id,
                                 "--store", store_url, "--spool-dir", str(spool_dir), "--threads", "1",
                                 "--log-level", "warning", *flags)
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            wait_healthy(self.url, process_ref(self.process.pid), 180, log_path)
        except RuntimeError:
            self.kill()
            raise

    def complete(self, request_id: str) -> int:
        """One short completion under a known request id; the HTTP status."""
        body = {"model": self.model.name, "prompt": f"deliver {request_id}", "max_tokens": 3, "temperature": 0,
                "ignore_eos": True}
        response = httpx.post(self.url + "/v1/completions", json=body, headers={"X-Request-Id": request_id},
                              timeout=60)
        return response.status_code

    def send(self, request_ids: list[str]) -> list[str]:
        """Each request in turn; the ids answered with 200 (all of them, or the test says which not)."""
        statuses = {rid: self.complete(rid) for rid in request_ids}
        refused = {rid: s for rid, s in statuses.items() if s != 200}
        assert not refused, f"the replica must keep serving whatever the store does: {refused}"
        return list(statuses)

    def counters(self) -> dict[str, dict[str, float]]:
        """{"written" | "spooled" | "replayed" | "dropped": {table: rows}} from the replica's /metrics."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        out: dict[str, dict[str, float]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.startswith(COUNTER_PREFIX) and sample.name.endswith("_total"):
                    kind = sample.name[len(COUNTER_PREFIX):-len("_total")]
                    out.setdefault(kind, {})[sample.labels["table"]] = sample.value
        return out

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM: drain, final telemetry flush, exit."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"replica {self.replica_id} did not stop:\n{log_tail(self.log_path, 30)}") from None

    def kill(self) -> None:
        """SIGKILL, as a crash or the OOM killer."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


class Traffic:
    """Requests to a replica on a thread, one after another, until `stop()` or `limit` requests."""

    def __init__(self, replica: Replica, prefix: str, limit: int = 400):
        self.replica, self.prefix, self.limit = replica, prefix, limit
        self.answered: list[str] = []
        self.refused: dict[str, object] = {}  # request id -> status or error
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"traffic-{prefix}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for i in range(self.limit):
            if self._stop.is_set():
                return
            rid = f"{self.prefix}-{i}"
            try:
                status = self.replica.complete(rid)
            except httpx.HTTPError as e:
                status = repr(e)
            if status == 200:
                self.answered.append(rid)
            else:
                self.refused[rid] = status
            self._stop.wait(0.02)  # leave the two cores some room

    def stop(self) -> list[str]:
        self._stop.set()
        self._thread.join(120)
        assert not self._thread.is_alive(), "the traffic thread did not finish"
        return list(self.answered)


def stored_request_ids(store_url: str, replica_id: str) -> list[str]:
    """Every request id the store holds for the replica (duplicates kept); [] while it cannot be reached."""
    try:
        with open_store(store_url, connect_timeout=2) as store:
            df = store.query_df("SELECT request_id FROM requests WHERE replica_id = {r:String}", {"r": replica_id})
    except StoreError:
        return []
    return list(df["request_id"])
