"""Speculative acceptance with the request as the unit: overdispersion, relative drops, workload mix, Holm."""

from __future__ import annotations

import random
import time

from spec_traffic import exact_traffic, spec_replica, spec_traffic

from diagnostics import speculative
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope
from evals.stats import ClusterSums, compare_ratios, two_proportions


def insert(store, replicas, traffic):
    store.insert_records("replicas", replicas)
    store.insert_records("requests", [r for reqs, _ in traffic for r in reqs])
    store.insert_records("steps", [s for _, steps in traffic for s in steps])


def above_info(findings):
    return [f for f in findings if f.severity != "info"]


def test_identical_replicas_with_overdispersed_requests_are_not_a_drop(clean):
    """Per-request acceptance ~ Beta(2, 2): a token-level z test calls b 33% (13 points) lower at p ~ 1e-20;
    between requests the spread is ~15x the binomial variance, and the request-level test does not fire."""
    t0 = time.time() - 3600

    def plan(seed):
        rng = random.Random(seed)
        return [("chat", rng.betavariate(2, 2), 20) for _ in range(40)]

    a, b = spec_traffic("a", t0, plan(38), seed=19), spec_traffic("b", t0, plan(39), seed=1019)
    insert(clean, [spec_replica("a", t0), spec_replica("b", t0)], [a, b])
    acc_a, acc_b = (sum(r.spec_accepted for r in reqs) for reqs, _ in (a, b))
    tokens = two_proportions(acc_a, 2400, acc_b, 2400)
    assert tokens.p_value < 1e-10 and tokens.difference < -0.10  # what the token-level rule fired on
    findings = speculative.run(clean, DiagnosticRequest(Scope(start=t0 - 60)))
    assert above_info(findings) == [], [f.summary for f in findings]


def test_a_22_percent_relative_drop_at_low_acceptance_fires(clean):
    """9.9% -> 7.7% over 3,000 proposals per side (300 requests of 10, binomial within a request): 2.2 points,
    below the 10-point floor, but 22% relative. Needed: ~2,600 proposals per side for Holm over the two
    comparisons at alpha 0.01 (z >= 2.81) when requests are not overdispersed (times the design effect if
    they are), in 20+ requests; with 1,500 per side it is not significant."""
    t0 = time.time() - 3600
    insert(clean, [spec_replica("a", t0, k=1), spec_replica("b", t0, k=1)],
           [exact_traffic("a", t0, 300, 10, 297, seed=1), exact_traffic("b", t0, 300, 10, 231, seed=2)])
    (f,) = above_info(speculative.run(clean, DiagnosticRequest(Scope(start=t0 - 60))))
    assert f.subject == "b" and f.kind == "spec_acceptance_drop" and f.severity == "warning"
    o = f.evidence["overall"]
    assert abs(o["rate_baseline"] - 0.099) < 1e-9 and abs(o["rate_candidate"] - 0.077) < 1e-9
    assert o["relative_ci"][1] < 0 and o["relative"] < -0.2 and f.evidence["unit"] == "request"
    assert f.evidence["p_adjusted"] < speculative.ALPHA
    assert "per request" in f.summary and f.evidence_json()  # the store takes it (finite, JSON)


def test_half_the_proposals_is_not_enough_for_the_same_drop(clean):
    t0 = time.time() - 3600
    insert(clean, [spec_replica("a", t0, k=1), spec_replica("b", t0, k=1)],
           [exact_traffic("a", t0, 150, 10, 149, seed=1), exact_traffic("b", t0, 150, 10, 115, seed=2)])
    assert above_info(speculative.run(clean, DiagnosticRequest(Scope(start=t0 - 60)))) == []


def test_more_of_a_low_acceptance_workload_is_not_a_drop(clean):
    """code accepts 60%, chat 20% on both replicas; b served 80% chat. Pooled, b is far lower; per workload
    (standardised to the pooled mix) it is not."""
    t0 = time.time() - 3600
    rng = random.Random(3)

    def plan(share_chat):
        return [("chat", 0.2, 10) if rng.random() < share_chat else ("code", 0.6, 10) for _ in range(400)]

    a, b = spec_traffic("a", t0, plan(0.2), k=1, seed=4), spec_traffic("b", t0, plan(0.8), k=1, seed=5)
    insert(clean, [spec_replica("a", t0, k=1), spec_replica("b", t0, k=1)], [a, b])
    pooled = [ClusterSums.of([r.spec_accepted for r in reqs], [r.spec_proposed for r in reqs])
              for reqs, _ in (a, b)]
    unstratified = compare_ratios({"all": pooled[0]}, {"all": pooled[1]})
    assert unstratified.p_value < 1e-10 and unstratified.relative < -0.3  # what an unstratified test would say
    findings = speculative.run(clean, DiagnosticRequest(Scope(start=t0 - 60)))
    assert above_info(findings) == [], [f.summary for f in findings]


def test_holm_over_replicas_keeps_a_chance_drop_among_twelve_quiet(clean):
    """Twelve identical replicas: r-something is 33% lower than its peers at p = 0.003 by chance alone;
    over twelve comparisons that is no evidence (Holm-adjusted p = 0.03)."""
    t0 = time.time() - 3600
    rng = random.Random(24)
    traffic = []
    for i in range(12):
        plan = [("chat", rng.betavariate(2, 3), 8) for _ in range(25)]
        traffic.append(spec_traffic(f"r{i}", t0, plan, seed=24 * 100 + i))
    insert(clean, [spec_replica(f"r{i}", t0) for i in range(12)], traffic)
    scope = Scope(start=t0 - 60)
    rows = speculative.acceptance(clean, scope)
    raw = [speculative.compare_groups(speculative.pool([x for x in rows if x is not r]), speculative.pool([r]))
           for r in rows]
    assert min(c["overall"].p_value for c in raw) < speculative.ALPHA  # significant before the correction
    assert above_info(speculative.run(clean, DiagnosticRequest(scope))) == []


def test_a_real_drop_on_one_of_twelve_survives_holm(clean):
    t0 = time.time() - 3600
    rng = random.Random(7)
    traffic = []
    for i in range(12):
        mean = 0.2 if i == 5 else 0.45
        plan = [("chat", min(0.95, max(0.01, rng.gauss(mean, 0.05))), 8) for _ in range(60)]
        traffic.append(spec_traffic(f"r{i}", t0, plan, seed=i, spacing=10.0))  # 60 blocks for positions
    insert(clean, [spec_replica(f"r{i}", t0) for i in range(12)], traffic)
    found = above_info(speculative.run(clean, DiagnosticRequest(Scope(start=t0 - 60))))
    assert [f.subject for f in found] == ["r5"]
    assert found[0].evidence["dropped_positions"] and found[0].evidence["unit"] == "request"
