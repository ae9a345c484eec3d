"""Speculative acceptance drops per position; host overhead shares and outliers."""

from __future__ import annotations

import json
import random
import time

from diag_records import jittered, replica, step

from diagnostics import overhead, speculative
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope
from telemetry.contract.records import ProfileRecord

SPEC = {"speculative_mode": "draft", "config_json": json.dumps({"model": "/x", "num_speculative_tokens": 3})}


def spec_steps(rid, t0, rates, n=300, seed=0):
    """Steps with one 3-token draft per sequence; position i accepted with probability rates[i] (given i-1)."""
    rng = random.Random(seed)
    out = []
    for j in range(n):
        per_pos = [0, 0, 0]
        accepted = 0
        for _ in range(4):  # four sequences per step
            for pos in range(3):
                if rng.random() >= rates[pos]:
                    break
                per_pos[pos] += 1
                accepted += 1
        out.append(step(rid, j, t0 + j, spec_proposed=12, spec_accepted=accepted, per_pos=per_pos))
    return out


def test_a_replica_whose_later_positions_are_rejected_is_named(clean):
    t0 = time.time() - 3600
    clean.insert_records("replicas", [replica(r, t0 - 10, **SPEC) for r in ("r0", "r1", "r2")])
    clean.insert_records("steps", spec_steps("r0", t0, [0.8, 0.7, 0.6], seed=1)
                         + spec_steps("r1", t0, [0.8, 0.7, 0.6], seed=2)
                         + spec_steps("r2", t0, [0.8, 0.3, 0.3], seed=3))
    findings = speculative.run(clean, DiagnosticRequest(Scope(start=t0 - 60)))
    assert [f.subject for f in findings] == ["r2"]
    f = findings[0]
    assert f.kind == "spec_acceptance_drop" and f.severity == "critical"
    dropped = {p["position"] for p in f.evidence["dropped_positions"]}
    assert dropped == {1, 2}  # position 0 is as good as its peers'
    pos0 = f.evidence["positions"][0]
    assert abs(pos0["rate_b"] - 0.8) < 0.05  # accepted/(proposed/k) is exact with full-length drafts
    assert f.evidence["chi_square"][1] < 1e-6


def test_equal_acceptance_and_too_few_drafts(clean):
    t0 = time.time() - 3600
    clean.insert_records("replicas", [replica(r, t0 - 10, **SPEC) for r in ("a", "b", "c")])
    clean.insert_records("steps", spec_steps("a", t0, [0.7] * 3, seed=4) + spec_steps("b", t0, [0.7] * 3, seed=5)
                         + spec_steps("c", t0, [0.7] * 3, n=3, seed=6))
    findings = speculative.run(clean, DiagnosticRequest(Scope(start=t0 - 60)))
    assert [(f.subject, f.severity, f.insufficient) for f in findings] == [("c", "info", True)]


def test_versions_compared_with_explicit_sides(clean):
    t0 = time.time() - 3600
    clean.insert_records("replicas", [replica("r0", t0 - 10, version="1.0", **SPEC),
                                      replica("r1", t0 - 10, version="1.1", **SPEC)])
    clean.insert_records("steps", spec_steps("r0", t0, [0.8, 0.7, 0.6], seed=7)
                         + spec_steps("r1", t0, [0.5, 0.4, 0.3], seed=8))
    scope = Scope(start=t0 - 60)
    (f,) = speculative.run(clean, DiagnosticRequest(scope, scope.with_side("version=1.0"),
                                                     scope.with_side("version=1.1")))
    assert f.subject == "version=1.1 vs version=1.0" and f.evidence["overall_drop"]


def test_host_overhead_shares_and_the_outlier(clean):
    t0 = time.time() - 3600
    rng = random.Random(9)
    clean.insert_records("replicas", [replica(r, t0 - 10) for r in ("r0", "r1", "r2")]
                         + [replica("gpu", t0 - 10, device="cuda:0", model_name="big")])
    steps = []
    for rid, host in (("r0", 0.003), ("r1", 0.003), ("r2", 0.012)):  # r2 spends 4x the host time per step
        steps += [step(rid, j, t0 + j, duration=0.007 + jittered(rng, host), forward=0.007) for j in range(200)]
    steps += [step("gpu", j, t0 + j, duration=0.010, forward=0.004) for j in range(100)]  # 60% host on a GPU
    clean.insert_records("steps", steps)
    clean.insert_records("profiles", [ProfileRecord("p1", "r2", 1, t0, 10, "a;b", 30, "scheduler"),
                                      ProfileRecord("p1", "r2", 1, t0, 10, "a;c", 10, "forward")])
    findings = overhead.run(clean, DiagnosticRequest(Scope(start=t0 - 60)))
    shares = {f.subject: f for f in findings if f.kind == "host_overhead"}
    assert set(shares) == {"r0", "r1", "r2", "gpu"}
    assert shares["gpu"].severity == "critical" and abs(shares["gpu"].evidence["host_share"] - 0.6) < 1e-6
    assert all(shares[r].severity == "info" for r in ("r0", "r1", "r2"))  # on a CPU the share alone is info
    assert shares["r2"].evidence["profile"]["group_shares"] == {"scheduler": 0.75, "forward": 0.25}
    outliers = [f for f in findings if f.kind == "host_overhead_outlier"]
    assert [f.subject for f in outliers] == ["r2"] and outliers[0].evidence["ratio_to_peers"] > 3


def test_an_engine_without_a_host_split_is_not_a_peer_to_compare_with(clean):
    # a vLLM replica (its stat logger reports each step as all forward) beside two infersight replicas: the
    # infersight replicas' host time must not read as an infinite outlier over the vLLM replica's zero
    t0 = time.time() - 3600
    rng = random.Random(4)
    clean.insert_records("replicas", [replica(r, t0 - 10) for r in ("r0", "r1")]
                         + [replica("v0", t0 - 10, version="vllm-0.32.0")])
    steps = []
    for rid in ("r0", "r1"):
        steps += [step(rid, j, t0 + j, duration=0.007 + jittered(rng, 0.003), forward=0.007) for j in range(200)]
    steps += [step("v0", j, t0 + j, duration=0.009, forward=0.009) for j in range(200)]
    clean.insert_records("steps", steps)
    findings = overhead.run(clean, DiagnosticRequest(Scope(start=t0 - 60)))
    assert not [f for f in findings if f.kind == "host_overhead_outlier"], [f.summary for f in findings]
    (v0,) = [f for f in findings if f.subject == "v0"]
    assert v0.severity == "info" and "no host / forward split" in v0.summary
