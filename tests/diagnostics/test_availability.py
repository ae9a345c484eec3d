"""Availability like for like: a replica that refuses for length, sheds or fails more than its peers with the
same requests is named with the key that explains it; a replica merely sent more long prompts, a small
difference, and a clean fleet are not."""

from __future__ import annotations

import dataclasses
import json
import random
import time

import pytest
from diag_records import replica, request

from diagnostics import DIAGNOSTICS, availability
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope

FLEET = ("a", "b", "c")


def config(max_model_len: int = 2048, max_queue: int = 256) -> str:
    return json.dumps({"model": "/m", "quantization": "none", "max_model_len": max_model_len, "max_num_seqs": 64,
                       "serve_options": {"max_queue": max_queue}})


def answered(rid, j, t, prompt_len, workload="chat"):
    return request(rid, j, t, prompt_ids=[5] * prompt_len, workload=workload)


def refused(rid, j, t, code, prompt_len=0, status=400, workload="chat"):
    """As the server writes a refused request's row (engine/serving/server/rejections.py)."""
    return request(rid, j, t, prompt_ids=[], output_ids=[], workload=workload, prompt_tokens=prompt_len,
                   finish_reason="error", error_code=code, http_status=status, token_times=[])


def fleet(store, t0, *, limits=None, queues=None, long_share=None, rows=None, sizes=None):
    """Three replicas of 300 requests, prompts 8..4000 tokens (a share `long_share[rid]` past 2048); a
    replica refuses prompts past its `limits[rid]` (2048 for all by default)."""
    limits, queues, long_share = limits or {}, queues or {}, long_share or {}
    store.insert_records("replicas", [replica(r, t0 - 10, config_json=config(limits.get(r, 2048), queues.get(r, 256)))
                                      for r in FLEET])
    rng = random.Random(3)
    out = []
    for rid in FLEET:
        for j in range((sizes or {}).get(rid, 300)):
            long = rng.random() < long_share.get(rid, 0.05)
            n = rng.randint(2100, 4000) if long else rng.choice([8, 20, 40, 70, 100, 150, 300, 600])
            workload = ("chat", "agent")[j % 2]
            if n > limits.get(rid, 2048):
                row = refused(rid, j, t0 + j * 0.1, "context_length", n, workload=workload)
                out.append(dataclasses.replace(row, error_detail_json=json.dumps(
                    {"max_model_len": limits.get(rid, 2048), "prompt_tokens": n})))
            else:
                out.append(answered(rid, j, t0 + j * 0.1, n, workload))
    out = rows(out) if rows else out
    store.insert_records("requests", out)


def diagnose(store, t0):
    return availability.run(store, DiagnosticRequest(Scope(start=t0 - 60, end=t0 + 3600)))


def named(findings):
    """{"replica:outcome": finding} of the findings above info (the subject is the replica)."""
    out = {f"{f.subject}:{f.evidence['outcome']}": f for f in findings if f.kind == availability.KIND}
    assert len({f.finding_id for f in out.values()}) == len(out)  # one id per replica and outcome
    return out


def test_a_length_limit_is_named_with_the_key(clean):
    t0 = time.time() - 600
    fleet(clean, t0, limits={"c": 96})
    found = named(diagnose(clean, t0))
    assert set(found) == {"c:length"}
    f = found["c:length"]
    assert "max_model_len 96" in f.summary and "2048" in f.summary
    cmp = f.evidence["comparison"]
    assert cmp["rate"] > 0.3 and cmp["expected_rate"] < 0.1 and cmp["holm_p"] < availability.ALPHA
    assert cmp["rate_ci"][0] > cmp["expected_rate"]
    assert f.evidence["config_differences"][0]["key"] == "max_model_len"
    # the limit as its refusals state it (where a config leaves it to the model, max_model_len null)
    assert "its refusals state a context of 96 tokens" in f.summary and "its peers' 2048" in f.summary


def test_more_long_prompts_is_not_a_fault(clean):
    """Every replica refuses prompts past 2048; `a` is sent many more of them. Within prompt-length strata
    its rate is its peers': not named (without the strata it reads 40% against 5%)."""
    t0 = time.time() - 600
    fleet(clean, t0, long_share={"a": 0.4})
    findings = diagnose(clean, t0)
    assert named(findings) == {}
    assert [f.kind for f in findings] == [availability.CLEAN]
    a = findings[0].evidence["availability"]["a"]
    assert a["rejected"] / a["total"] > 0.3  # it does refuse far more: its traffic, not its fault


def test_a_queue_limit_is_named_as_shedding_with_the_key(clean):
    t0 = time.time() - 600
    rng = random.Random(5)

    def shed_on_b(rows):
        return [refused(r.replica_id, int(r.request_id.split("-")[1]), r.arrival_time, "queue_full", status=429,
                        workload=r.workload) if r.replica_id == "b" and rng.random() < 0.2 else r for r in rows]

    fleet(clean, t0, queues={"b": 1}, rows=shed_on_b)
    found = named(diagnose(clean, t0))
    assert set(found) == {"b:shed"}
    assert "max_queue 1 vs 256 in serve flags" in found["b:shed"].summary


@pytest.mark.parametrize("requests_on_c", [300, 30], ids=["immaterial", "not-significant"])
def test_two_failures_are_not_named(clean, requests_on_c):
    """2 of 300 is below the material excess; 2 of 30 (6.7%) is material but, exact, p = 0.0022 before Holm
    over the 12 tests (a normal approximation reads 1.6e-7 and names it)."""
    t0 = time.time() - 600

    def two_failures_on_c(rows):
        hit = {"c-3", "c-9"}
        return [refused(r.replica_id, int(r.request_id.split("-")[1]), r.arrival_time, "internal_error", status=500,
                        workload=r.workload) if r.request_id in hit else r for r in rows]

    fleet(clean, t0, rows=two_failures_on_c, sizes={"c": requests_on_c})
    findings = diagnose(clean, t0)
    assert named(findings) == {}
    assert findings[0].kind == availability.CLEAN
    (t,) = [t for t in findings[0].evidence["tests"] if (t["replica"], t["kind"]) == ("c", "failed")]
    assert t["events"] == 2 and t["peer_events"] == 0 and t["holm_p"] >= availability.ALPHA


def test_engine_failures_count_as_failed(clean):
    t0 = time.time() - 600
    rng = random.Random(9)

    def engine_fails_on_a(rows):
        return [dataclasses.replace(r, finish_reason="error", error_code="engine_error")
                if r.replica_id == "a" and rng.random() < 0.15 else r for r in rows]

    fleet(clean, t0, rows=engine_fails_on_a)
    assert set(named(diagnose(clean, t0))) == {"a:failed"}


def test_one_replica_says_it_has_no_peers(clean):
    t0 = time.time() - 600
    clean.insert_records("replicas", [replica("solo", t0 - 10)])
    clean.insert_records("requests", [answered("solo", j, t0 + j, 10) for j in range(30)])
    (f,) = diagnose(clean, t0)
    assert f.kind == "insufficient_data" and "no peers" in f.summary


@pytest.mark.parametrize("name", ["availability"])
def test_it_is_a_diagnostic_of_diagnose_all(name):
    assert DIAGNOSTICS[name] is availability

