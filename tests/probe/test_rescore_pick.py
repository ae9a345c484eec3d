"""Which requests a rescore round picks (engine/traffic/probe/rescore.py), on a real embedded store: client
traffic only, finished, >= 2 output tokens with one logprob each, fitting the context, not rescored
before; a hash order that moves with the round."""

from __future__ import annotations

import time

from engine.traffic.loadgen.runner import Endpoint
from engine.traffic.probe.rescore import pick_requests
from telemetry.contract.probes import RESCORE_WORKLOAD, rescore_request_id
from tests.diagnostics.diag_records import request

T0 = time.time() - 600
EP = Endpoint("http://x", "a", "tiny", 1024)


def _req(i, **kw):
    kw.setdefault("output_logprobs", [-0.1] * len(kw.get("output_ids", [8, 9, 10, 11])))
    return request("a", i, T0 + i, **kw)


def test_picks_client_traffic_not_yet_rescored(store):
    store.command("TRUNCATE TABLE requests")
    good = [_req(i) for i in range(6)]
    bad = [_req(10, workload="probe"), _req(11, workload=RESCORE_WORKLOAD), _req(12, output_ids=[8]),
           _req(13, output_logprobs=[-0.1]), _req(14, finish_reason="abort"),
           _req(15, prompt_ids=list(range(1100))), request("b", 16, T0)]
    done = request("a", 99, T0 + 50, workload=RESCORE_WORKLOAD, request_id=rescore_request_id("p1", "a", "a-0"))
    store.insert_records("requests", good + bad + [done])
    picked = pick_requests(store, EP, "p2", 10, 3600, 1024)
    assert sorted(p.request_id for p in picked) == [f"a-{i}" for i in range(1, 6)]  # a-0 was rescored in p1
    assert picked[0].token_ids == [0, 5, 6, 7, 8, 9, 10, 11]
    orders = {tuple(p.request_id for p in pick_requests(store, EP, f"p{k}", 3, 3600, 1024)) for k in range(2, 8)}
    assert len(orders) > 1  # rounds sample different requests
