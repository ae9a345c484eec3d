"""Lagging replica, like for like: pooled peers (2 and 3 replicas), load and output-length strata, Holm."""

from __future__ import annotations

import random
import time

import numpy as np
from diag_records import jittered, replica, request, step

from diagnostics import replicas, request_strata
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope
from evals.stats import stratified
from telemetry.contract.probes import PROBE_WORKLOAD


def run(store, t0):
    return replicas.run(store, DiagnosticRequest(Scope(start=t0 - 60)))


def above_info(findings):
    return [f for f in findings if f.severity != "info"]


def serve(store, t0, slow: dict, n: int, seed: int, ttft_only: bool = False, spread: float = 0.2):
    """slow: replica -> slowdown (TTFT and ITL, or TTFT alone)."""
    rng = random.Random(seed)
    store.insert_records("replicas", [replica(r, t0 - 10) for r in slow])
    store.insert_records("requests", [
        request(r, j, t0 + j, ttft=jittered(rng, 0.05 * k, spread), itl=jittered(rng, 0.01 * (1 if ttft_only else k)))
        for r, k in slow.items() for j in range(n)])


def test_a_2x_replica_among_three_is_found(clean):
    # the robust z over three replica medians could not reach 3.5 at 2x: pooled peers' requests do
    t0 = time.time() - 3600
    serve(clean, t0, {"a": 1.0, "b": 1.0, "c": 2.0}, n=100, seed=10)
    found = above_info(run(clean, t0))
    assert [(f.kind, f.subject) for f in found] == [("lagging_replica", "c")]
    m = found[0].evidence["metrics"]["ttft"]
    # the bar it cleared travels in the evidence (the dashboard draws it)
    assert 1.7 < m["ratio_to_peers"] < 2.3 and m["ratio_ci"][0] > m["bar"] == replicas.MIN_EFFECT
    assert m["holm_p"] < replicas.ALPHA and any("offered load" in c for c in found[0].evidence["controlled_for"])


def test_a_25_percent_ttft_canary_is_found_beside_one_baseline_and_among_three(clean):
    for peers in (["base"], ["base", "other"]):
        clean.command("TRUNCATE TABLE requests")
        clean.command("TRUNCATE TABLE replicas")
        t0 = time.time() - 3600
        serve(clean, t0, {**{p: 1.0 for p in peers}, "canary": 1.25}, n=400, seed=11, ttft_only=True, spread=0.15)
        found = above_info(run(clean, t0))
        assert [f.subject for f in found] == ["canary"], peers
        metrics = found[0].evidence["metrics"]
        assert "ttft" in metrics and "itl" not in metrics and "tpot" not in metrics
        assert 1.15 < metrics["ttft"]["ratio_to_peers"] < 1.35 and found[0].severity == "warning"


def test_a_replica_that_took_far_more_load_is_not_called_slow_at_equal_load(clean):
    """busy took a calibration load (517 requests vs 31 on each peer): queued at arrival, its TTFT is
    ~1.5x; at equal load at arrival it is as fast as its peers."""
    rng = random.Random(12)
    t0 = time.time() - 3600
    clean.insert_records("replicas", [replica(r, t0 - 10) for r in ("busy", "p1", "p2")])
    steps, reqs = [], []

    def served(rid, j, t, loaded):
        queue = 0.03 if loaded else 0.001
        reqs.append(request(rid, j, t, queue=queue, ttft=queue + jittered(rng, 0.05), itl=jittered(rng, 0.01)))

    for i in range(int(150 / 0.25)):  # every replica steps all along: 1 running, or 8 + 6 waiting under load
        t = t0 + i * 0.25
        loaded = 30 <= t - t0 < 80
        steps.append(step("busy", i, t, num_seqs=8 if loaded else 1, num_waiting=6 if loaded else 0))
        for p in ("p1", "p2"):
            steps.append(step(p, i, t, num_seqs=1))
    for j in range(30):
        served("busy", j, t0 + j + 0.1, False)
    for j in range(457):
        served("busy", 30 + j, t0 + 30.1 + j * 0.1, True)
    for j in range(30):
        served("busy", 487 + j, t0 + 85.1 + j, False)
    for p in ("p1", "p2"):
        for j in range(31):
            served(p, j, t0 + 0.1 + j * 4.5, False)
    clean.insert_records("steps", steps)
    clean.insert_records("requests", reqs)
    busy = np.median([r.ttft_seconds for r in reqs if r.replica_id == "busy"])
    peers = np.median([r.ttft_seconds for r in reqs if r.replica_id != "busy"])
    assert busy / peers > 1.3  # the confound is there: pooled over load, busy looks slow
    assert above_info(run(clean, t0)) == []


def test_longer_outputs_are_not_a_slower_e2e(clean):
    """Same workload, same finish mix (every request runs to its own max_tokens), but long answers go to
    b 70% of the time: e2e compared within output-length buckets says nothing."""
    rng = random.Random(13)
    t0 = time.time() - 3600
    clean.insert_records("replicas", [replica(r, t0 - 10) for r in ("a", "b")])
    reqs = []
    for rid, long_share in (("a", 0.3), ("b", 0.7)):
        for j in range(300):
            n = 64 if rng.random() < long_share else 8
            reqs.append(request(rid, j, t0 + j, ttft=jittered(rng, 0.05), itl=jittered(rng, 0.01),
                                output_ids=list(range(10, 10 + n))))
    clean.insert_records("requests", reqs)
    assert above_info(run(clean, t0)) == []


def test_holm_over_replicas_and_metrics_keeps_a_lone_small_p_quiet(clean):
    """c is slower on TTFT (and so prefill and e2e) with few, noisy requests: each raw p is below alpha and
    each interval clears the minimum effect, but over replicas x metrics the family-wise error is not."""
    t0 = time.time() - 3600
    serve(clean, t0, {"a": 1.0, "b": 1.0, "c": 1.7}, n=22, seed=25, ttft_only=True, spread=0.6)
    # a probe round just before: load at arrival like the rest (one arrival a second), not compared itself
    clean.insert_records("requests", [request(r, 100 + j, t0 - 5 + j, workload=PROBE_WORKLOAD)
                                      for r in "abc" for j in range(5)])
    group = {rid: e for (_, rid), e in request_strata.samples(clean, Scope(start=t0 - 60)).items()}
    tests = replicas.tests(group, {})
    assert len(tests) >= 12  # 3 replicas x 6 metrics (those with comparable values)
    c = [t for t in tests if t["replica"] == "c" and t["metric"] == "ttft"][0]
    assert c["comparison"].p_value < replicas.ALPHA <= c["holm_p"]
    peers = [e for r, e in group.items() if r != "c"]
    full = stratified.compare(replicas._own(group["c"], "ttft"), replicas._pooled(peers, "ttft"),
                              replicas.FLOORS["ttft"], replicas.MIN_REQUESTS, bootstrap=True)
    assert full.ratio_ci[0] > replicas.MIN_EFFECT  # without the correction it would be a finding
    assert above_info(run(clean, t0)) == []


def test_a_significant_but_small_slowdown_is_not_a_lagging_replica(clean):
    # 1.06x over 1200 requests each is significant; its interval stays under the minimum effect
    t0 = time.time() - 3600
    serve(clean, t0, {"a": 1.0, "b": 1.06}, n=1200, seed=15, ttft_only=True, spread=0.1)
    group = {rid: e for (_, rid), e in request_strata.samples(clean, Scope(start=t0 - 60)).items()}
    b = [t for t in replicas.tests(group, {}) if t["replica"] == "b" and t["metric"] == "ttft"][0]
    assert b["holm_p"] < replicas.ALPHA
    assert above_info(run(clean, t0)) == []
