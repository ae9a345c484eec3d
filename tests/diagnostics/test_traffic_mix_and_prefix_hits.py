"""Replicas: an eos change is an output-mix shift (not an e2e verdict); prefix caching off is a hit-rate gap."""

from __future__ import annotations

import json
import random
import time

import pytest
from diag_records import jittered, replica, request

from diagnostics import replicas
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope

MAX_TOKENS = 64


def config(**generation_or_cache) -> str:
    return json.dumps({"model": "/m", "quantization": "none", **generation_or_cache})


def answered(rid, j, t, rng, n, finish, itl=0.01, **kw):
    return request(rid, j, t, ttft=jittered(rng, 0.05), itl=jittered(rng, itl), output_ids=list(range(10, 10 + n)),
                   finish_reason=finish, sampling_params_json=json.dumps({"max_tokens": MAX_TOKENS}), **kw)


def eos_fleet(store, t0, eos_on_c, fleet=("a", "b", "c")):
    rng = random.Random(20)
    gen = {"eos_token_ids": [2], "bos_token_id": 1}
    store.insert_records("replicas", [
        replica(r, t0 - 10, config_json=config(generation={**gen, "eos_token_ids": [eos_on_c]} if r == "c" else gen))
        for r in fleet])
    reqs = []
    for rid in fleet:
        for j in range(200):
            if rid == "c" and eos_on_c != 2:  # its eos never comes: every answer runs to max_tokens
                reqs.append(answered(rid, j, t0 + j, rng, MAX_TOKENS, "length", itl=0.009))
            else:
                n = rng.randint(6, MAX_TOKENS)
                reqs.append(answered(rid, j, t0 + j, rng, n, "length" if n == MAX_TOKENS else "stop"))
    store.insert_records("requests", reqs)


def findings(store, t0):
    return [f for f in replicas.run(store, DiagnosticRequest(Scope(start=t0 - 60))) if f.severity != "info"]


@pytest.mark.parametrize("fleet", [("a", "b", "c"), ("a", "c")])
def test_changed_eos_is_an_output_mix_shift_naming_the_eos_ids_and_no_e2e_verdict(clean, fleet):
    # with three, c's shift would shift a's and b's pools too: c is named first, then they are re-tested
    # without it; with two, the one running to its budget is named
    t0 = time.time() - 3600
    eos_fleet(clean, t0, eos_on_c=99, fleet=fleet)
    found = findings(clean, t0)
    assert [(f.kind, f.subject) for f in found] == [("output_mix_shift", "c")]
    ev = found[0].evidence
    chat = ev["workloads"]["chat"]
    assert chat["finish"]["length_share"] == 1.0 and chat["finish"]["peers_length_share"] < 0.1
    assert chat["length"]["median_fraction"] == 1.0 and chat["length"]["cliffs_delta"] > 0.5
    assert [d["key"] for d in ev["config_differences"]] == ["generation.eos_token_ids"]
    assert ev["config_differences"][0]["replica"] == [99] and "generation.eos_token_ids [99]" in found[0].summary


def test_the_same_eos_and_mix_give_no_mix_finding(clean):
    t0 = time.time() - 3600
    eos_fleet(clean, t0, eos_on_c=2)
    assert findings(clean, t0) == []


def prefix_fleet(store, t0, c_caches: bool):
    rng = random.Random(21)
    store.insert_records("replicas", [
        replica(r, t0 - 10, config_json=config(enable_prefix_caching=(r != "c" or c_caches))) for r in ("a", "b", "c")])
    reqs = []
    for rid in ("a", "b", "c"):
        for j in range(150):
            cached = 0 if (rid == "c" and not c_caches) else 16 * rng.randint(0, 6)  # ~47% of 100 tokens
            reqs.append(request(rid, j, t0 + j, ttft=jittered(rng, 0.05), prompt_ids=list(range(100)),
                                cached_tokens=cached))
    store.insert_records("requests", reqs)


def test_prefix_caching_off_is_a_hit_rate_gap_naming_the_config_key(clean):
    t0 = time.time() - 3600
    prefix_fleet(clean, t0, c_caches=False)
    found = [f for f in findings(clean, t0) if f.kind == "prefix_hit_gap"]
    assert [f.subject for f in found] == ["c"]
    w = found[0].evidence["workloads"]["chat"]
    assert w["hit_rate"] == 0.0 and 0.4 < w["peers_hit_rate"] < 0.55 and w["gap_ci"][0] > 0.3
    assert found[0].evidence["config_differences"][0]["key"] == "enable_prefix_caching"
    assert "enable_prefix_caching false" in found[0].summary


def test_equal_hit_rates_give_no_gap(clean):
    t0 = time.time() - 3600
    prefix_fleet(clean, t0, c_caches=True)
    assert findings(clean, t0) == []


def test_a_significant_but_small_mix_difference_is_not_a_shift(clean):
    # 13% vs 2% of answers at max_tokens over 1500 requests each: a real but small difference
    rng = random.Random(22)
    t0 = time.time() - 3600
    clean.insert_records("replicas", [replica(r, t0 - 10) for r in ("a", "b", "c")])
    reqs = []
    for rid in ("a", "b", "c"):
        for j in range(1500):
            n = MAX_TOKENS if (rid == "c" and rng.random() < 0.12) else rng.randint(6, MAX_TOKENS)
            reqs.append(answered(rid, j, t0 + j * 0.1, rng, n, "length" if n == MAX_TOKENS else "stop"))
    clean.insert_records("requests", reqs)
    from diagnostics import traffic_mix
    rows = [r for r in clean.query_arrow(traffic_mix._sql(Scope(start=t0 - 60)),
                                         Scope(start=t0 - 60).parameters()).to_pylist()]
    c = next(r for r in rows if r["replica_id"] == "c")
    finish = traffic_mix._tests(c, [r for r in rows if r is not c])["finish"]
    assert finish[0].p_value < 1e-6 and not finish[1]["material"]
    assert findings(clean, t0) == []


def test_hit_rate_and_output_fraction_sql_agree_with_python(clean):
    from telemetry.contract import derived

    t0 = time.time() - 3600
    params = [{"max_tokens": 64}, {"max_tokens": None}, {}, {"min_tokens": 2, "max_tokens": 8, "stop": ["x"]}]
    reqs = [request("a", j, t0 + j, prompt_ids=list(range(10 + j)), cached_tokens=j * 3,
                    output_ids=list(range(5 + j)), sampling_params_json=json.dumps(p)) for j, p in enumerate(params)]
    clean.insert_records("requests", reqs)
    rows = clean.query_arrow(f"SELECT request_id, {derived.PREFIX_HIT_RATE_SQL} AS rate, "
                             f"{derived.OUTPUT_FRACTION_SQL} AS fraction FROM requests ORDER BY request_id",
                             {}).to_pylist()
    for r, row in zip(reqs, rows):
        assert row["rate"] == derived.prefix_hit_rate(r.cached_tokens, r.prompt_tokens)
        max_tokens = json.loads(r.sampling_params_json).get("max_tokens")
        assert row["fraction"] == derived.output_fraction(r.output_tokens, max_tokens)
