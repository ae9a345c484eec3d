"""Replicas: the slow one is named with what about it differs; equal peers and short histories are not."""

from __future__ import annotations

import random
import time

from diag_records import jittered, replica, request

from diagnostics import replicas
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope


def serve(store, t0, specs: dict, n: int = 150, seed: int = 0):
    """specs: replica id -> (slowdown, replica overrides)."""
    rng = random.Random(seed)
    store.insert_records("replicas", [replica(rid, t0 - 10, **over) for rid, (_, over) in specs.items()])
    reqs = []
    for rid, (k, over) in specs.items():
        for j in range(n):
            batch = j % 3 == 0
            reqs.append(request(rid, j, t0 + j, ttft=jittered(rng, (0.06 if batch else 0.02) * k),
                                itl=jittered(rng, 0.01 * k), workload="batch" if batch else "chat",
                                prompt_ids=list(range(300 if batch else 20)),
                                model_name=over.get("model_name", "tiny")))
    store.insert_records("requests", reqs)


def test_the_pinned_replica_is_named_and_its_cpu_count_explains_it(clean):
    t0 = time.time() - 3600
    serve(clean, t0, {"r0": (1.0, {}), "r1": (1.0, {}), "r2": (1.0, {}),
                      "r3": (2.2, {"cpus": (1,), "numa_mismatch": True})})
    findings = replicas.run(clean, DiagnosticRequest(Scope(start=t0 - 60)))
    assert [f.subject for f in findings] == ["r3"]
    f = findings[0]
    assert f.kind == "lagging_replica" and f.severity == "critical"
    assert 1.8 < f.evidence["metrics"]["itl"]["ratio_to_peers"] < 2.6
    fields = {d["field"]: d for d in f.evidence["identity_differences"]}
    assert fields["cpu_count"]["replica"] == 1 and fields["cpu_count"]["peers"] == {"2": 3}
    assert fields["numa_mismatch"]["replica"] is True
    assert "cpu_count 1" in f.summary and f.evidence["peers"] == ["r0", "r1", "r2"]


def test_identical_replicas_yield_nothing(clean):
    t0 = time.time() - 3600
    serve(clean, t0, {f"r{i}": (1.0, {}) for i in range(4)}, seed=1)
    assert replicas.run(clean, DiagnosticRequest(Scope(start=t0 - 60))) == []


def test_a_replica_that_got_the_long_prompts_is_not_called_slow(clean):
    t0 = time.time() - 3600
    rng = random.Random(2)
    clean.insert_records("replicas", [replica(r, t0 - 10) for r in ("a", "b", "c")])
    reqs = []
    for rid, share in (("a", 0.1), ("b", 0.1), ("c", 0.9)):  # c mostly gets the slow batch prompts
        for j in range(200):
            batch = rng.random() < share
            reqs.append(request(rid, j, t0 + j, ttft=jittered(rng, 0.08 if batch else 0.02),
                                workload="batch" if batch else "chat", prompt_ids=list(range(300 if batch else 20))))
    clean.insert_records("requests", reqs)
    found = replicas.run(clean, DiagnosticRequest(Scope(start=t0 - 60)))
    # offered load counts tokens: c's 5 s windows carry ~6x its peers' (the long prompts), so at most it has
    # no like-for-like load, said as insufficient data (info)
    assert [f for f in found if f.severity != "info"] == []
    assert all(f.kind == "insufficient_data" and f.subject == "c" for f in found)


def test_a_replica_with_few_requests_is_insufficient_data_and_other_models_are_separate(clean):
    t0 = time.time() - 3600
    serve(clean, t0, {"r0": (1.0, {}), "r1": (1.0, {}), "lone": (3.0, {"model_name": "other"})}, seed=3)
    clean.insert_records("requests", [request("new", j, t0 + j) for j in range(5)])
    findings = {f.subject: f for f in replicas.run(clean, DiagnosticRequest(Scope(start=t0 - 60)))}
    assert set(findings) == {"new"}  # "lone" is the only replica of its model: no peers, no verdict
    assert findings["new"].severity == "info" and findings["new"].insufficient
