"""Inserts the store did not store, reported loudly: on /health, in the log, on /metrics.

Each such insert is answered 503 (the writer spools it and sends it again with the same dedup
token) and counted on `infersight_sidecar_failed_writes_total`. A run of them is one episode: the
log says so once when it starts (with the store's reason) and once when an insert is stored
again, and /health says "degraded" with the reason while it lasts.
"""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger(__name__)


class WriteHealth:
    def __init__(self, on_failure=lambda: None):
        self._on_failure = on_failure
        self._lock = threading.Lock()
        self._since: float | None = None  # wall time of the episode's first failed insert
        self._failed = 0
        self._reason = ""

    def failed(self, reason: str) -> None:
        self._on_failure()
        with self._lock:
            first = self._since is None
            if first:
                self._since, self._failed = time.time(), 0
            self._failed += 1
            self._reason = reason
        if first:
            log.error("inserts are not being stored (answered 503, writers keep them and retry): %s", reason)

    def stored(self) -> None:
        if self._since is None:  # the usual case: no lock
            return
        with self._lock:
            since, failed, self._since = self._since, self._failed, None
        if since is not None:
            log.warning("inserts are stored again, after %d not stored over %.0f s", failed, time.time() - since)

    def status(self) -> dict:
        """{"failing": False} or {"failing": True, "since": unix time, "failed_inserts": n, "reason": ...}."""
        with self._lock:
            if self._since is None:
                return {"failing": False}
            return {"failing": True, "since": self._since, "failed_inserts": self._failed, "reason": self._reason}
