"""How much the sidecar takes at once, and how long it waits for a client.

Past a bound the sidecar answers at once (413, 408, 503 with Retry-After) rather than queueing
without limit, so one kind of load (slow dashboard reads, half-open sockets, huge bodies) cannot
take the capacity the replicas' inserts and Prometheus' scrapes need.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    # bodies: INSERT data may be large; any other statement is SQL text (ClickHouse's own
    # max_query_size is 256 KiB), so its body, compressed or not, is refused past this
    max_statement_bytes: int = 1 << 20
    # statements (reads, DDL) running at once, for the read-only user and for the full user each;
    # the next one gets 503 + Retry-After (as ClickHouse's max_concurrent_queries); inserts and
    # /metrics have their own threads and never wait on these
    query_slots: int = 8
    insert_threads: int = 4
    insert_queue: int = 64  # inserts waiting for a thread; past it, 503 (the recorder spools and retries)
    metrics_threads: int = 2
    # connections: the request line and headers must be complete this long after the connection
    # opened (or after the first byte of a kept-alive connection's next request), however slowly
    # the bytes trickle in; the body must keep arriving (no gap longer than receive_timeout)
    header_timeout_seconds: float = 10
    receive_timeout_seconds: float = 30
    # open connections; past it the oldest one still waiting for its request is closed
    max_connections: int = 4096

    def __post_init__(self):
        for name in ("max_statement_bytes", "query_slots", "insert_threads", "metrics_threads", "max_connections"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.insert_queue < 0 or self.header_timeout_seconds <= 0 or self.receive_timeout_seconds <= 0:
            raise ValueError("insert_queue must be >= 0 and the timeouts > 0")

    @property
    def store_sessions(self) -> int:
        """chdb sessions per kind (read-only / full) so that no lane ever waits for a session (the
        full user's GETs run read-only; +1: the store health check). Sessions open on first use."""
        return 2 * self.query_slots + self.insert_threads + self.metrics_threads + 1
