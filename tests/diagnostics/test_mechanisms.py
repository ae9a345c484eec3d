"""Mechanisms: a slow replica's cause is cited from its records against its peers', or said not found; a count
every replica shows alike is not a cause."""

from __future__ import annotations

import json
import random
import time

import pytest
from diag_records import jittered, replica, request, step

from diagnostics import mechanisms, regression, replicas
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope, replicas_in

N = 150


def _config(quota=None, max_num_seqs=None) -> str:
    doc: dict = {"model": "/nonexistent", "quantization": "none"}
    if max_num_seqs is not None:
        doc["max_num_seqs"] = max_num_seqs
    if quota is not None:
        cpu_max = "max 100000" if quota == "max" else f"{int(quota * 100000)} 100000"
        doc["placement"] = {"cgroup": {"version": "v2", "cpu_quota_cpus": quota, "cpu_max": cpu_max}}
        doc["_start"] = {"cgroup_throttling": {"nr_periods": 10, "nr_throttled": 0, "throttled_seconds": 0.0}}
    return json.dumps(doc)


def fleet(store, t0, specs: dict, slow: dict | None = None, seed: int = 0):
    """specs: replica id -> {config: replica config_json, preempted: requests preempted (2 each, spread out),
    step: step() overrides}; slow: replica id -> latency factor."""
    rng = random.Random(seed)
    slow = slow or {}
    store.insert_records("replicas", [replica(rid, t0 - 10, config_json=s.get("config", _config()))
                                      for rid, s in specs.items()])
    reqs, steps = [], []
    for rid, s in specs.items():
        k = slow.get(rid, 1.0)
        hit = {int(i * N / s["preempted"]) for i in range(s["preempted"])} if s.get("preempted") else set()
        for j in range(N):
            preempted = j in hit
            batch = j % 3 == 0
            reqs.append(request(rid, j, t0 + j, ttft=jittered(rng, (0.06 if batch else 0.02) * k),
                                itl=jittered(rng, 0.01 * k), workload="batch" if batch else "chat",
                                prompt_ids=list(range(300 if batch else 20)), preemptions=2 if preempted else 0))
            steps.append(step(rid, j, t0 + j + 0.5, num_preempted=2 if preempted else 0, **s.get("step", {})))
    store.insert_records("requests", reqs)
    store.insert_records("steps", steps)


def _cited(store, t0, rid, peers, identity_ids):
    scope = Scope(start=t0 - 60)
    identity = {r["replica_id"]: r for r in replicas_in(store, scope)}
    assert set(identity) == set(identity_ids)
    return {m["mechanism"]: m for m in mechanisms.cited(store, scope, rid, peers, identity)}


def test_many_preemptions_are_cited_with_both_rates(clean):
    t0 = time.time() - 3600
    fleet(clean, t0, {"r0": {"preempted": 2}, "r1": {"preempted": 1}, "r2": {"preempted": 60}})
    cited = _cited(clean, t0, "r2", ["r0", "r1"], ["r0", "r1", "r2"])
    assert list(cited) == ["preemptions"]
    p = cited["preemptions"]
    assert p["replica"]["events"] == 60 and p["replica"]["of"] == N and p["replica"]["preemptions"] == 120
    assert p["others"]["events"] == 3 and p["others"]["of"] == 2 * N
    assert "120 preemptions" in p["said"] and "60 of 150 requests" in p["said"] and "1.0% on peers" in p["said"]


@pytest.mark.parametrize("counts", [
    (18, 20, 22),  # 12-15% of requests preempted everywhere: the fleet's normal rate, no rule passes
    (37, 38, 60),  # 40% vs 25%: significant (p ~ 0.001) but not MIN_RATIO times the peers' rate
    (4, 5, 10),  # 6.7% vs 3%: over MIN_RATIO and MIN_EVENTS, but 10 events could be chance (p ~ 0.07)
    (0, 0, 9),  # none on the peers, significant, but fewer than MIN_EVENTS on the replica
])
def test_a_preemption_count_that_is_no_real_difference_is_not_a_cause(clean, counts):
    t0 = time.time() - 3600
    fleet(clean, t0, {f"r{i}": {"preempted": c} for i, c in enumerate(counts)})
    assert _cited(clean, t0, "r2", ["r0", "r1"], ["r0", "r1", "r2"]) == {}


def test_a_smaller_cpu_quota_is_cited_with_both_values(clean):
    t0 = time.time() - 3600
    fleet(clean, t0, {"r0": {"config": _config(quota=2.0)}, "r1": {"config": _config(quota=2.0)},
                      "r2": {"config": _config(quota=0.3)}})
    cited = _cited(clean, t0, "r2", ["r0", "r1"], ["r0", "r1", "r2"])
    assert list(cited) == ["cpu_quota"]
    q = cited["cpu_quota"]
    assert q["replica"]["cpu_quota_cpus"] == 0.3 and q["reference"] == 2.0
    assert "CPU quota 0.3 CPUs" in q["said"] and "30000 100000" in q["said"] and "vs 2.0 on peers" in q["said"]
    assert q["replica"]["throttling_at_start"]["nr_periods"] == 10
    # against peers without a quota, and not when the quota is the peers' own or larger
    assert "vs max on peers" in _quota(_config(quota=0.3), [_config(quota="max")])["said"]
    assert _quota(_config(quota=0.3), [_config(quota=0.3)]) is None
    assert _quota(_config(quota="max"), [_config(quota=0.3)]) is None
    assert _quota(_config(quota=4.0), [_config(quota=2.0)]) is None
    assert _quota(_config(), [_config(quota=2.0)]) is None  # no quota recorded: nothing to compare


def _quota(mine: str, peers: list[str]):
    def side(configs):
        return mechanisms.Side(Scope(), tuple({"replica_id": f"r{i}", "config_json": c} for i, c in enumerate(configs)))
    return mechanisms._quota(side([mine]), side(peers), "on peers")


def test_queue_at_a_smaller_max_num_seqs_full_kv_and_host_time_are_cited(clean):
    t0 = time.time() - 3600
    peer = {"config": _config(max_num_seqs=16), "step": {"num_seqs": 2, "num_running": 4, "num_waiting": 0}}
    fleet(clean, t0, {"r0": peer, "r1": peer,
                      "r2": {"config": _config(max_num_seqs=2),
                             "step": {"num_seqs": 2, "num_running": 2, "num_waiting": 5, "kv_blocks_used": 62,
                                      "duration": 0.02, "forward": 0.007}}})
    cited = _cited(clean, t0, "r2", ["r0", "r1"], ["r0", "r1", "r2"])
    assert list(cited) == ["kv_pressure", "queue_at_max_num_seqs", "host_time"]
    assert "all 2 of max_num_seqs running in 100% of steps" in cited["queue_at_max_num_seqs"]["said"]
    assert "(max_num_seqs 16)" in cited["queue_at_max_num_seqs"]["said"]
    assert "(64 blocks) vs 0.0% on peers (64 blocks)" in cited["kv_pressure"]["said"]
    assert "13.0 ms per step" in cited["host_time"]["said"]
    assert "3.0 ms on peers at the same batch sizes" in cited["host_time"]["said"]
    # the same limits and steps on every replica: none of it is a difference
    clean_peers = _cited(clean, t0, "r0", ["r1"], ["r0", "r1", "r2"])
    assert clean_peers == {}


def test_more_host_time_for_bigger_batches_is_not_a_cause(clean):
    # r2 batched 16 sequences in half its steps, with the host time 16 sequences take; at 2 sequences it is as
    # fast as its peers: its median step is slower, its host is not
    t0 = time.time() - 3600
    fleet(clean, t0, {f"r{i}": {"step": {"num_seqs": 2}} for i in range(3)})
    clean.insert_records("steps", [step("r2", 1000 + j, t0 + j + 0.7, num_seqs=16, duration=0.016, forward=0.007)
                                   for j in range(2 * N)])
    cited = _cited(clean, t0, "r2", ["r0", "r1"], ["r0", "r1", "r2"])
    assert "host_time" not in cited


@pytest.mark.parametrize("hits, cited_", [(4, True), (15, False)])
def test_a_prefix_hit_rate_ten_points_below_the_peers_is_cited_and_five_is_not(clean, hits, cited_):
    t0 = time.time() - 3600
    peer = {"step": {"prefix_query_tokens": 20, "prefix_hit_tokens": 16}}  # 80%
    fleet(clean, t0, {"r0": peer, "r1": peer, "r2": {"step": {"prefix_query_tokens": 20, "prefix_hit_tokens": hits}}})
    cited = _cited(clean, t0, "r2", ["r0", "r1"], ["r0", "r1", "r2"])
    assert ("prefix_hits" in cited) is cited_
    if cited_:
        assert cited["prefix_hits"]["said"] == "prefix-cache hits 20% of looked-up prompt tokens vs 80% on peers"


def test_nothing_in_the_records_is_said(clean):
    t0 = time.time() - 3600
    fleet(clean, t0, {f"r{i}": {"preempted": 3} for i in range(3)})
    assert _cited(clean, t0, "r2", ["r0", "r1"], ["r0", "r1", "r2"]) == {}
    assert mechanisms.explain([]).startswith("cause not found in the records")


def test_a_lagging_replica_s_finding_cites_its_preemptions(clean):
    t0 = time.time() - 3600
    fleet(clean, t0, {"r0": {"preempted": 1}, "r1": {"preempted": 2}, "r2": {"preempted": 80}}, slow={"r2": 2.2})
    findings = [f for f in replicas.run(clean, DiagnosticRequest(Scope(start=t0 - 60)))
                if f.kind == replicas.KIND]
    assert [f.subject for f in findings] == ["r2"]
    f = findings[0]
    assert "cause: 160 preemptions: 80 of 150 requests preempted" in f.summary
    assert [m["mechanism"] for m in f.evidence["mechanisms"]] == ["preemptions"]


def test_a_lagging_replica_with_no_mechanism_recorded_says_so(clean):
    t0 = time.time() - 3600
    fleet(clean, t0, {f"r{i}": {} for i in range(3)}, slow={"r2": 2.2})
    findings = [f for f in replicas.run(clean, DiagnosticRequest(Scope(start=t0 - 60)))
                if f.kind == replicas.KIND]
    assert [f.subject for f in findings] == ["r2"]
    assert "cause not found in the records" in findings[0].summary
    assert findings[0].evidence["mechanisms"] == []


def test_a_regression_cites_the_candidate_s_preemptions_against_the_baseline(clean):
    t0 = time.time() - 3600
    rng = random.Random(4)
    clean.insert_records("replicas", [replica("r0", t0 - 10, version="0.1.0"),
                                      replica("r1", t0 - 10, version="0.2.0")])
    reqs = [request(rid, j, t0 + j, ttft=jittered(rng, 0.02 * k), itl=jittered(rng, 0.01 * k),
                    preemptions=1 if (rid == "r1" and j % 3 == 0) else 0)
            for rid, k in (("r0", 1.0), ("r1", 1.6)) for j in range(300)]
    clean.insert_records("requests", reqs)
    findings = regression.compare(clean, Scope(versions=("0.1.0",), name="version=0.1.0"),
                                  Scope(versions=("0.2.0",), name="version=0.2.0"))
    ttft = next(f for f in findings if f.subject == "ttft: version=0.2.0 vs version=0.1.0")
    assert ttft.kind == "regression"
    assert "cause: 100 preemptions: 100 of 300 requests preempted (33%) vs 0.0% on the baseline" in ttft.summary
    assert [m["mechanism"] for m in ttft.evidence["mechanisms"]] == ["preemptions"]


def test_a_change_point_cites_what_changed_before_and_after_or_says_nothing_was_found(clean):
    t0 = time.time() - 3600
    rng = random.Random(3)
    clean.insert_records("replicas", [replica("r0", t0 - 10)])
    # latency steps up 1.8x at t0 + 1000, when the KV cache starts to run full
    slow = [j >= 1000 for j in range(2000)]
    clean.insert_records("requests", [request("r0", j, t0 + j, ttft=jittered(rng, 0.02 * (1.8 if s else 1.0)),
                                              itl=jittered(rng, 0.01)) for j, s in enumerate(slow)])
    clean.insert_records("steps", [step("r0", j, t0 + j + 0.5, kv_blocks_used=60 if s else 8)
                                   for j, s in enumerate(slow)])
    creep = [f for f in regression.creep(clean, Scope(start=t0 - 60)) if f.kind == "latency_change_point"]
    ttft = next(f for f in creep if f.subject.startswith("ttft"))
    assert "cause: KV cache >= 90% used in 100% of steps (64 blocks) vs 0.0% before the change" in ttft.summary
    clean.command("TRUNCATE TABLE steps")  # the same step up with nothing in the records to explain it
    ttft = next(f for f in regression.creep(clean, Scope(start=t0 - 60)) if f.subject.startswith("ttft"))
    assert ttft.kind == "latency_change_point" and "cause not found in the records" in ttft.summary


def test_sides_without_identity_rows_are_compared_on_their_records_alone(clean):
    t0 = time.time() - 3600
    clean.insert_records("steps", [step(rid, j, t0 + j, kv_blocks_used=62 if rid == "x1" else 8)
                                   for rid in ("x0", "x1") for j in range(100)])
    side = {r: mechanisms.Side(Scope(start=t0 - 1, replicas=(r,)), ()) for r in ("x0", "x1")}
    found = mechanisms.compared(clean, side["x1"], side["x0"])
    assert [m["mechanism"] for m in found] == ["kv_pressure"]


@pytest.mark.slow
def test_a_real_engine_with_a_kv_cache_too_small_has_its_preemptions_cited(tiny_llama, clean, tmp_path):
    """Three real engines through the recorder, the same batch of prompts; r2's KV cache holds a fraction of
    what the batch needs, so its scheduler preempts: its preemptions and full KV are cited, its peers' not."""
    from engine.core.llm import LLM
    from engine.core.sampling_params import SamplingParams
    from telemetry.recorder import Recorder

    t0 = time.time()
    prompts = [f"the replica number {i} says a cache token latency story" for i in range(24)]
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    for rid, blocks in (("r0", 256), ("r1", 256), ("r2", 12)):
        recorder = Recorder(clean, rid, spool_dir=tmp_path / rid, flush_interval=0.2)
        llm = LLM(tiny_llama, observer=recorder, replica_id=rid, max_num_seqs=8, num_kv_blocks=blocks,
                  block_size=16, max_model_len=128)
        llm.generate(prompts, params, use_tqdm=False)
        llm.engine.close()
        recorder.close()
    preempted = clean.query_df("SELECT replica_id, sum(preemptions) AS p FROM requests GROUP BY replica_id")
    by_replica = dict(zip(preempted["replica_id"], preempted["p"]))
    assert by_replica["r2"] >= mechanisms.MIN_EVENTS and by_replica["r0"] == by_replica["r1"] == 0
    cited = _cited(clean, t0, "r2", ["r0", "r1"], ["r0", "r1", "r2"])
    assert "preemptions" in cited and "kv_pressure" in cited
    assert cited["preemptions"]["replica"]["preemptions"] == by_replica["r2"]
    assert "(12 blocks) vs 0.0% on peers (256 blocks)" in cited["kv_pressure"]["said"]
    assert "preemptions" not in _cited(clean, t0, "r0", ["r1", "r2"], ["r0", "r1", "r2"])
