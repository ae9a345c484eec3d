"""Waiting for rows that recorders deliver in the background (the demo, the fault matrix, tests)."""

from __future__ import annotations

import time

_REQUESTS = "SELECT count() AS n FROM requests WHERE startsWith(request_id, {prefix:String})"
_REPLICAS = "SELECT uniqExact(replica_id) AS n FROM replicas WHERE has({ids:Array(String)}, replica_id)"


def _wait_for_count(store, sql: str, params: dict, expected: int, timeout: float, poll: float) -> int:
    deadline = time.monotonic() + timeout
    while True:
        n = int(store.query_df(sql, params)["n"].iloc[0])
        if n >= expected or time.monotonic() > deadline:
            return n
        time.sleep(poll)


def wait_for_requests(store, prefix: str, expected: int, timeout: float = 30.0, poll: float = 0.5) -> int:
    """Wait (bounded by `timeout`) until `expected` requests whose id starts with `prefix` are
    stored; returns how many are."""
    return _wait_for_count(store, _REQUESTS, {"prefix": prefix}, expected, timeout, poll)


def wait_for_replicas(store, replica_ids: list[str], timeout: float = 30.0, poll: float = 0.5) -> int:
    """Wait (bounded by `timeout`) until each of `replica_ids` has its `replicas` row (written once,
    at start, and delivered with the recorder's next batch); returns how many have."""
    return _wait_for_count(store, _REPLICAS, {"ids": list(replica_ids)}, len(replica_ids), timeout, poll)
