"""CPU throttling over the window is cited from the steps' cgroup counters: a replica throttled in a real share
of its periods, against peers throttled less or never (no quota); a quota never reached, or throttling every
replica shares, is no cause."""

from __future__ import annotations

import time

import pytest
from diag_records import replica, step

from diagnostics import mechanisms
from diagnostics.scope import Scope, replicas_in

STEPS = 120  # one a second; the counters read as a cgroup's would: 10 periods of 100 ms a second


def _fleet(store, t0: float, throttled_per_second: dict[str, int | None]) -> None:
    """Each replica's steps with its cgroup's cumulative counters: None means no quota (no periods at all)."""
    store.insert_records("replicas", [replica(r, t0 - 10) for r in throttled_per_second])
    rows = []
    for rid, throttled in throttled_per_second.items():
        base = 5000  # counters run since the cgroup was made, before the window
        for j in range(STEPS):
            counters = {} if throttled is None else {
                "cpu_periods": base + 10 * j, "cpu_throttled_periods": base // 2 + throttled * j,
                "cpu_throttled_seconds": 0.05 * throttled * j}
            rows.append(step(rid, j, t0 + j, **counters))
    store.insert_records("steps", rows)


def _cited(store, t0: float, rid: str, peers: list[str]) -> dict:
    scope = Scope(start=t0 - 60)
    identity = {r["replica_id"]: r for r in replicas_in(store, scope)}
    return {m["mechanism"]: m for m in mechanisms.cited(store, scope, rid, peers, identity)}


def test_a_throttled_replica_among_peers_without_a_quota_has_its_throttling_cited(clean):
    """The quota was set on the running process: its identity says nothing, its counters do."""
    t0 = time.time() - 3600
    _fleet(clean, t0, {"r0": None, "r1": None, "r2": 6})
    cited = _cited(clean, t0, "r2", ["r0", "r1"])
    assert list(cited) == ["cpu_throttling"]
    t = cited["cpu_throttling"]
    assert t["replica"]["events"] == 6 * (STEPS - 1) and t["replica"]["of"] == 10 * (STEPS - 1)
    assert "CPU throttled in 60% of its cgroup's periods" in t["said"] and "none on peers (no CPU quota)" in t["said"]


def test_a_replica_throttled_more_than_its_throttled_peers_has_it_cited(clean):
    t0 = time.time() - 3600
    _fleet(clean, t0, {"r0": 1, "r1": 1, "r2": 6})
    t = _cited(clean, t0, "r2", ["r0", "r1"])["cpu_throttling"]
    assert t["others"]["rate"] == pytest.approx(0.1) and t["test"]["p_value"] < mechanisms.ALPHA


@pytest.mark.parametrize("throttled", [
    {"r0": None, "r1": None, "r2": 0},  # a quota it never reached: no period throttled
    {"r0": 5, "r1": 5, "r2": 5},  # every replica throttled alike: how the fleet runs
    {"r0": None, "r1": None, "r2": None},  # no cgroup counters anywhere
])
def test_throttling_that_is_no_difference_is_not_a_cause(clean, throttled):
    t0 = time.time() - 3600
    _fleet(clean, t0, throttled)
    assert "cpu_throttling" not in _cited(clean, t0, "r2", ["r0", "r1"])
