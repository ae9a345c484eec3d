"""Prefill and TTFT in strata of computed prompt tokens (diagnostics.replicas, request_strata.BY_COMPUTED):
a replica whose scheduler budget cuts each prompt into chunks, against its peers at the same computed
prompt tokens (prompt less prefix-cache hits), workload and offered load; Holm with the other metrics."""

from __future__ import annotations

import json
import random
import time

from diag_records import replica
from queue_fleet import poisson, serve

from diagnostics import replicas, request_strata
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope

OUTPUT_LEN = 3  # the real fleet's outputs were 2-3 tokens: little queueing, the damage is in the prefill
CPU_PER_TOKEN = 1e-4  # seconds per token in a step: a step-overhead-bound engine (real fleet: ~6 ms + 0.1 ms/token)


def fleet(store, t0, plan: dict, limits: dict | None = None) -> None:
    """plan: replica -> (arrivals, prompt lengths, cached tokens); limits: replica -> (max_num_seqs,
    max_num_batched_tokens), default (8, 2048). Each replica simulated step by step with chunked prefill."""
    limits = limits or {}
    rows = []
    for r in plan:
        seqs, budget = limits.get(r, (8, 2048))
        rows.append(replica(r, t0 - 10, config_hash=f"cfg-{seqs}-{budget}", config_json=json.dumps(
            {"model": "/m", "max_num_seqs": seqs, "max_num_batched_tokens": budget})))
    store.insert_records("replicas", rows)
    for k, (rid, (arrivals, prompts, cached)) in enumerate(sorted(plan.items())):
        seqs, budget = limits.get(rid, (8, 2048))
        reqs, steps = serve(rid, arrivals, max_seqs=seqs, budget=budget, seed=k, prompts=prompts, cached=cached,
                            per_token=CPU_PER_TOKEN, output_len=OUTPUT_LEN)
        store.insert_records("requests", reqs)
        store.insert_records("steps", steps)


def traffic(seed: int, t0: float, rate: float = 1.0, span: float = 200.0, short_share: float = 0.5):
    """Poisson arrivals; prompts of 72-150 tokens, 64 of them cached for 80% (the real fleet's mix), so
    16-86 computed; `short_share` of them short (computed <= 32)."""
    rng = random.Random(seed)
    arrivals = poisson(rng, rate, t0, t0 + span)
    prompts, cached = [], []
    for _ in arrivals:
        computed = rng.randint(8, 32) if rng.random() < short_share else rng.randint(33, 86)
        hit = 64 if rng.random() < 0.8 else 0
        prompts.append(computed + hit)
        cached.append(hit)
    return arrivals, prompts, cached


def above_info(findings):
    return [f for f in findings if f.severity != "info"]


def prefill_tests(store, t0):
    group = {rid: e for (_, rid), e in request_strata.samples(store, Scope(start=t0 - 1)).items()}
    return [t for t in replicas.tests(group, {}) if t["metric"] == "prefill"]


def test_a_canary_with_a_32_token_budget_is_named_by_its_prefill_at_equal_computed_tokens(clean):
    """max_num_seqs 1 and max_num_batched_tokens 32 beside 8 / 2048, at 1 req/s each: a prompt of 33-86
    computed tokens takes 2-3 steps, one step on the baseline; its steps are small, not slow."""
    t0 = time.time() - 3600
    fleet(clean, t0, {"base": traffic(1, t0), "canary": traffic(2, t0)}, {"canary": (1, 32)})
    found = above_info(replicas.run(clean, DiagnosticRequest(Scope(start=t0 - 1))))
    assert [(f.kind, f.subject) for f in found] == [("lagging_replica", "canary")]
    f = found[0]
    m = f.evidence["metrics"]["prefill"]
    assert m["ratio_ci"][0] > replicas.MIN_EFFECT and m["holm_p"] < replicas.ALPHA
    assert m["test_vs_peers"]["strata"] >= 3  # several computed-token buckets, compared like for like
    assert any("computed prompt tokens" in c for c in m["controlled_for"])
    # the scheduler limits that differ are named, with both values
    assert "max_num_batched_tokens 32 vs 2048" in f.summary and "max_num_seqs 1 vs 8" in f.summary
    assert "config_hash" not in f.summary  # the hash only where no key says more


def test_identical_replicas_give_prefill_tests_that_do_not_fire(clean):
    t0 = time.time() - 3600
    fleet(clean, t0, {r: traffic(10 + k, t0) for k, r in enumerate(("a", "b", "c"))})
    assert above_info(replicas.run(clean, DiagnosticRequest(Scope(start=t0 - 1)))) == []
    tests = prefill_tests(clean, t0)
    assert {t["replica"] for t in tests} == {"a", "b", "c"}  # compared, and alike
    assert all(t["holm_p"] >= replicas.ALPHA for t in tests)


def test_a_replica_whose_peers_got_more_cache_hits_is_not_slower_at_equal_computed_tokens(clean):
    """Every replica with the 32-token budget and the same prompt lengths; "short" gets 85% prompts of
    <= 32 computed tokens (the rest of the prompt cached), a and b 15%. In prompt-length strata b read
    1.57x slower on prefill (its peers' pool is short computed prompts at the same prompt length): its
    traffic, not its speed. Strata of computed tokens compare it at the same work."""
    t0 = time.time() - 3600
    plan = {"a": traffic(20, t0, short_share=0.15), "b": traffic(21, t0, short_share=0.15),
            "short": traffic(22, t0, short_share=0.85)}
    fleet(clean, t0, plan, {r: (8, 32) for r in plan})
    assert above_info(replicas.run(clean, DiagnosticRequest(Scope(start=t0 - 1)))) == []
    tests = prefill_tests(clean, t0)
    assert {t["replica"] for t in tests} == {"a", "b", "short"}
    assert all(t["comparison"].ratio < replicas.MIN_EFFECT for t in tests)
