"""A replica named for other options than its peers says what those options did in the same window, where its
records show it (a KV cache too small: its preemptions), and says nothing more where they show nothing."""

from __future__ import annotations

import json
import time

from diag_records import replica, request, step

from diagnostics import identity
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope

N = 120


def _fleet(store, t0: float, blocks: dict[str, int], preempted: dict[str, int]) -> None:
    """Three replicas started together an hour ago, each with its num_kv_blocks; `preempted` of each one's N
    requests (and the steps beside them) preempted twice."""
    store.insert_records("replicas", [
        replica(rid, t0 - 10, config_hash=f"cfg-{n}",
                config_json=json.dumps({"model": "/nonexistent", "num_kv_blocks": n, "max_num_seqs": 8}))
        for rid, n in blocks.items()])
    reqs, steps = [], []
    for rid in blocks:
        every = max(1, N // preempted[rid]) if preempted[rid] else 0
        for j in range(N):
            hit = bool(every) and j % every == 0 and j // every < preempted[rid]
            reqs.append(request(rid, j, t0 + j, preemptions=2 if hit else 0))
            steps.append(step(rid, j, t0 + j + 0.5, num_preempted=2 if hit else 0))
    store.insert_records("requests", reqs)
    store.insert_records("steps", steps)


def _mismatch(store, t0: float):
    found = [f for f in identity.run(store, DiagnosticRequest(Scope(start=t0 - 60))) if f.kind == "config_mismatch"]
    assert [f.subject for f in found] == ["r2"]
    return found[0]


def test_a_smaller_kv_cache_is_named_with_the_preemptions_it_caused(clean):
    t0 = time.time() - 3600
    _fleet(clean, t0, {"r0": 128, "r1": 128, "r2": 24}, {"r0": 1, "r1": 0, "r2": 40})
    f = _mismatch(clean, t0)
    assert "num_kv_blocks 24 vs 128" in f.summary
    assert "in this window it shows: 80 preemptions: 40 of 120 requests preempted" in f.summary
    assert [m["mechanism"] for m in f.evidence["mechanisms"]] == ["preemptions"]
    assert f.evidence["mechanisms"][0]["others"]["events"] == 1


def test_a_difference_that_did_nothing_in_the_window_is_said_without_an_effect(clean):
    t0 = time.time() - 3600
    _fleet(clean, t0, {"r0": 128, "r1": 128, "r2": 24}, {"r0": 6, "r1": 6, "r2": 7})  # the fleet's own rate
    f = _mismatch(clean, t0)
    assert "num_kv_blocks 24 vs 128" in f.summary
    assert "shows" not in f.summary and "mechanisms" not in f.evidence



def test_what_the_traffic_did_is_not_said_as_the_settings_effect(clean):
    # r2 refuses long prompts (max_model_len) and so hits the prefix cache less than its peers: a true difference,
    # but one of the prompts it served, not of anything its setting did to the same prompts
    t0 = time.time() - 3600
    _fleet(clean, t0, {"r0": 128, "r1": 128, "r2": 24}, {"r0": 0, "r1": 0, "r2": 0})
    clean.insert_records("steps", [step(rid, 1000 + j, t0 + j + 0.7, prefix_query_tokens=100,
                                        prefix_hit_tokens=10 if rid == "r2" else 80)
                                   for rid in ("r0", "r1", "r2") for j in range(N)])
    f = _mismatch(clean, t0)
    assert "num_kv_blocks 24 vs 128" in f.summary
    assert "prefix" not in f.summary and "mechanisms" not in f.evidence
