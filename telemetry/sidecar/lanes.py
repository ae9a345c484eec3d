"""Separate capacity for the kinds of work the sidecar does in threads (chdb calls block).

Statements get `query_slots` threads per user kind and no queue: one more is refused at once, as
ClickHouse refuses past max_concurrent_queries. The read-only user's (dashboards) and the full
user's (replicas: clickhouse-connect runs a few statements when it connects; migrations, tools)
are counted apart, so slow dashboard reads cannot keep a replica from connecting. Inserts get
their own threads and a bounded queue, scrapes their own threads: slow reads never starve the
replicas' inserts or Prometheus. All bookkeeping happens on the event loop (one thread): no locks.
"""

from __future__ import annotations

import anyio

from telemetry.sidecar.limits import Limits

SCRAPE_QUEUE_PER_THREAD = 8


class Busy(Exception):
    """The lane is full: answer 503 with Retry-After."""


class Lanes:
    def __init__(self, limits: Limits):
        self.limits = limits
        self.statements = {role: anyio.CapacityLimiter(limits.query_slots) for role in ("readonly", "full")}
        self.insert = anyio.CapacityLimiter(limits.insert_threads)
        self.metrics = anyio.CapacityLimiter(limits.metrics_threads)
        self.running = {"readonly": 0, "full": 0, "insert": 0, "scrape": 0}  # running or waiting for a thread

    async def run_statement(self, role: str, fn, *args):
        """`role`: "readonly" or "full" (handler.Users.role)."""
        if self.running[role] >= self.limits.query_slots:
            raise Busy(f"Too many simultaneous queries. Maximum: {self.limits.query_slots}")
        return await self._counted(role, fn, args, self.statements[role])

    async def run_insert(self, fn, *args):
        bound = self.limits.insert_threads + self.limits.insert_queue
        if self.running["insert"] >= bound:
            raise Busy(f"Too many simultaneous inserts. Maximum: {bound} (running and queued)")
        return await self._counted("insert", fn, args, self.insert)

    async def run_scrape(self, fn, *args):
        """/metrics and /health (no credentials needed): a bounded queue, so a flood of them cannot
        pile up without end in front of Prometheus."""
        bound = SCRAPE_QUEUE_PER_THREAD * self.limits.metrics_threads
        if self.running["scrape"] >= bound:
            raise Busy(f"Too many simultaneous scrapes. Maximum: {bound}")
        return await self._counted("scrape", fn, args, self.metrics)

    async def _counted(self, kind: str, fn, args, limiter):
        # counted before the first await (anyio's to_thread yields before it takes the limiter),
        # so two requests cannot both pass the check for the last place
        self.running[kind] += 1
        try:
            return await anyio.to_thread.run_sync(fn, *args, limiter=limiter)
        finally:
            self.running[kind] -= 1
