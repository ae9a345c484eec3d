"""The sampled-logprob quality diagnostic on a real (embedded) store with controlled numbers.

Each rule has a case here that goes red when it is removed: the shift itself, the stratification by
workload (prompt mix), the first-K truncation (output length), Holm across replicas x metrics, the
baseline choice for two replicas, and "insufficient data" with the requests needed.
"""

from __future__ import annotations

import dataclasses
import json
import time

import numpy as np
import pytest

from diagnostics import DIAGNOSTICS, quality
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope
from engine.serving.proxy.extras import asks_logprobs
from tests.diagnostics.diag_records import replica, request

T0 = time.time() - 3600


def sampled(rid: str, i: int, logprobs, *, workload: str = "chat", temperature: float = 0.9, **kw):
    n = len(logprobs)
    return request(rid, i, T0 + i * 0.01, workload=workload, output_ids=list(range(10, 10 + n)),
                   output_logprobs=[float(x) for x in logprobs],
                   sampling_params_json=json.dumps({"temperature": temperature, "top_p": 1.0, "top_k": -1,
                                                    "max_tokens": n}), **kw)


def fleet(store, per_replica: dict[str, list], starts: dict[str, float] | None = None, **replica_kw):
    store.insert_records("replicas", [replica(r, T0 - 100 + (starts or {}).get(r, 0), **replica_kw.get(r, {}))
                                      for r in per_replica])
    store.insert_records("requests", [rec for recs in per_replica.values() for rec in recs])


def requests_of(rid: str, n: int, rng, *, shift: float = 0.0, length: int = 16, workload: str = "chat",
                level: float = -1.5, start: int = 0, position_gain: float = 0.0):
    out = []
    for i in range(n):
        lp = level + shift + rng.normal(0, 0.6, length) + position_gain * (np.arange(length) >= 16)
        out.append(sampled(rid, start + i, np.minimum(lp, 0.0), workload=workload))
    return out


def run(store, **kw):
    return quality.run(store, DiagnosticRequest(Scope(start=T0 - 600), **kw))


def above_info(findings):
    return [f for f in findings if f.severity != "info"]


def test_registered():
    assert DIAGNOSTICS["quality"] is quality


def test_clean_fleet_gives_nothing_above_info(clean):
    rng = np.random.default_rng(12)
    fleet(clean, {r: requests_of(r, 80, rng) + requests_of(r, 40, rng, workload="code", level=-0.7, start=100)
                  for r in ("r0", "r1", "r2")})
    found = run(clean)
    assert above_info(found) == []
    assert {f.subject for f in found} == {"r0", "r1", "r2"}  # each was compared (info: unchanged)


def test_damaged_replica_is_named_with_effect_interval_and_controls(clean):
    rng = np.random.default_rng(3)
    fleet(clean, {r: requests_of(r, 80, rng, shift=-0.4 if r == "r2" else 0.0) for r in ("r0", "r1", "r2")})
    hits = above_info(run(clean))
    assert [f.subject for f in hits] == ["r2"]
    f = hits[0]
    assert f.kind == "sampled_logprob_shift" and f.severity == "critical"
    m = f.evidence["metrics"]["mean_logprob"]
    assert m["ci95"][0] < -0.4 + 0.2 and m["ci95"][1] < 0 and m["p_holm"] < 0.01
    assert "less sure" in f.summary and "van Elteren" in f.summary and "workload (prompt mix)" in \
        f.evidence["controlled_for"]
    assert f.evidence["peers"] == ["r0", "r1"] and "probe" in f.summary  # points at the exact-token checks


def test_prompt_mix_is_controlled(clean):
    """r1 serves mostly easy (confident) code prompts, r0 mostly chat: the same model on both."""
    rng = np.random.default_rng(4)
    mix = {"r0": (100, 20), "r1": (20, 100)}
    fleet(clean, {r: requests_of(r, chat, rng) + requests_of(r, code, rng, workload="code", level=-0.5, start=500)
                  for r, (chat, code) in mix.items()})
    assert above_info(run(clean)) == []


def test_output_length_is_controlled(clean):
    """Later tokens are more confident; r1's outputs are longer. Only the first K tokens count."""
    rng = np.random.default_rng(5)
    fleet(clean, {"r0": requests_of("r0", 60, rng, length=16),
                  "r1": requests_of("r1", 60, rng, length=64, position_gain=1.2)})
    assert above_info(run(clean)) == []


def test_holm_across_replicas_and_metrics(clean):
    """A modest shift on one of eight replicas: significant alone (p ~ 0.005), not after Holm over 16 tests."""
    rng = np.random.default_rng(6)
    reps = [f"r{i}" for i in range(8)]
    fleet(clean, {r: requests_of(r, 30, rng, shift=-0.1 if r == "r7" else 0.0) for r in reps})
    found = run(clean)
    r7 = next(f for f in found if f.subject == "r7")
    m = r7.evidence["metrics"]["mean_logprob"]
    assert m["p"] < 0.01 < m["p_holm"], m  # the case this test is about
    assert above_info(found) == []


def test_two_replicas_canary_against_first_served_baseline(clean):
    rng = np.random.default_rng(7)
    fleet(clean, {"base": requests_of("base", 60, rng), "canary": requests_of("canary", 60, rng, shift=-0.5)},
          starts={"canary": 50}, canary={"weights_hash": "w-int4", "quantization": "int4"})
    found = run(clean)
    assert [f.subject for f in found] == ["canary"]
    assert found[0].severity == "critical" and found[0].evidence["baseline"]["rule"] == "first_served"
    assert "weights_hash" in found[0].summary


def test_two_replicas_the_named_baseline_decides(clean):
    """The replica started last is the named baseline: the other one is the canary compared against it."""
    rng = np.random.default_rng(9)
    fleet(clean, {"old": requests_of("old", 60, rng, shift=-0.5), "new": requests_of("new", 60, rng)},
          starts={"new": 50}, new={"weights_hash": "w-2"})
    found = run(clean, baseline=Scope(start=T0 - 600, replicas=("new",)), candidate=Scope(start=T0 - 600))
    assert [(f.subject, f.evidence["baseline"]["rule"]) for f in found] == [("old", "requested")]


def test_too_few_requests_say_how_many_are_needed(clean):
    rng = np.random.default_rng(8)
    fleet(clean, {r: requests_of(r, 8, rng) for r in ("r0", "r1")})
    (f,) = run(clean)
    assert f.insufficient and f.severity == "info"
    assert f.evidence["needed_per_side"] >= 20 and "need >= 20 measured per side" in f.summary


def measured_on(records, fraction: float):
    """The recording proxy's `--logprobs-fraction`: only the requests its request-id hash picks keep their
    logprobs; the others have none (empty), as the proxy stores them."""
    return [r if asks_logprobs(r.request_id, fraction) else dataclasses.replace(r, output_logprobs=[])
            for r in records]


def test_a_damaged_replica_measured_on_a_quarter_of_its_requests_is_caught(clean):
    """r2 (damaged) keeps logprobs on a quarter of its 400 requests; its unmeasured requests must not count
    as values (as 0 they would make it look far *more* sure)."""
    rng = np.random.default_rng(13)
    fleet(clean, {"r0": requests_of("r0", 120, rng), "r1": requests_of("r1", 120, rng),
                  "r2": measured_on(requests_of("r2", 400, rng, shift=-0.4), 0.25)})
    hits = above_info(run(clean))
    assert [f.subject for f in hits] == ["r2"]
    m = hits[0].evidence["metrics"]["mean_logprob"]
    assert 60 <= m["requests"] <= 140 and m["ci95"][1] < 0 and "less sure" in hits[0].summary


def test_a_clean_fleet_with_mixed_logprob_fractions_gives_nothing_above_info(clean):
    rng = np.random.default_rng(14)
    fractions = {"r0": 1.0, "r1": 0.25, "r2": 0.5}
    fleet(clean, {r: measured_on(requests_of(r, 240, rng) + requests_of(r, 120, rng, workload="code", level=-0.7,
                                                                         start=1000), f)
                  for r, f in fractions.items()})
    found = run(clean)
    assert above_info(found) == []
    assert {f.subject for f in found} == set(fractions) and not any(f.insufficient for f in found)


def test_too_few_measured_requests_say_how_many_and_the_traffic_that_takes(clean):
    rng = np.random.default_rng(15)
    fleet(clean, {"r0": requests_of("r0", 60, rng), "r1": measured_on(requests_of("r1", 48, rng), 0.25)})
    (f,) = run(clean)
    assert f.insufficient and f.subject == "r1"
    assert f.evidence["served"] == 48 and f.evidence["requests"] < 20 and 0.1 < f.evidence["measured_share"] < 0.4
    need = f.evidence["needed_per_side"]
    assert "of 48 and 60 served" in f.summary and f"about {need} measured per side" in f.summary
    assert "requests per side" in f.summary.split("with logprobs on")[1]  # the traffic a share needs


def test_requests_without_logprobs_are_insufficient(clean):
    clean.insert_records("replicas", [replica("r0", T0 - 100)])
    clean.insert_records("requests", [request("r0", i, T0 + i) for i in range(30)])
    (f,) = run(clean)
    assert f.insufficient and "output_logprobs" in f.summary


def test_exact_token_findings_for_the_replica_are_named_as_the_stronger_evidence(clean):
    from diagnostics.findings import Finding, write_findings

    rng = np.random.default_rng(10)
    fleet(clean, {"base": requests_of("base", 60, rng), "canary": requests_of("canary", 60, rng, shift=-0.5)},
          starts={"canary": 50}, canary={"weights_hash": "w-2"})
    write_findings(clean, [Finding("probe_drift", "critical", "canary", "probe outputs differ", "probe",
                                   Scope(start=T0 - 600))])
    (f,) = run(clean)
    assert f.evidence["exact_token_findings"] == [{"diagnostic": "probe", "kind": "probe_drift"}]
    assert "exact-token evidence exists (probe: probe_drift) and is the stronger evidence" in f.summary


def test_two_replicas_started_together_get_one_finding_on_the_pair(clean):
    # one fleet start (one deploy instant), no role: the shift is the pair's, neither side is blamed
    rng = np.random.default_rng(7)
    together = {"deploy_time": T0 - 130}
    fleet(clean, {"base": requests_of("base", 60, rng), "canary": requests_of("canary", 60, rng, shift=-0.5)},
          starts={"canary": 0.5}, base=together, canary={**together, "weights_hash": "w-int4"})
    found = run(clean)
    assert [(f.subject, f.severity) for f in found] == [("base vs canary", "warning")]
    assert found[0].evidence["symmetric"] and "no baseline" in found[0].summary
