"""The stratified tail rule (diagnostics.tail_latency, called by diagnostics.replicas): p90 of queue time
and TTFT against the peers' in the same strata, a block bootstrap over time, Holm with the median tests."""

from __future__ import annotations

import json
import random
import time

import numpy as np
from diag_records import replica
from queue_fleet import poisson, serve

from diagnostics import replicas, request_strata, tail_latency
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope


def fleet(store, t0, plan: dict, limits: dict | None = None) -> dict:
    """plan: replica -> (arrivals, prompt lengths or None); limits: replica -> max_num_seqs (default 8).
    Each replica simulated step by step (tests/diagnostics/queue_fleet): its queue comes from its own speed."""
    limits = limits or {}
    store.insert_records("replicas", [replica(r, t0 - 10, config_hash=f"cfg-{limits.get(r, 8)}",
                                              config_json=json.dumps({"model": "/m", "max_num_seqs": limits.get(r, 8)}))
                                      for r in plan])
    out = {}
    for k, (rid, (arrivals, prompts)) in enumerate(sorted(plan.items())):
        reqs, steps = serve(rid, arrivals, max_seqs=limits.get(rid, 8), seed=k, prompts=prompts)
        store.insert_records("requests", reqs)
        store.insert_records("steps", steps)
        out[rid] = np.array([r.ttft_seconds for r in reqs])
    return out


def above_info(findings):
    return [f for f in findings if f.severity != "info"]


def test_a_replica_held_to_one_sequence_at_moderate_load_is_named_by_its_tail_not_its_median(clean):
    """1.5 req/s each: the canary (max_num_seqs 1) serves most requests at once, so its median TTFT is
    its peer's; the requests that arrive while one is running wait for it to finish. The tail shows
    what the median does not."""
    t0 = time.time() - 3600
    plan = {r: (poisson(random.Random(20 + k), 1.5, t0, t0 + 150), None) for k, r in enumerate(("base", "canary"))}
    ttft = fleet(clean, t0, plan, {"canary": 1})
    assert 0.9 < np.median(ttft["canary"]) / np.median(ttft["base"]) < 1.1  # the median does not move
    assert np.quantile(ttft["canary"], 0.9) / np.quantile(ttft["base"], 0.9) > 3  # the tail does
    found = above_info(replicas.run(clean, DiagnosticRequest(Scope(start=t0 - 1))))
    assert [(f.kind, f.subject) for f in found] == [("lagging_replica", "canary")]
    f = found[0]
    assert set(f.evidence["metrics"]) <= {"queue_p90", "ttft_p90"}  # no median verdict: the tail named it
    tail = f.evidence["metrics"]["ttft_p90"]
    assert tail["ratio_ci"][0] > 2 and tail["holm_p"] < replicas.ALPHA
    assert tail["test_vs_peers"]["above_peer_quantile"] > 0.3 and tail["test_vs_peers"]["blocks"] >= 8
    assert f.summary.startswith("canary's p90 ")
    assert "max_num_seqs 1 vs 8" in f.summary and "block bootstrap" in f.summary
    assert "p90" in f.evidence["correction"] and f.evidence["unit"] == "request"


def test_a_replica_sent_most_of_the_long_prompts_is_not_named_for_its_longer_tail(clean):
    """Same request rate and speed; "long" gets 80% 100-token prompts, its peers 20%. Its short
    requests wait behind long prefills: a longer tail at the same request rate, from its traffic.
    Offered load counts tokens, so it is compared with its peers' moments of as many tokens."""
    t0 = time.time() - 3600
    plan = {}
    for k, rid in enumerate(("a", "b", "long")):
        rng = random.Random(30 + k)
        arrivals = poisson(rng, 1.5, t0, t0 + 150)
        share = 0.8 if rid == "long" else 0.2
        plan[rid] = (arrivals, [100 if rng.random() < share else 16 for _ in arrivals])
    ttft = fleet(clean, t0, plan)
    assert np.quantile(ttft["long"], 0.9) / np.quantile(ttft["a"], 0.9) > 1.5
    assert above_info(replicas.run(clean, DiagnosticRequest(Scope(start=t0 - 1)))) == []


def test_identical_replicas_give_tail_tests_that_do_not_fire(clean):
    t0 = time.time() - 3600
    plan = {r: (poisson(random.Random(40 + k), 1.5, t0, t0 + 150), None) for k, r in enumerate(("a", "b", "c"))}
    fleet(clean, t0, plan)
    found = replicas.run(clean, DiagnosticRequest(Scope(start=t0 - 1)))
    assert above_info(found) == []
    group = {rid: e for (_, rid), e in request_strata.samples(clean, Scope(start=t0 - 1)).items()}
    tail = [t for t in replicas.tests(group, {}) if t["metric"] in replicas.TAIL]
    assert {t["replica"] for t in tail} == {"a", "b", "c"}  # the tail was compared, and is alike
    assert all(t["holm_p"] >= replicas.ALPHA for t in tail)


def test_the_p90_is_unbiased_whatever_the_sides_sizes():
    """The same distribution, 100 requests per stratum against 10: a q (n - 1) + 1 quantile puts the
    small side's p90 ~20% lower (its 9th of 10 values); q (n + 1) does not."""
    rng = np.random.default_rng(0)
    x = {s: rng.exponential(1.0, 100) for s in range(40)}
    y = {s: rng.exponential(1.0, 10) for s in range(40)}
    at = {s: np.linspace(0, 100, 100) for s in range(40)}
    c = tail_latency.compare(x, at, y, {s: np.linspace(0, 100, 10) for s in range(40)}, 1e-3, 20)
    assert 0.9 < c.ratio < 1.1
    v = rng.normal(size=37)
    assert np.isclose(tail_latency.quantile_at(np.sort(v), np.ones((1, 37)))[0], np.quantile(v, 0.9, method="weibull"))
    counts = rng.integers(0, 3, (1, 37)).astype(float)  # multiplicities read as repeated values
    assert np.isclose(tail_latency.quantile_at(np.sort(v), counts)[0],
                      np.quantile(np.repeat(np.sort(v), counts[0].astype(int)), 0.9, method="weibull"))


def drifting(rng, phi: float = 0.9, sd: float = 0.5, n: int = 600, span: float = 300.0):
    """Latencies whose level drifts (log level AR(1) per second): requests close in time are alike."""
    t = np.sort(rng.uniform(0, span, n))
    level = np.zeros(int(span) + 1)
    noise = rng.normal(0, sd * np.sqrt(1 - phi ** 2), len(level))
    for i in range(1, len(level)):
        level[i] = phi * level[i - 1] + noise[i]
    return np.exp(level[t.astype(int)]) * rng.exponential(0.05, n), t


def test_a_drifting_clean_pair_is_not_significant_under_the_block_bootstrap():
    """Two replicas alike but each with its own slow spells: by chance one's p90 reads 1.5x. Resampled
    request by request that is p < 0.001; resampled by time blocks, as it must be, not significant."""
    rng = np.random.default_rng(26)
    (y, ty), (x, tx) = drifting(rng), drifting(rng)
    c = tail_latency.compare({"s": x}, {"s": tx}, {"s": y}, {"s": ty}, 1e-3, 20)
    assert c.ratio > 1.4 and c.blocks >= tail_latency.MIN_BLOCKS
    assert c.p_value > 0.01 and c.ratio_ci[0] < replicas.MIN_EFFECT


def test_a_long_tail_over_too_short_a_window_says_it_needs_more_time_blocks(clean):
    """The same canary held to one sequence, over 35 s of traffic: its p90 reads far past the bar, but 35 s
    are 7 blocks of 5 s, fewer than the block bootstrap needs. That is said (insufficient data, how long),
    not left as a silent p = 1."""
    t0 = time.time() - 7200
    plan = {r: (poisson(random.Random(60 + k), 1.5, t0, t0 + 35), None) for k, r in enumerate(("base", "canary"))}
    fleet(clean, t0, plan, {"canary": 1})
    found = replicas.run(clean, DiagnosticRequest(Scope(start=t0 - 1, end=t0 + 60)))
    assert above_info(found) == []
    short = [f for f in found if f.insufficient and f.subject == "canary" and "tails" in f.evidence]
    assert len(short) == 1, [f.summary for f in found]
    tails = short[0].evidence["tails"]
    assert all(t["ratio"] >= replicas.MIN_EFFECT and t["blocks"] < tail_latency.MIN_BLOCKS for t in tails.values())
    assert "time blocks of 5 s" in short[0].summary and "needs them in 8" in short[0].summary
    assert not [f for f in found if f.insufficient and f.subject == "base" and "tails" in f.evidence]
    assert len({f.finding_id for f in found}) == len(found)  # it stands in for no other finding
