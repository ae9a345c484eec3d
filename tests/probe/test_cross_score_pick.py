"""Which requests a continuous cross-scoring pass picks (engine/traffic/probe/cross_scoring.pick_share), on a
real embedded store: `share` of a replica's scorable requests, drawn from those whose sampled tokens'
logprobs were recorded. A recording proxy asks a vLLM replica for logprobs on a share of its requests
only; the pick scales up within those, so such a replica is scored as often as one that records them all."""

from __future__ import annotations

import time

from engine.traffic.loadgen.runner import Endpoint
from engine.traffic.probe.cross_scoring import pick_share
from tests.diagnostics.diag_records import request

T0 = time.time() - 600
N = 400
EP = Endpoint("http://x", "a", "tiny", 1024)


def _hash_share(store, ids: list[str], share: float) -> set[str]:
    rows = store.query_arrow("SELECT id FROM (SELECT arrayJoin({ids:Array(String)}) AS id) "
                             "WHERE cityHash64('cross-score', id) % 1000000 < {ppm:UInt64}",
                             {"ids": ids, "ppm": int(round(share * 1_000_000))}).to_pylist()
    return {r["id"] for r in rows}


def _requests(measured_every: int) -> list:
    return [request("a", i, T0 + i * 0.5,
                    output_logprobs=[-0.1] * 4 if i % measured_every == 0 else []) for i in range(N)]


def test_a_quarter_measured_is_picked_at_four_times_the_share(store):
    store.command("TRUNCATE TABLE requests")
    rows = _requests(measured_every=4)
    store.insert_records("requests", rows)
    measured = [r.request_id for r in rows if r.output_logprobs]
    picked = {p.request_id for p in pick_share(store, EP, T0 - 1, T0 + N, 0.05, 1024)}
    assert picked == _hash_share(store, measured, 0.05 * N / len(measured))
    assert 0.03 * N < len(picked) < 0.08 * N  # about share x all scorable requests, not share x the measured ones


def test_all_measured_is_the_plain_hash_share(store):
    store.command("TRUNCATE TABLE requests")
    rows = _requests(measured_every=1)
    store.insert_records("requests", rows)
    picked = {p.request_id for p in pick_share(store, EP, T0 - 1, T0 + N, 0.05, 1024)}
    assert picked == _hash_share(store, [r.request_id for r in rows], 0.05)


def test_nothing_measured_picks_nothing(store):
    store.command("TRUNCATE TABLE requests")
    store.insert_records("requests", _requests(measured_every=N + 1)[1:])
    assert pick_share(store, EP, T0 - 1, T0 + N, 0.05, 1024) == []
