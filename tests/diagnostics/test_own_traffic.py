"""Own traffic: a replica whose queue fills because it was sent heavier output (the same offered tokens, 8x the
output per request) is not called lagging above info; one that is slower per step, or is sent the same
traffic and waits, still is."""

from __future__ import annotations

import json
import random
import time

from diag_records import jittered, replica, request, step

from diagnostics import replicas
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope

SPAN = 150  # seconds of traffic
MAX_NUM_SEQS = 8


def _config(max_num_seqs: int = MAX_NUM_SEQS) -> str:
    return json.dumps({"model": "/nonexistent", "quantization": "none", "max_num_seqs": max_num_seqs})


def _replica_traffic(rid, t0, rng, *, per_second, output, queue, step_factor=1.0, saturated=False):
    """`per_second` requests of 20 prompt tokens and `output` output tokens, waiting `queue` s each; steps of
    every batch size 1..MAX_NUM_SEQS (time linear in it, times `step_factor` in the forward pass), those at
    MAX_NUM_SEQS with requests waiting when `saturated`."""
    reqs, steps = [], []
    for j in range(int(SPAN * per_second)):
        t = t0 + j / per_second
        q = jittered(rng, queue)
        reqs.append(request(rid, j, t, queue=q, ttft=q + jittered(rng, 0.02), itl=jittered(rng, 0.01),
                            prompt_ids=list(range(20)), output_ids=list(range(100, 100 + output))))
    for i in range(SPAN * 20):
        seqs = 1 + i % MAX_NUM_SEQS
        host = 0.002
        forward = (0.004 + 0.001 * seqs) * step_factor
        steps.append(step(rid, i, t0 + i / 20, duration=host + forward, forward=forward, num_seqs=seqs,
                          num_running=seqs, num_waiting=3 if saturated and seqs == MAX_NUM_SEQS else 0,
                          num_context_tokens=seqs * 40))
    return reqs, steps


def fleet(store, t0, specs: dict, seed: int = 0, configs: dict | None = None):
    rng = random.Random(seed)
    configs = configs or {}
    store.insert_records("replicas", [replica(rid, t0 - 10, config_json=configs.get(rid, _config()))
                                      for rid in specs])
    reqs, steps = [], []
    for rid, s in specs.items():
        r, st = _replica_traffic(rid, t0, rng, **s)
        reqs += r
        steps += st
    store.insert_records("requests", reqs)
    store.insert_records("steps", steps)


def _lagging(store, t0) -> dict:
    return {f.subject: f for f in replicas.run(store, DiagnosticRequest(Scope(start=t0 - 60)))
            if f.kind == replicas.KIND}


# the fleet's tenant: 3 requests/s of 20 + 8 tokens; the other tenant: 1/s of 20 + 64 (the same 84 offered
# tokens a second, 64 sequence-steps a second against 24)
FLEET = {"per_second": 3.0, "output": 8, "queue": 0.002}
TENANT = {"per_second": 1.0, "output": 64}


def test_heavier_output_tenant_on_a_healthy_replica_is_kept_at_info(clean):
    t0 = time.time() - 3600
    fleet(clean, t0, {"r0": FLEET, "r1": {**TENANT, "queue": 0.08, "saturated": True}})
    found = _lagging(clean, t0)
    assert "r0" not in found
    f = found["r1"]  # it does wait 40x longer, for what it was sent: said, at info
    assert f.severity == "info"
    assert [m["mechanism"] for m in f.evidence["mechanisms"]] == ["queue_at_max_num_seqs"]
    own = f.evidence["own_traffic"]
    assert own["severity_before"] == "critical"
    assert 2.4 < own["heavier"] < 2.9  # 64 vs 24 sequence-steps a second
    assert 0.95 < own["step_time_ratio"]["ratio"] < 1.05
    assert "its own traffic, not a fault" in f.summary and "2.7x" in f.summary


def test_heavier_output_tenant_on_a_replica_slower_per_step_is_still_lagging(clean):
    t0 = time.time() - 3600
    fleet(clean, t0, {"r0": FLEET, "r1": {**TENANT, "queue": 0.08, "saturated": True, "step_factor": 1.4}})
    f = _lagging(clean, t0)["r1"]
    assert f.severity == "critical" and "own_traffic" not in f.evidence
    assert "its own traffic" not in f.summary


def test_the_same_traffic_on_a_replica_that_waits_is_still_lagging(clean):
    t0 = time.time() - 3600
    fleet(clean, t0, {"r0": FLEET, "r1": {**FLEET, "queue": 0.08, "saturated": True}})
    f = _lagging(clean, t0)["r1"]
    assert f.severity == "critical" and "own_traffic" not in f.evidence
    assert [m["mechanism"] for m in f.evidence["mechanisms"]] == ["queue_at_max_num_seqs"]


def test_heavier_output_tenant_on_a_replica_with_a_smaller_max_num_seqs_is_still_lagging(clean):
    # its steps are as fast, but its limit is its own: the identity difference is the cause, not its traffic
    t0 = time.time() - 3600
    fleet(clean, t0, {"r0": FLEET, "r1": {**TENANT, "queue": 0.08, "saturated": True}},
          configs={"r1": _config(max_num_seqs=2)})
    f = _lagging(clean, t0)["r1"]
    assert f.severity == "critical" and "own_traffic" not in f.evidence
    assert any(d["field"].endswith("max_num_seqs") for d in f.evidence["identity_differences"])
