"""Continuous cross-scoring (engine/traffic/probe/cross_scoring.py) against two real replicas in this process,
recording into one embedded store: which requests a pass picks, where each goes, and the token budget.

- the pick is the hash share of each replica's finished client requests, each scored once by a peer
  and once by the replica that served it, and a later pass does not score it again;
- the budget holds: what a pass sends never exceeds token_share x the tokens the replicas served, and
  the picks that did not fit are counted, not sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx
import pytest

from engine.traffic.probe.cross_scoring import CrossScoreSettings, cross_score_pass
from telemetry.contract.probes import RESCORE_ORIGINAL_SQL, RESCORE_WORKLOAD
from telemetry.store.waiting import wait_for_requests

N = 40  # sampled requests per replica


async def _traffic(url: str, model: str, prefix: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        await asyncio.gather(*(client.post("/v1/completions", json={
            "model": model, "prompt": f"story {i}: once upon", "temperature": 1.0, "max_tokens": 6, "seed": i,
            "ignore_eos": True}, headers={"X-Request-Id": f"{prefix}-{i}", "X-Workload": "chat"}) for i in range(N)))


@pytest.fixture(scope="module")
def served_pair(served_replica, store, tiny_llama):
    """Two replicas of one model that served N sampled requests each: (urls, since, until)."""
    since = time.time() - 1
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(served_replica(tiny_llama, rid, store, seed=k))[0] for k, rid in enumerate("ab")]
        for rid, url in zip("ab", urls):
            asyncio.run(_traffic(url, tiny_llama.name, rid))
        for rid in "ab":
            assert wait_for_requests(store, f"{rid}-", N) == N
        yield urls, since, time.time() + 1


def _scored(store) -> dict[str, list[str]]:
    rows = store.query_arrow(f"SELECT {RESCORE_ORIGINAL_SQL} AS original, replica_id FROM requests "
                             f"WHERE workload = '{RESCORE_WORKLOAD}'").to_pylist()
    out: dict[str, list[str]] = {}
    for r in rows:
        out.setdefault(r["original"], []).append(r["replica_id"])
    return out


def test_the_share_is_scored_by_a_peer_and_by_itself_once(served_pair, store):
    urls, since, until = served_pair
    store.command(f"DELETE FROM requests WHERE workload = '{RESCORE_WORKLOAD}'")
    settings = CrossScoreSettings(share=0.3, token_share=1.0, interval=1.0, settle=0.0)  # the budget does not bind
    report = asyncio.run(_pass(urls, store, since, until, settings))
    expected = {r["request_id"] for r in store.query_arrow(
        "SELECT request_id FROM requests WHERE workload = 'chat' AND cityHash64('cross-score', request_id) % 1000000 "
        "< 300000").to_pylist()}
    assert 0 < len(expected) < 2 * N and report.over_budget == 0 and not report.failed
    assert sum(report.picked.values()) == len(expected)
    assert wait_for_requests(store, "rescore.", 2 * len(expected)) == 2 * len(expected)
    scored = _scored(store)
    assert set(scored) == expected
    for original, scorers in scored.items():
        served_by = original.split("-")[0]
        assert sorted(scorers) == ["a", "b"], (original, scorers)  # the peer and the replica itself
        assert served_by in scorers
    again = asyncio.run(_pass(urls, store, since, until, settings))  # the same window: nothing left to score
    assert sum(again.picked.values()) == 0


def test_the_token_budget_holds(served_pair, store):
    urls, since, until = served_pair
    store.command(f"DELETE FROM requests WHERE workload = '{RESCORE_WORKLOAD}'")
    settings = CrossScoreSettings(share=1.0, token_share=0.1, interval=1.0, settle=0.0)
    ledgers = {}
    report = asyncio.run(_pass(urls, store, since, until, settings, ledgers))
    served = report.served_tokens
    assert served > 0 and report.over_budget > 0  # every request picked, most did not fit
    (ledger,) = ledgers.values()
    assert ledger.spent == report.tokens <= 0.1 * served
    sent = sum(report.picked.values())
    assert wait_for_requests(store, "rescore.", 2 * sent) == 2 * sent
    stored = store.query_arrow(f"SELECT sum(prompt_tokens + 1) AS t FROM requests "
                               f"WHERE workload = '{RESCORE_WORKLOAD}'").to_pylist()[0]["t"]
    assert stored == report.tokens  # what reached the replicas is what the ledger counted


async def _pass(urls, store, since, until, settings, ledgers=None):
    async with httpx.AsyncClient(timeout=60) as client:
        return await cross_score_pass(client, urls, store, since, until, settings, {} if ledgers is None else ledgers)
