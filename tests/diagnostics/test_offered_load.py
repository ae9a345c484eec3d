"""Load control by offered load (arrivals at the replica), not by the replica's own queue (a mediator)."""

from __future__ import annotations

import json
import random
import time

import numpy as np
from diag_records import replica
from queue_fleet import poisson, serve

from diagnostics import replicas
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope


def fleet(store, t0, plan: dict):
    """plan: replica -> (arrivals, slowdown per token); simulated step by step (tests/diagnostics/queue_fleet)."""
    store.insert_records("replicas", [replica(r, t0 - 10) for r in plan])
    out = {}
    for k, (rid, (arrivals, slow)) in enumerate(sorted(plan.items())):
        reqs, steps = serve(rid, arrivals, slow=slow, seed=k)
        store.insert_records("requests", reqs)
        store.insert_records("steps", steps)
        out[rid] = reqs
    return out


def above_info(findings):
    return [f for f in findings if f.severity != "info"]


def test_a_replica_slower_per_token_is_named_although_its_queue_grew_with_it(clean):
    """Same offered load (Poisson, 7.5/s each); the canary is 1.3x slower per token, so it runs near
    saturation and its requests arrive behind long queues. Strata of its own running / waiting sequences
    would only compare them with the baseline's rare congested moments; offered load compares them with
    the baseline's requests under the same arrivals."""
    t0 = time.time() - 3600
    rate, span = 7.5, 150.0
    plan = {"base": (poisson(random.Random(1), rate, t0, t0 + span), 1.0),
            "canary": (poisson(random.Random(2), rate, t0, t0 + span), 1.3)}
    fleet(clean, t0, plan)
    found = above_info(replicas.run(clean, DiagnosticRequest(Scope(start=t0 - 1))))
    assert [(f.kind, f.subject) for f in found] == [("lagging_replica", "canary")]
    evidence = found[0].evidence
    assert any("offered load" in c for c in evidence["controlled_for"])
    assert not any("waiting" in c or "running" in c for c in evidence["controlled_for"])
    # the queueing is part of its slowdown: at equal queues (the mediator) TTFT reads ~1.6x
    assert evidence["metrics"]["ttft"]["ratio_ci"][0] > 2


def test_a_replica_that_got_a_calibration_burst_at_the_same_speed_is_not_named(clean):
    """busy took a burst (500 requests in 50 s) beside its share of the traffic; its peers 30 each.
    Same speed: its TTFT over the burst is queueing under more offered load, not slowness."""
    t0 = time.time() - 3600
    rng = random.Random(3)
    burst = sorted(poisson(rng, 1 / 5, t0, t0 + 150) + poisson(rng, 10.0, t0 + 50, t0 + 100))
    plan = {"busy": (burst, 1.0), "p1": (poisson(rng, 1 / 5, t0, t0 + 150), 1.0),
            "p2": (poisson(rng, 1 / 5, t0, t0 + 150), 1.0)}
    reqs = fleet(clean, t0, plan)
    assert len(reqs["busy"]) > 450 and all(len(reqs[p]) < 60 for p in ("p1", "p2"))
    busy = np.median([r.ttft_seconds for r in reqs["busy"]])
    peers = np.median([r.ttft_seconds for p in ("p1", "p2") for r in reqs[p]])
    assert busy / peers > 1.3  # pooled over load, busy looks slow
    assert above_info(replicas.run(clean, DiagnosticRequest(Scope(start=t0 - 1)))) == []


def test_identical_replicas_under_the_same_offered_load_give_nothing(clean):
    t0 = time.time() - 3600
    plan = {r: (poisson(random.Random(10 + k), 6.0, t0, t0 + 120), 1.0) for k, r in enumerate(("a", "b", "c"))}
    fleet(clean, t0, plan)
    assert above_info(replicas.run(clean, DiagnosticRequest(Scope(start=t0 - 1)))) == []


def test_a_replica_held_to_one_sequence_is_named_on_ttft_and_its_peers_not_on_tokens(clean):
    """The canary's scheduler admits one sequence at a time (max_num_seqs 1; same speed per token): at
    the peers' offered load it queues, so its TTFT is several times theirs; its queue at arrival is
    long all along, so strata of it hid that. It decodes faster per token than a peer batching four,
    which is a trade-off of its limits, not a lagging peer: per-token metrics compare equal limits only."""
    t0 = time.time() - 3600
    limits = {"base": 4, "canary": 1}
    clean.insert_records("replicas", [replica(r, t0 - 10, config_hash=f"cfg-{n}",
                                              config_json=json.dumps({"model": "/m", "max_num_seqs": n}))
                                      for r, n in limits.items()])
    for k, rid in enumerate(sorted(limits)):
        reqs, steps = serve(rid, poisson(random.Random(20 + k), 3.0, t0, t0 + 150), max_seqs=limits[rid], seed=k)
        clean.insert_records("requests", reqs)
        clean.insert_records("steps", steps)
    found = above_info(replicas.run(clean, DiagnosticRequest(Scope(start=t0 - 1))))
    assert [(f.kind, f.subject) for f in found] == [("lagging_replica", "canary")]
    evidence = found[0].evidence
    assert evidence["metrics"]["ttft"]["ratio_ci"][0] > 2 and not set(evidence["metrics"]) & {"tpot", "itl"}
    assert evidence["not_compared"] == ["itl", "tpot"] and "max_num_seqs 1 vs 4" in found[0].summary
