"""Regression: a slower version is found per stratum with its effect size; mix shifts and noise are not."""

from __future__ import annotations

import random
import time

import pytest
from diag_records import jittered, replica, request, step

from diagnostics import regression
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope


def fleet(store, t0, slow: dict[str, float], n: int = 300, versions=("0.1.0", "0.1.0", "0.2.0"), seed: int = 0):
    """Three replicas; `slow` scales TTFT and ITL of the named replicas' requests."""
    rng = random.Random(seed)
    store.insert_records("replicas", [replica(f"r{i}", t0 - 10, version=v) for i, v in enumerate(versions)])
    reqs, steps = [], []
    for i in range(len(versions)):
        rid = f"r{i}"
        k = slow.get(rid, 1.0)
        for j in range(n):
            workload = "chat" if j % 2 else "batch"
            prompt = list(range(20 if workload == "chat" else 300))  # two prompt-length buckets
            base = 0.02 if workload == "chat" else 0.08
            reqs.append(request(rid, j, t0 + j * 2 + i * 0.1, ttft=jittered(rng, base * k),
                                itl=jittered(rng, 0.01 * k), workload=workload, prompt_ids=prompt))
            steps.append(step(rid, j, t0 + j * 2 + i * 0.1, duration=jittered(rng, 0.01 * k), forward=0.005))
    store.insert_records("requests", reqs)
    store.insert_records("steps", steps)


def test_a_slower_version_is_a_regression_with_strata_and_intervals(clean):
    t0 = time.time() - 3600
    fleet(clean, t0, {"r2": 1.5})
    findings = regression.compare(clean, Scope(versions=("0.1.0",), name="version=0.1.0"),
                                  Scope(versions=("0.2.0",), name="version=0.2.0"))
    by_subject = {f.subject: f for f in findings}
    ttft = by_subject["ttft: version=0.2.0 vs version=0.1.0"]
    assert ttft.kind == "regression" and ttft.severity in ("warning", "critical")
    worst = ttft.evidence["worst_stratum"]
    assert 1.3 < worst["ratio"] < 1.7 and worst["ratio_ci"][0] > 1.2 and worst["p_adjusted"] < 0.01
    assert {s["stratum"] for s in ttft.evidence["strata"]} == {"chat / prompt<64", "batch / prompt 256-1023"}
    assert all(s["verdict"] == "regression" for s in ttft.evidence["strata"])
    assert by_subject["itl: version=0.2.0 vs version=0.1.0"].kind == "regression"
    assert by_subject["step_host: version=0.2.0 vs version=0.1.0"].kind == "regression"
    assert by_subject["step_throughput: version=0.2.0 vs version=0.1.0"].kind == "regression"  # lower is worse
    assert "queue: version=0.2.0 vs version=0.1.0" not in by_subject  # unchanged


def test_the_same_speed_yields_nothing_and_improvements_are_info(clean):
    t0 = time.time() - 3600
    fleet(clean, t0, {"r0": 1.4, "r1": 1.4}, seed=1)  # 0.1.0 slower: 0.2.0 improved
    findings = regression.compare(clean, Scope(versions=("0.1.0",)), Scope(versions=("0.2.0",)))
    assert findings and all(f.severity == "info" for f in findings)
    assert {f.kind for f in findings} == {"improvement"}
    same = regression.compare(clean, Scope(replicas=("r0",)), Scope(replicas=("r1",)))
    assert same == []


def test_a_different_traffic_mix_is_not_a_regression(clean):
    """Candidate sees mostly the slow workload: pooled it looks slower, per stratum it is not."""
    t0 = time.time() - 3600
    rng = random.Random(2)
    clean.insert_records("replicas", [replica("a", t0 - 10, version="1"), replica("b", t0 - 10, version="2")])
    reqs = []
    for j in range(400):
        for rid, share_batch in (("a", 0.2), ("b", 0.8)):
            batch = rng.random() < share_batch
            reqs.append(request(rid, j, t0 + j, ttft=jittered(rng, 0.08 if batch else 0.02),
                                workload="batch" if batch else "chat", prompt_ids=list(range(300 if batch else 20))))
    clean.insert_records("requests", reqs)
    findings = regression.compare(clean, Scope(versions=("1",)), Scope(versions=("2",)), metrics=("ttft",))
    assert findings == []


def test_too_few_requests_is_insufficient_data(clean):
    t0 = time.time() - 3600
    clean.insert_records("replicas", [replica("a", t0, version="1"), replica("b", t0, version="2")])
    clean.insert_records("requests", [request(r, j, t0 + j) for r in ("a", "b") for j in range(5)])
    findings = regression.compare(clean, Scope(versions=("1",)), Scope(versions=("2",)), metrics=("ttft", "e2e"))
    assert [f.severity for f in findings] == ["info", "info"]
    assert all(f.insufficient and f.summary.startswith("insufficient data") for f in findings)


def test_run_compares_versions_in_order_and_finds_the_creeping_change_point(clean):
    t0 = time.time() - 3600
    rng = random.Random(3)
    clean.insert_records("replicas", [replica("r0", t0 - 10, version="0.9.0"),
                                      replica("r0", t0 + 1500, version="0.10.0")])
    # latency steps up 1.8x at t0 + 1000 (inside 0.9.0: a regression that crept in, not an upgrade)
    reqs = [request("r0", j, t0 + j, ttft=jittered(rng, 0.02 * (1.8 if j >= 1000 else 1.0)),
                    itl=jittered(rng, 0.01)) for j in range(2000)]
    clean.insert_records("requests", reqs)
    findings = regression.run(clean, DiagnosticRequest(Scope(start=t0 - 60)))
    creep = [f for f in findings if f.kind == "latency_change_point"]
    ttft = next(f for f in creep if f.subject.startswith("ttft"))
    assert ttft.severity == "warning" and abs(ttft.evidence["change_at"] - (t0 + 1000)) < 60
    assert 1.6 < ttft.evidence["comparison"]["ratio"] < 2.0
    assert not any(f.subject.startswith("itl") and f.severity != "info" for f in creep)
    # the version pair compared is 0.9.0 -> 0.10.0 (version order, not text order)
    assert any(f.subject == "ttft: version=0.10.0 vs version=0.9.0" for f in findings)


def test_probe_rounds_are_not_a_change_point(clean):
    """Probes come in rounds (alone, or in a burst of fillers): their latency follows the prober.
    Served traffic flat, probes 3x slower in the second half: no change point."""
    t0 = time.time() - 3600
    rng = random.Random(5)
    clean.insert_records("replicas", [replica("r0", t0 - 10)])
    reqs = [request("r0", j, t0 + j, ttft=jittered(rng, 0.02), itl=jittered(rng, 0.01)) for j in range(1000)]
    reqs += [request("r0", 5000 + j, t0 + j + 0.5, ttft=jittered(rng, 0.02 * (3.0 if j >= 500 else 1.0)),
                     itl=jittered(rng, 0.01 * (3.0 if j >= 500 else 1.0)), workload="probe") for j in range(1000)]
    clean.insert_records("requests", reqs)
    creep = regression.creep(clean, Scope(start=t0 - 60))
    assert not [f for f in creep if f.severity != "info"], [f.summary for f in creep]


def test_compare_groups_is_what_the_dashboard_shows(clean):
    t0 = time.time() - 3600
    fleet(clean, t0, {"r2": 2.0})
    result = regression.compare_groups(clean, baseline_replicas=["r0", "r1"], candidate_replicas=["r2"],
                                       start=t0 - 60, end=time.time())
    assert result.regressed and "time to first token regression" in result.summary
    assert {"metric", "stratum", "ratio", "mwu_p", "ks_p", "verdict"} <= set(result.table[0])
    assert result.evidence["strata"] == result.table
    quiet = regression.compare_groups(clean, baseline_replicas=["r0"], candidate_replicas=["r1"],
                                      start=t0 - 60, end=time.time())
    assert not quiet.regressed and quiet.summary.startswith("no significant regression")


@pytest.mark.parametrize("metric", list(regression.METRICS))
def test_every_metric_has_a_label_and_direction(metric):
    table, expr, higher_is_worse = regression.METRICS[metric]
    assert table in ("requests", "steps") and metric in regression.LABELS and isinstance(higher_is_worse, bool)


def test_versions_of_two_engines_are_not_paired_as_an_upgrade(clean):
    t0 = time.time() - 3600
    clean.insert_records("replicas", [replica("r0", t0 - 10, version="0.1.0"),
                                      replica("v0", t0 - 5, version="vllm-0.31.0"),
                                      replica("v0", t0 + 500, version="vllm-0.32.0")])
    rng = random.Random(5)
    clean.insert_records("requests", [request(rid, j, t0 + j + (600 if v == "vllm-0.32.0" else 0),
                                              ttft=jittered(rng, 0.02), itl=jittered(rng, 0.01))
                                      for rid, v in (("r0", "0.1.0"), ("v0", "vllm-0.31.0"), ("v0", "vllm-0.32.0"))
                                      for j in range(60)])
    pairs = [(b.versions, c.versions) for b, c in regression.version_pairs(clean, Scope(start=t0 - 60))]
    assert pairs == [(("vllm-0.31.0",), ("vllm-0.32.0",))]  # vllm's own upgrade; never 0.1.0 -> vllm-*
    assert regression.engine_of("vllm-0.32.0") == "vllm" and regression.engine_of("0.1.0") == "infersight"
    assert regression.engine_of("0.2.0-rc1") == "infersight"
