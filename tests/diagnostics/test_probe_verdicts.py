"""Probe verdicts: the same greedy probes on every replica, judged against the baseline (or a pin),
and solo against batched on each replica."""

from __future__ import annotations

import dataclasses
import time

import pytest
from diag_records import replica, request, step

from diagnostics import DIAGNOSTICS, probe as probe_rule
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope
from engine.core.tokenization import Tokenizer
from telemetry import synthetic
from telemetry.contract.probes import probe_request_id

N = 40  # probes in the suite


@pytest.fixture
def tok(tiny_llama):
    return Tokenizer(tiny_llama)


def prompt(i: int) -> list[int]:
    return [1, 40 + i, 41, 42]


def good(i: int) -> list[int]:
    return [100 + i, 150, 151, 152, 153]


def bad(i: int) -> list[int]:
    return good(i)[:2] + [300, 301, 302]  # the canary's answer parts from token 2 on


def probe(rid: str, rnd: int, i: int, t0: float, mode: str = "solo", output=None, prompt_ids=None,
          probe_id: str | None = None):
    t = t0 + 100 * rnd + i * 0.5 + (0.25 if mode == "batched" else 0.0)
    round_id = f"p{int((t0 + 100 * rnd) * 1000)}"
    return request(rid, 0, t, prompt_ids=prompt(i) if prompt_ids is None else prompt_ids,
                   output_ids=good(i) if output is None else output, workload="probe",
                   prompt_text=f"probe text {i}", request_id=probe_request_id(round_id, probe_id or f"q{i:02d}",
                                                                              mode, rid))


def fleet(store, tok, t0: float, *replicas: tuple[str, float, dict]):
    ident = dict(tokenizer_hash=tok.tokenizer_hash, chat_template_hash=tok.chat_template_hash)
    store.insert_records("replicas", [replica(rid, t0 + dt, **{**ident, **kw}) for rid, dt, kw in replicas])


def diagnose(store, tiny_llama, t0: float, **kw):
    findings = probe_rule.run(store, DiagnosticRequest(Scope(start=t0 - 60), model_dirs={"tiny": str(tiny_llama)}, **kw))
    for f in findings:
        f.evidence_json()  # every finding can be stored
    return findings


def above_info(findings):
    return [f for f in findings if f.severity != "info"]


def test_a_canary_whose_probes_all_differ_is_critical_against_the_first_served_baseline(clean, tiny_llama, tok):
    t0 = time.time() - 3600
    fleet(clean, tok, t0, ("r0", 0, {}), ("r1", 60, {"weights_hash": "w-int4", "quantization": "int4"}))
    clean.insert_records("requests", [probe("r0", 0, i, t0) for i in range(N)]
                         + [probe("r1", 0, i, t0, output=bad(i)) for i in range(N)])
    findings = diagnose(clean, tiny_llama, t0)
    (f,) = above_info(findings)
    assert (f.kind, f.severity, f.subject, f.diagnostic) == ("probe_drift", "critical", "r1", "probe")
    assert "40 of 40 probes" in f.summary and "baseline: r0, first served" in f.summary
    assert "first divergent output token 2: 300" in f.summary  # both the ID and its string
    ev = f.evidence
    assert ev["baseline"]["rule"] == "first_served" and ev["baseline"]["replicas"] == ["r0"]
    assert len(ev["probes_compared"]) == N and ev["mismatched_probes"] == [f"q{i:02d}" for i in range(N)]
    ex = ev["examples"][0]
    assert ex["first_divergence"] == 2 and ex["replica_token_ids"][2] == 300 and ex["reference_token_ids"][2] == 151
    at = {e["position"]: e for e in ex["replica_tokens_at_divergence"]}
    assert at[2]["id"] == 300 and at[2]["text"] == Tokenizer(tiny_llama).piece(300)
    assert any(d["field"] == "weights_hash" for d in ev["identity_differences"])
    # registered under the name the CLI uses
    assert DIAGNOSTICS["probe"] is probe_rule


def test_a_clean_pair_of_identical_outputs_is_quiet(clean, tiny_llama, tok):
    t0 = time.time() - 3600
    fleet(clean, tok, t0, ("r0", 0, {}), ("r1", 60, {"config_hash": "cfg-new"}), ("r2", 0, {}))
    clean.insert_records("requests", [probe(r, rnd, i, t0, mode) for r in ("r0", "r1", "r2") for rnd in (0, 1)
                                      for i in range(N) for mode in ("solo", "batched")])
    findings = diagnose(clean, tiny_llama, t0)
    assert above_info(findings) == []
    assert not [f for f in findings if f.kind in ("probe_drift", "probe_nondeterminism", "batch_variance")]


def test_with_a_pin_the_replica_disagreeing_with_the_pin_is_named_even_when_first_served(clean, tiny_llama, tok):
    t0 = time.time() - 3600
    fleet(clean, tok, t0, ("r0", 0, {}), ("r1", 60, {"config_hash": "cfg-fixed"}))
    clean.insert_records("requests", [probe("r0", 0, i, t0, output=bad(i)) for i in range(N)]
                         + [probe("r1", 0, i, t0) for i in range(N)])
    pin_round = f"p{int((t0 - 50) * 1000)}"
    pins = [dataclasses.replace(synthetic.probe_baseline(i, "r1", t0 - 50), probe_id=f"q{i:02d}", round_id=pin_round,
                                weights_hash="w", tokenizer_hash=tok.tokenizer_hash,
                                chat_template_hash=tok.chat_template_hash, config_hash="cfg-fixed",
                                engine_version="0.1.0", prompt_text_hash=probe("r1", 0, i, t0).prompt_text_hash,
                                prompt_token_ids=prompt(i), output_token_ids=good(i)) for i in range(N)]
    clean.insert_records("probe_baselines", pins)
    try:
        findings = diagnose(clean, tiny_llama, t0)
    finally:
        clean.command("TRUNCATE TABLE probe_baselines")
    (f,) = above_info(findings)
    assert (f.kind, f.severity, f.subject) == ("probe_drift", "critical", "r0")
    assert f.evidence["baseline"]["rule"] == "pinned" and f.evidence["reference"] == "pin"
    assert f"baseline: pin of round {pin_round} from r1" in f.summary and "differ from the pin" in f.summary
    assert {"field": "config_hash", "replica": "cfg-a", "pin": "cfg-fixed"} in f.evidence["identity_differences"]


def test_the_same_prompt_text_tokenized_differently_is_named_as_a_tokenization_difference(clean, tiny_llama, tok):
    t0 = time.time() - 3600
    fleet(clean, tok, t0, ("r0", 0, {}), ("r1", 60, {"tokenizer_hash": "tok-lowercase"}))
    clean.insert_records("requests", [probe("r0", 0, i, t0) for i in range(N)]
                         # the same text, another token at position 2 (and so another answer)
                         + [probe("r1", 0, i, t0, prompt_ids=[1, 40 + i, 77, 42] if i < 10 else None,
                                  output=bad(i) if i < 10 else None) for i in range(N)])
    (f,) = above_info(diagnose(clean, tiny_llama, t0))
    assert f.kind == "probe_drift" and f.subject == "r1" and f.severity == "warning"  # 10 of 40
    assert "prompt tokenization differs on 10" in f.summary and "first divergent prompt token 2: 77" in f.summary
    assert f.evidence["prompt_mismatched_probes"] == [f"q{i:02d}" for i in range(10)]
    pd = f.evidence["examples"][0]["prompt_divergence"]
    assert pd["first_divergence"] == 2 and pd["replica_token_ids"] == [1, 40, 77, 42]
    assert pd["reference_token_ids"] == [1, 40, 41, 42]
    at = {e["position"]: e for e in pd["reference_tokens_at_divergence"]}
    assert at[2]["id"] == 41 and at[2]["text"] == tok.piece(41)


def test_two_baseline_replicas_that_disagree_are_nondeterminism_on_one_identity(clean, tiny_llama, tok):
    t0 = time.time() - 3600
    fleet(clean, tok, t0, ("r0", 0, {}), ("r2", 0, {}), ("r1", 60, {"config_hash": "cfg-new"}))
    clean.insert_records("requests", [probe(r, 0, i, t0) for r in ("r0", "r1") for i in range(N)]
                         + [probe("r2", 0, i, t0, output=bad(i) if i < 3 else None) for i in range(N)])
    findings = diagnose(clean, tiny_llama, t0)
    (f,) = above_info(findings)
    assert (f.kind, f.severity, f.subject) == ("probe_nondeterminism", "warning", "r0 vs r2")
    assert "nondeterminism on one identity" in f.summary and f.evidence["mismatched_probes"] == ["q00", "q01", "q02"]
    # the canary agrees with the baseline: nothing about it
    assert not [x for x in findings if x.subject == "r1"]


def test_one_mismatching_probe_between_baseline_replicas_is_only_info(clean, tiny_llama, tok):
    t0 = time.time() - 3600
    fleet(clean, tok, t0, ("r0", 0, {}), ("r2", 0, {}))
    clean.insert_records("requests", [probe("r0", 0, i, t0) for i in range(N)]
                         + [probe("r2", 0, i, t0, output=bad(i) if i == 5 else None) for i in range(N)])
    findings = diagnose(clean, tiny_llama, t0)
    assert above_info(findings) == []
    (f,) = [x for x in findings if x.kind == "probe_nondeterminism"]
    assert f.severity == "info" and f.evidence["mismatched_probes"] == ["q05"]


@pytest.mark.parametrize(("k", "n", "expected"), [
    (1, 40, "info"),  # one flip: a near tie
    (2, 40, "info"),  # Wilson low 1.4% is not above 2%
    (4, 40, "warning"),
    (19, 40, "warning"),  # under half the suite
    (20, 40, "critical"),
    (40, 40, "critical"),
    (3, 5, "critical"),  # 60%, Wilson low 23%
    (3, 6, "warning"),  # half, but Wilson low 19%: too few probes to page
])
def test_the_drift_severity_rule(k, n, expected):
    assert probe_rule.severity(k, n) == expected


def test_a_few_mismatching_probes_are_a_warning_not_critical(clean, tiny_llama, tok):
    t0 = time.time() - 3600
    fleet(clean, tok, t0, ("r0", 0, {}), ("r1", 60, {"config_hash": "cfg-new"}))
    clean.insert_records("requests", [probe("r0", 0, i, t0) for i in range(N)]
                         + [probe("r1", 0, i, t0, output=bad(i) if i < 5 else None) for i in range(N)])
    (f,) = above_info(diagnose(clean, tiny_llama, t0))
    assert (f.subject, f.severity, f.evidence["mismatched"], f.evidence["compared"]) == ("r1", "warning", 5, N)


def test_only_the_latest_shared_round_is_judged_and_fillers_are_not_compared(clean, tiny_llama, tok):
    t0 = time.time() - 3600
    fleet(clean, tok, t0, ("r0", 0, {}), ("r1", 60, {"config_hash": "cfg-new"}))
    reqs = [probe(r, rnd, i, t0) for r in ("r0", "r1") for rnd in (0, 1) for i in range(N)
            if not (r == "r1" and rnd == 0)]
    reqs += [probe("r1", 0, i, t0, output=bad(i)) for i in range(N)]  # the canary was wrong, then fixed
    # fillers keep a replica busy; their answers differ from replica to replica and mean nothing
    reqs += [probe(r, 1, i, t0, "batched", output=bad(i) if r == "r1" else None, probe_id=f"filler_{i}")
             for r in ("r0", "r1") for i in range(N)]
    reqs += [probe(r, 1, i, t0, output=bad(i) if r == "r1" else None, probe_id=f"filler_{i}")
             for r in ("r0", "r1") for i in range(N)]
    clean.insert_records("requests", reqs)
    assert above_info(diagnose(clean, tiny_llama, t0)) == []


def steps_while(rid: str, req, num_seqs: int, first_id: int):
    return [step(rid, first_id + k, req.scheduled_time + k * 0.01, num_seqs=num_seqs) for k in range(3)]


def test_one_batch_variance_occurrence_is_only_info_with_batch_sizes(clean, tiny_llama, tok):
    t0 = time.time() - 3600
    fleet(clean, tok, t0, ("r0", 0, {}), ("r1", 0, {}))
    solo = probe("r0", 0, 7, t0)
    batched = probe("r0", 0, 7, t0, "batched", output=bad(7))
    reqs = [probe(r, 0, i, t0, m) for r in ("r0", "r1") for i in range(N) for m in ("solo", "batched")
            if not (r == "r0" and i == 7)] + [solo, batched]
    clean.insert_records("requests", reqs)
    clean.insert_records("steps", steps_while("r0", solo, 1, 0) + steps_while("r0", batched, 6, 10))
    findings = diagnose(clean, tiny_llama, t0)
    assert above_info(findings) == []
    (f,) = [x for x in findings if x.kind == "batch_variance"]
    assert (f.severity, f.subject, f.evidence["probes"], f.evidence["occurrences"]) == ("info", "r0", ["q07"], 1)
    ex = f.evidence["examples"][0]
    assert (ex["solo_batch_size"], ex["batched_batch_size"], ex["first_divergence"]) == (1, 6, 2)
    assert "near-tie argmax" in f.evidence["note"] and "batch of 6" in f.summary and "probe q07" in f.summary


@pytest.mark.parametrize("spread", ["two probes", "two rounds"])
def test_batch_variance_on_two_probes_or_in_two_rounds_is_a_warning(clean, tiny_llama, tok, spread):
    t0 = time.time() - 3600
    fleet(clean, tok, t0, ("r0", 0, {}), ("r1", 0, {}))
    flips = {(0, 3), (0, 4)} if spread == "two probes" else {(0, 3), (1, 3)}
    reqs = [probe(r, rnd, i, t0, m, output=bad(i) if (r, m) == ("r0", "batched") and (rnd, i) in flips else None)
            for r in ("r0", "r1") for rnd in (0, 1) for i in range(N) for m in ("solo", "batched")]
    clean.insert_records("requests", reqs)
    (f,) = above_info(diagnose(clean, tiny_llama, t0))
    assert (f.kind, f.severity, f.subject, f.evidence["occurrences"]) == ("batch_variance", "warning", "r0", 2)


def test_too_few_replicas_or_probes_say_what_is_missing(clean, tiny_llama, tok):
    t0 = time.time() - 3600
    fleet(clean, tok, t0, ("r0", 0, {}), ("r1", 60, {"config_hash": "cfg-new"}))
    clean.insert_records("requests", [probe("r0", 0, i, t0) for i in range(N)])
    findings = diagnose(clean, tiny_llama, t0)
    drift = [f for f in findings if f.evidence.get("for_kind") == "probe_drift"]
    assert [(f.subject, f.insufficient) for f in drift] == [("tiny", True)]
    assert "only by r0" in drift[0].summary
    assert [f for f in findings if f.evidence.get("for_kind") == "batch_variance"]  # no batched probes at all
    clean.insert_records("requests", [probe("r1", 0, i, t0, output=bad(i)) for i in range(3)])
    findings = diagnose(clean, tiny_llama, t0)
    assert above_info(findings) == []
    (f,) = [f for f in findings if f.subject == "r1"]
    assert f.insufficient and "r1 answered 3 probes" in f.summary and "need 5" in f.summary


def _started_together(store, tok, t0: float, **r1) -> None:
    """One fleet start (one deploy instant); r1, whose every probe differs, wrote its row 88 ms before r0's."""
    fleet(store, tok, t0, ("r0", 0.088, {"deploy_time": t0 - 20}),
          ("r1", 0, {"deploy_time": t0 - 20, "weights_hash": "w-rope", **r1}))
    store.insert_records("requests", [probe("r0", 0, i, t0) for i in range(N)]
                         + [probe("r1", 0, i, t0, output=bad(i)) for i in range(N)])


def test_a_pair_started_together_gets_one_symmetric_finding_never_a_critical_on_one_side(clean, tiny_llama, tok):
    t0 = time.time() - 3600
    _started_together(clean, tok, t0, config_hash="cfg-rope")
    findings = diagnose(clean, tiny_llama, t0)
    assert not [f for f in findings if f.severity == "critical"]
    (f,) = above_info(findings)
    assert (f.kind, f.severity, f.subject) == ("probe_drift", "warning", "r0 vs r1")
    assert "r0 and r1 disagree on 40 of 40 probes" in f.summary and "no baseline" in f.summary
    assert "`role`" in f.summary and f.evidence["symmetric"] and f.evidence["baseline"]["rule"] == "none"


def test_a_recorded_role_names_the_candidate_of_a_pair_started_together(clean, tiny_llama, tok):
    t0 = time.time() - 3600
    _started_together(clean, tok, t0, role="candidate")
    (f,) = above_info(diagnose(clean, tiny_llama, t0))
    assert (f.kind, f.severity, f.subject) == ("probe_drift", "critical", "r1")
    assert f.evidence["baseline"]["rule"] == "role"


def test_a_clean_fleet_says_the_checks_ran(clean, tiny_llama, tok):
    t0 = time.time() - 3600
    fleet(clean, tok, t0, ("c0", 0, {}), ("c1", 60, {"config_hash": "cfg-new"}))
    clean.insert_records("requests", [probe(r, 0, i, t0, mode) for r in ("c0", "c1") for i in range(N)
                                      for mode in ("solo", "batched")])
    findings = diagnose(clean, tiny_llama, t0)
    assert above_info(findings) == []
    (agree,) = [f for f in findings if f.kind == "probe_agreement"]
    assert f"c1 = c0 on {N} of {N} probes" in agree.summary
    (invariant,) = [f for f in findings if f.kind == "batch_invariant"]
    assert f"{2 * N} of {2 * N} solo/batched probe pairs identical" in invariant.summary


def test_a_round_still_arriving_is_left_out(clean, tiny_llama, tok):
    # round 0 settled and identical; round 1 arriving now: the canary's first answers differ, most not in yet
    t0 = time.time() - 100
    fleet(clean, tok, t0, ("a0", -3600, {}), ("a1", -3500, {"config_hash": "cfg-new"}))
    clean.insert_records("requests", [probe(r, 0, i, t0 - 3000) for r in ("a0", "a1") for i in range(N)]
                         + [probe("a0", 1, i, t0) for i in range(N)] + [probe("a1", 1, i, t0, output=bad(i))
                                                                         for i in range(3)])
    findings = diagnose(clean, tiny_llama, t0 - 3000)
    assert above_info(findings) == [] and not [f for f in findings if f.kind == "insufficient_data"
                                               and f.evidence.get("for_kind") == "probe_drift"]
    (arriving,) = [f for f in findings if f.kind == "probe_round_arriving"]
    assert arriving.evidence["rounds"] == [f"p{int((t0 + 100) * 1000)}"]
