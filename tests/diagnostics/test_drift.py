"""Drift: eval accuracy drops with the gate's statistics; production greedy outputs that diverge across configs."""

from __future__ import annotations

import json
import random
import time

from diag_records import replica, request

from diagnostics import drift
from diagnostics.baseline import Baseline, identity_key
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope
from engine.core.tokenization import Tokenizer
from telemetry.contract.records import EvalItemRecord, EvalRunRecord


def eval_run(run_id, t, config_hash, correct: list[bool], outputs: list[list[int]]):
    run = EvalRunRecord(run_id=run_id, suite="arith", start_time=t, finish_time=t + 5, config_json="{}",
                        config_hash=config_hash, model_name="tiny", weights_hash="w", quantization="none",
                        speculative_mode="none", git_sha="abc", num_items=len(correct),
                        accuracy=sum(correct) / len(correct))
    items = [EvalItemRecord(run_id=run_id, item_id=f"item-{i}", suite="arith", task="add", scorer="exact",
                            score=float(ok), reference="4", output_text="", input_token_ids=[1, 2, 3],
                            output_token_ids=out) for i, (ok, out) in enumerate(zip(correct, outputs))]
    return run, items


def store_runs(store, *runs):
    for run, items in runs:
        store.insert_records("eval_items", items)
        store.insert_records("eval_runs", [run])


def test_a_significant_accuracy_drop_is_quality_drift_with_divergence(clean):
    t0 = time.time() - 3600
    rng = random.Random(0)
    base_ok = [rng.random() < 0.9 for _ in range(120)]
    cand_ok = [ok and rng.random() > 0.35 for ok in base_ok]  # loses about a third of the right answers
    outputs = [[5, 6, 7, i % 50] for i in range(120)]
    cand_outputs = [o if ok == c else [5, 9, 9] for o, ok, c in zip(outputs, base_ok, cand_ok)]
    store_runs(clean, eval_run("base", t0, "cfg-base", base_ok, outputs),
               eval_run("cand", t0 + 100, "cfg-int4", cand_ok, cand_outputs))
    findings = drift.eval_drift(clean, Scope(start=t0 - 60))
    assert len(findings) == 1
    f = findings[0]
    assert f.kind == "quality_drift" and f.severity == "critical" and f.subject == "arith: cfg-int4 vs cfg-base"
    ev = f.evidence
    assert ev["mcnemar"]["candidate_only"] == 0 and ev["mcnemar"]["baseline_only"] == sum(base_ok) - sum(cand_ok)
    assert ev["baseline_ci"][0] < ev["baseline_accuracy"] < ev["baseline_ci"][1]
    example = ev["examples"][0]
    assert example["first_divergence"] == 1 and example["candidate_token_ids"] == [5, 9, 9]


def test_equal_accuracy_is_info_and_too_few_items_is_insufficient(clean):
    t0 = time.time() - 3600
    ok = [i % 4 != 0 for i in range(60)]
    outs = [[1, 2]] * 60
    store_runs(clean, eval_run("a", t0, "cfg-a", ok, outs), eval_run("b", t0 + 10, "cfg-b", ok, outs))
    (f,) = drift.eval_drift(clean, Scope(start=t0 - 60))
    assert f.severity == "info" and f.evidence["greedy"]["agreement"] == 1.0 and "accuracy holds" in f.summary
    clean.command("TRUNCATE TABLE eval_runs")
    clean.command("TRUNCATE TABLE eval_items")
    store_runs(clean, eval_run("a", t0, "cfg-a", ok[:5], outs[:5]), eval_run("b", t0 + 10, "cfg-b", ok[:5], outs[:5]))
    (f,) = drift.eval_drift(clean, Scope(start=t0 - 60))
    assert f.insufficient


def test_explicit_sides_pick_the_runs_by_config(clean):
    t0 = time.time() - 3600
    ok = [True] * 30
    store_runs(clean, eval_run("x", t0, "cfg-x", ok, [[1]] * 30), eval_run("y", t0 + 1, "cfg-y", ok, [[1]] * 30),
               eval_run("z", t0 + 2, "cfg-z", [False] * 30, [[2]] * 30))
    scope = Scope(start=t0 - 60)
    (f,) = drift.eval_drift(clean, scope, scope.with_side("config_hash=cfg-x"), scope.with_side("config_hash=cfg-y"))
    assert f.evidence["runs"]["candidate"]["run_id"] == "y" and f.severity == "info"


def test_greedy_outputs_that_diverge_on_one_config_name_that_replica(clean, tiny_llama):
    t0 = time.time() - 3600
    tok = Tokenizer(tiny_llama)
    ident = dict(model_dir=str(tiny_llama), tokenizer_hash=tok.tokenizer_hash,
                 chat_template_hash=tok.chat_template_hash)
    clean.insert_records("replicas", [replica("r0", t0, config_hash="cfg-fp32", **ident),
                                      replica("r1", t0, config_hash="cfg-fp32", **ident),
                                      replica("q", t0, config_hash="cfg-int4", quantization="int4", **ident)])
    reqs = []
    for p in range(20):
        prompt = [0, 10 + p, 11, 12]
        good = [20 + p, 21, 22, 23, 24]
        bad = good[:3] + [99, 98] if p % 2 else good  # int4 changes half the answers from token 3 on
        seeded = json.dumps({"temperature": 0.0, "max_tokens": 5, "seed": 1000 + p, "stop": [], "stop_token_ids": []})
        reqs += [request("r0", p, t0 + p, prompt_ids=prompt, output_ids=good),
                 # a client seed does not make a greedy request a different one
                 request("r1", p, t0 + p + 0.1, prompt_ids=prompt, output_ids=good, sampling_params_json=seeded),
                 request("q", p, t0 + p + 0.2, prompt_ids=prompt, output_ids=bad)]
    # sampled requests are not compared, however different
    reqs.append(request("q", 99, t0 + 50, prompt_ids=[0, 10, 11, 12], output_ids=[7, 7], temperature=0.8))
    clean.insert_records("requests", reqs)
    findings = drift.greedy_drift(clean, Scope(start=t0 - 60))
    above = [f for f in findings if f.severity != "info"]
    assert [f.subject for f in above] == ["q"]
    f = above[0]
    assert f.kind == "output_drift" and f.evidence["differ"] == 10 and f.evidence["compared"] == 20
    ex = f.evidence["examples"][0]
    assert ex["first_divergence"] == 3 and ex["replica_token_ids"][3] == 99
    assert ex["replica_tokens_at_divergence"][3]["id"] == 99 and "text" in ex["replica_tokens_at_divergence"][3]
    (quant,) = [d for d in f.evidence["identity_differences"] if d["field"] == "quantization"]
    assert (quant["replica"], quant["reference"]) == ("int4", "none") and "quantization int4 vs none" in f.summary


def test_a_fleet_of_one_config_has_nothing_to_compare(clean):
    t0 = time.time() - 3600
    clean.insert_records("replicas", [replica("r0", t0), replica("r1", t0)])
    clean.insert_records("requests", [request(r, p, t0 + p, prompt_ids=[0, p])
                                      for r in ("r0", "r1") for p in range(20)])
    findings = drift.greedy_drift(clean, Scope(start=t0 - 60))
    assert [(f.severity, f.insufficient) for f in findings] == [("info", True)]


def _canary_pair(store, tiny_llama, t0: float, prompts: int = 40):
    """r0 served first; r1, started a minute later with int4 weights, answers every prompt otherwise."""
    tok = Tokenizer(tiny_llama)
    ident = dict(model_dir=str(tiny_llama), tokenizer_hash=tok.tokenizer_hash,
                 chat_template_hash=tok.chat_template_hash)
    store.insert_records("replicas", [replica("r0", t0, config_hash="cfg-fp32", **ident),
                                      replica("r1", t0 + 60, config_hash="cfg-int4", quantization="int4", **ident)])
    store.insert_records("requests", [request(r, p, t0 + 120 + p + (0.1 if r == "r1" else 0),
                                              prompt_ids=[0, 10 + p, 11],
                                              output_ids=[20 + p, 21, 22] if r == "r0" else [20 + p, 99, 98])
                                      for r in ("r0", "r1") for p in range(prompts)])


def test_a_two_replica_canary_whose_greedy_outputs_all_differ_is_critical(clean, tiny_llama):
    # the old rule called every 1-to-1 disagreement a tie (info): this canary never alerted
    t0 = time.time() - 3600
    _canary_pair(clean, tiny_llama, t0)
    findings = drift.greedy_drift(clean, Scope(start=t0 - 60))
    above = [f for f in findings if f.severity != "info"]
    assert [(f.subject, f.severity) for f in above] == [("r1", "critical")]
    ev = above[0].evidence
    assert (ev["differ"], ev["compared"], ev["tied"], ev["decided_by_baseline"]) == (40, 40, 0, 40)
    assert ev["baseline"]["rule"] == "first_served" and ev["baseline"]["replicas"] == ["r0"]
    assert "baseline: r0, first served" in above[0].summary
    assert ev["examples"][0]["reference_replica"] == "r0" and ev["examples"][0]["first_divergence"] == 1
    # the baseline side is the reference: it differs from nothing
    assert not [f for f in findings if f.subject == "r0"]


def test_a_named_baseline_decides_which_side_of_the_pair_drifted(clean, tiny_llama):
    t0 = time.time() - 3600
    _canary_pair(clean, tiny_llama, t0)
    scope = Scope(start=t0 - 60)
    request_ = DiagnosticRequest(scope, baseline=scope.with_side("replica=r1"))
    above = [f for f in drift.greedy_drift(clean, scope, request=request_) if f.severity != "info"]
    assert [(f.subject, f.severity) for f in above] == [("r0", "critical")]
    assert "baseline: r1, requested" in above[0].summary


def _row(rid: str, config_hash: str) -> dict:
    return {"replica_id": rid, "weights_hash": "w", "tokenizer_hash": "t", "chat_template_hash": "c",
            "config_hash": config_hash, "engine_version": "0.1.0"}


def test_a_majority_still_wins_over_the_baseline_and_a_tie_without_it_stays_a_tie():
    identity = {"r0": _row("r0", "cfg-a"), "c1": _row("c1", "cfg-b"), "c2": _row("c2", "cfg-c")}
    b = Baseline("tiny", identity_key(identity["r0"]), ("r0",), "first_served", "r0 served first")
    # three replicas, two agree: the majority is the reference even against the baseline
    assert drift.reference([("r0", "cfg-a", 1), ("c1", "cfg-b", 2), ("c2", "cfg-c", 2)], b, identity)[::2] \
        == (2, "majority")
    # 1-to-1 with the baseline: the baseline's output
    assert drift.reference([("c1", "cfg-b", 2), ("r0", "cfg-a", 1)], b, identity) == (1, "r0", "baseline")
    # 1-to-1 between two candidates: no side can be told wrong
    assert drift.reference([("c1", "cfg-b", 2), ("c2", "cfg-c", 3)], b, identity)[2] == "tie"


def test_a_pair_started_together_gets_one_symmetric_finding_and_no_critical(clean, tiny_llama):
    # the same canary, but one fleet start (one deploy instant): r1's row came first, and no role is recorded
    t0 = time.time() - 3600
    _canary_pair(clean, tiny_llama, t0)
    clean.insert_records("replicas", [replica("r0", t0 + 61, config_hash="cfg-fp32", deploy_time=t0 + 30),
                                      replica("r1", t0 + 60.5, config_hash="cfg-int4", quantization="int4",
                                              deploy_time=t0 + 30)])
    findings = drift.greedy_drift(clean, Scope(start=t0 - 60))
    assert not [f for f in findings if f.severity == "critical"]
    assert not [f for f in findings if f.subject in ("r0", "r1") and f.severity != "info"]
    pair = [f for f in findings if f.subject == "r0 vs r1"]
    assert len(pair) == 1 and pair[0].severity == "warning" and pair[0].kind == "output_drift"
    assert "r0 and r1 disagree on 40 of 40" in pair[0].summary and "`role`" in pair[0].summary
    assert pair[0].evidence["symmetric"] and pair[0].evidence["examples"][0]["first_divergence"] == 1


def test_a_recorded_role_names_the_candidate_of_a_pair_started_together(clean, tiny_llama):
    t0 = time.time() - 3600
    _canary_pair(clean, tiny_llama, t0)
    clean.insert_records("replicas", [replica("r0", t0 + 61, config_hash="cfg-fp32", deploy_time=t0 + 30),
                                      replica("r1", t0 + 60.5, config_hash="cfg-int4", quantization="int4",
                                              deploy_time=t0 + 30, role="candidate")])
    above = [f for f in drift.greedy_drift(clean, Scope(start=t0 - 60)) if f.severity != "info"]
    assert [(f.subject, f.severity) for f in above] == [("r1", "critical")]
    assert above[0].evidence["baseline"]["rule"] == "role"
