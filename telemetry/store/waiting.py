"""Waiting for rows that recorders deliver in the background (the demo, the fault matrix, tests)."""

from __future__ import annotations

import time

_COUNT = "SELECT count() AS n FROM requests WHERE startsWith(request_id, {prefix:String})"


def wait_for_requests(store, prefix: str, expected: int, timeout: float = 30.0, poll: float = 0.5) -> int:
    """Wait (bounded by `timeout`) until `expected` requests whose id starts with `prefix` are
    stored; returns how many are."""
    deadline = time.monotonic() + timeout
    while True:
        n = int(store.query_df(_COUNT, {"prefix": prefix})["n"].iloc[0])
        if n >= expected or time.monotonic() > deadline:
            return n
        time.sleep(poll)
