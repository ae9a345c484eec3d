"""A duration its writer could not measure (derived.UNKNOWN: a recording proxy's queue and prefill, a proxied
whole response's TTFT) is stored as nan and stays out of every percentile the views show, while the
request itself still counts and is still found. Beside them, rows of the same replica whose times are known:
the percentiles must be theirs alone (a 0 in place of the unknowns would pull every one of them down), and
a filter on TTFT must not lose them (nan >= 0 is false)."""

from __future__ import annotations

import math

import pytest

from dashboards import queries
from telemetry import synthetic
from telemetry.contract import derived

N_KNOWN, N_UNKNOWN = 12, 8


def _whole_response(i: int):
    """A non-streamed request as the proxy writes it: tokens, an end-to-end time, no first-token time."""
    row = synthetic.request(100 + i, "v0")
    row.request_id, row.scheduled_time, row.first_token_time, row.token_times = f"whole-{i}", 0.0, 0.0, []
    row.queue_seconds = row.prefill_seconds = row.ttft_seconds = derived.UNKNOWN
    return row


@pytest.fixture(scope="module")
def mixed(store):
    known = [synthetic.request(i, "v0") for i in range(N_KNOWN)]
    store.insert_records("requests", known + [_whole_response(i) for i in range(N_UNKNOWN)])
    window = {"start": synthetic.T0 - 60, "end": synthetic.T0 + 3600}
    return store, known, window


def test_the_unknowns_are_stored_as_nan(mixed):
    store, _, _ = mixed
    rows = store.query_df("SELECT ttft_seconds, queue_seconds FROM requests WHERE startsWith(request_id, 'whole-')")
    assert len(rows) == N_UNKNOWN and rows["ttft_seconds"].map(math.isnan).all()
    assert rows["queue_seconds"].map(math.isnan).all()


def test_fleet_and_compare_percentiles_are_the_known_ones(mixed):
    store, known, window = mixed
    ttft = derived.quantiles([r.ttft_seconds for r in known])
    health = store.query_df(queries.REPLICA_HEALTH, {**window, "replicas": ["v0"]}).iloc[0]
    assert health["requests"] == N_KNOWN + N_UNKNOWN  # every request counts
    assert list(health["ttft"]) == pytest.approx(ttft)
    over_time = store.query_df(queries.LATENCY_OVER_TIME, {**window, "replicas": ["v0"], "bucket_ms": 3_600_000})
    assert list(over_time["ttft"][0]) == pytest.approx(ttft)
    sides = {**window, "a": ["v0"], "b": []}
    summary = store.query_df(queries.COMPARE_SUMMARY, sides).iloc[0]
    assert list(summary["ttft"]) == pytest.approx(ttft)
    assert list(summary["queue"]) == pytest.approx(derived.quantiles([r.queue_seconds for r in known]))
    curve = store.query_df(queries.COMPARE_TTFT_CURVE, sides)["q"][0]
    assert all(math.isfinite(q) for q in curve) and min(curve) >= min(r.ttft_seconds for r in known)


@pytest.mark.parametrize("metric", ["ttft", "queue", "prefill", "tpot"])
def test_a_findings_distribution_leaves_them_out(mixed, metric):
    store, known, window = mixed
    found = store.query_df(queries.FINDING_LATENCY_DISTRIBUTION, {**window, "replicas": ["v0"], "metric": metric})
    assert found["requests"][0] == N_KNOWN


def test_the_request_search_finds_them_unless_a_minimum_ttft_is_asked(mixed):
    store, known, window = mixed
    search = {**window, "replicas": ["v0"], "workloads": [], "reasons": [], "min_e2e": 0.0, "search": "",
              "limit": 1000}
    everything = store.query_df(queries.SEARCH_REQUESTS["slowest first token"], {**search, "min_ttft": 0.0})
    assert len(everything) == N_KNOWN + N_UNKNOWN
    floor = sorted(r.ttft_seconds for r in known)[N_KNOWN // 2]
    slow = store.query_df(queries.SEARCH_REQUESTS["slowest first token"], {**search, "min_ttft": floor})
    assert sorted(slow["request_id"]) == sorted(r.request_id for r in known if r.ttft_seconds >= floor)
