"""Many clients at once on one replica (loopback only, loops bounded in count and time):

- a flood (2,000 requests at concurrency 64) is shed with 429 + Retry-After once the queue bound is
  reached, instead of queueing without limit; every request sent is in the store once (the shed ones
  with 429, queue_full and the queue's state), and /metrics counts both;
- 250 streams whose clients hang up mid-stream free their KV blocks, and /metrics shows it without
  any further request (the gauges used to stay at the last step's running / KV numbers).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.serving.server.app import build_app
from engine.serving.server.background import BackgroundServer

MAX_QUEUE = 4  # beyond the live engine's max_num_seqs=8 running: 12 requests in flight at most
FLOOD_REQUESTS, FLOOD_CONCURRENCY = 2000, 64
ABORTED_STREAMS, STREAM_CONCURRENCY = 250, 8
TIME_BOUND_S = 300  # no new request is started after this; a hung request fails by its own timeout


def _metrics(url: str) -> dict[tuple, float]:
    out = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _sum(metrics: dict, name: str, **labels) -> float:
    return sum(v for (n, ls), v in metrics.items()
               if n == name and all((k, v2) in ls for k, v2 in labels.items()))


@pytest.fixture(scope="module")
def bounded(live):
    """A second app on the live engine with a small queue bound and scrape-time gauges."""
    app = build_app(live.served, metrics_registry=live.parts.registry, metrics_observer=live.parts.metrics,
                    manage_engine=False, max_queue=MAX_QUEUE)
    with BackgroundServer(app) as server:
        yield server.url


async def _flood(url: str, model: str, tag: str) -> list[tuple[str, int, str | None, str | None]]:
    """(request id, status, Retry-After, error code) of each request sent."""
    results = []
    next_index = iter(range(FLOOD_REQUESTS))
    deadline = time.monotonic() + TIME_BOUND_S
    limits = httpx.Limits(max_connections=FLOOD_CONCURRENCY, max_keepalive_connections=FLOOD_CONCURRENCY)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        async def worker():
            for i in next_index:
                if time.monotonic() > deadline:
                    return
                request_id = f"{tag}-{i}"
                r = await client.post("/v1/completions", headers={"X-Request-Id": request_id}, json={
                    "model": model, "prompt": f"flood {i}", "max_tokens": 2, "temperature": 0})
                code = r.json()["error"]["code"] if r.status_code != 200 else None
                results.append((request_id, r.status_code, r.headers.get("retry-after"), code))

        await asyncio.gather(*(worker() for _ in range(FLOOD_CONCURRENCY)))
    return results


def _stored_rows(store, tag: str, expected: int, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        df = store.query_df("SELECT request_id, http_status, error_code, finish_reason, error_detail_json "
                            "FROM requests WHERE startsWith(request_id, {tag:String})", {"tag": tag + "-"})
        if len(df) >= expected or time.monotonic() > deadline:
            return df
        time.sleep(0.5)


@pytest.mark.slow
def test_a_flood_is_shed_with_429_and_every_answer_is_stored(live, bounded, store):
    replica = {"replica": live.served.replica_id}
    before = _metrics(bounded)
    assert httpx.get(bounded + "/health", timeout=10).json()["max_in_flight"] == 8 + MAX_QUEUE
    tag = f"flood-{uuid.uuid4().hex[:8]}"
    results = asyncio.run(_flood(bounded, live.served.name, tag))

    statuses = {status for _, status, _, _ in results}
    answered = [rid for rid, status, _, _ in results if status == 200]
    shed = [(rid, retry, code) for rid, status, retry, code in results if status == 429]
    assert statuses <= {200, 429}, statuses
    assert answered and shed, (len(answered), len(shed))
    assert all(code == "queue_full" and retry is not None and int(retry) >= 1 for _, retry, code in shed)
    assert len(results) == FLOOD_REQUESTS, f"only {len(results)} sent within {TIME_BOUND_S} s"
    # the replica still serves, and holds nothing once the flood is over
    idle = live.wait_idle()
    assert (idle["status"], idle["running"], idle["waiting"], idle["kv_blocks_used"]) == ("ok", 0, 0, 0)

    after = _metrics(bounded)
    assert _sum(after, "infersight_requests_shed_total", **replica) - _sum(
        before, "infersight_requests_shed_total", **replica) == len(shed)
    finished = [_sum(m, "infersight_request_success_total", **replica) for m in (before, after)]
    assert finished[1] - finished[0] == len(answered)  # refused requests never reached the engine

    live.flush()
    rows = _stored_rows(store, tag, len(results))
    stored = list(rows["request_id"])
    assert len(stored) == len(set(stored)) == len(results)  # every request sent is one row, shed ones too
    refused = rows[rows["error_code"] != ""]
    assert set(refused["request_id"]) == {rid for rid, _, _ in shed}
    assert set(refused["error_code"]) == {"queue_full"} and set(refused["http_status"]) == {429}
    state = json.loads(refused["error_detail_json"].iloc[0])  # the queue's state when it was shed
    assert state["in_flight"] >= state["max_running"] + state["max_queue"] == 8 + MAX_QUEUE
    assert set(rows[rows["error_code"] == ""]["finish_reason"]) <= {"stop", "length"}


async def _room_for_workers(client: httpx.AsyncClient, deadline: float) -> None:
    """Until the server holds at most max_in_flight - STREAM_CONCURRENCY requests. A stream the test hung up on
    stays in flight until the server has seen the hang-up and aborted it, so workers reopening at once can find
    the bound full of their own abandoned streams (429) on a loaded machine; once this holds, the workers'
    next streams all fit."""
    while time.monotonic() < deadline:
        health = (await client.get("/health")).json()
        if health["in_flight"] <= health["max_in_flight"] - STREAM_CONCURRENCY:
            return
        await asyncio.sleep(0.05)


async def _abort_streams(url: str, model: str) -> int:
    """Open streams that would run 900 tokens, read their first event, hang up; returns how many."""
    aborted = 0
    remaining = iter(range(ABORTED_STREAMS))
    deadline = time.monotonic() + TIME_BOUND_S
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        async def worker():
            nonlocal aborted
            for i in remaining:
                if time.monotonic() > deadline:
                    return
                body = {"model": model, "prompt": f"abandoned stream {i}", "max_tokens": 900, "ignore_eos": True,
                        "stream": True}
                await _room_for_workers(client, deadline)
                async with client.stream("POST", "/v1/completions", json=body) as r:
                    assert r.status_code == 200
                    async for line in r.aiter_lines():
                        if line.startswith("data: "):
                            break  # leaving the block closes the connection mid-stream
                aborted += 1

        await asyncio.gather(*(worker() for _ in range(STREAM_CONCURRENCY)))
    return aborted


def test_aborted_streams_free_their_blocks_and_metrics_show_it(live, bounded):
    replica = {"replica": live.served.replica_id}
    aborts_before = _sum(_metrics(bounded), "infersight_request_success_total", finished_reason="abort", **replica)
    aborted = asyncio.run(_abort_streams(bounded, live.served.name))
    assert aborted == ABORTED_STREAMS
    idle = live.wait_idle()  # /health reads the engine: no request, no block
    assert (idle["running"], idle["waiting"], idle["kv_blocks_used"], idle["in_flight"]) == (0, 0, 0, 0)
    # no request since: /metrics must say the same
    m = _metrics(bounded)
    assert _sum(m, "infersight_num_requests_running", **replica) == 0
    assert _sum(m, "infersight_num_requests_waiting", **replica) == 0
    assert _sum(m, "infersight_kv_cache_blocks", state="used", **replica) == 0
    assert _sum(m, "infersight_kv_cache_usage_ratio", **replica) == 0.0
    assert _sum(m, "infersight_request_success_total", finished_reason="abort", **replica) - aborts_before == aborted
