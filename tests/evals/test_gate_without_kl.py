"""The gate with runs only (no configuration to teacher-force): what GATE.md promises for
`require_logit_drift`. True: it cannot decide (GateError, exit 2). False: the KL checks are
skipped and the verdict follows from accuracy and greedy agreement alone."""

from __future__ import annotations

import dataclasses

import pytest

from evals.gate import KL_CHECKS, GateError, run_gate
from evals.policy import load_policy
from evals.report import gate_markdown
from evals.results import EvalRun
from evals.sides import Side


def _policy(tmp_path, require_logit_drift: bool):
    path = tmp_path / "p.toml"
    path.write_text(f"[drift]\nrequire_logit_drift = {str(require_logit_drift).lower()}\n")
    return load_policy(path)


def _runs_only(name: str, run: EvalRun) -> Side:
    return Side(name, {run.run.suite: run}, config=None, config_note="runs from an HTTP endpoint")


def _everything_wrong(run: EvalRun) -> EvalRun:
    """The same outputs (greedy agreement stays 1.0), every score 0: only accuracy can fail it."""
    items = [dataclasses.replace(i, score=0.0) for i in run.items]
    return EvalRun(dataclasses.replace(run.run, run_id=run.run.run_id + "-wrong"), items)


def test_require_logit_drift_true_refuses_to_decide_without_kl(baseline_run, tmp_path):
    with pytest.raises(GateError, match="require_logit_drift = false"):
        run_gate(_runs_only("baseline", baseline_run), _runs_only("candidate", baseline_run),
                 _policy(tmp_path, True), progress=False)


def test_require_logit_drift_false_passes_on_accuracy_alone(baseline_run, tmp_path):
    r = run_gate(_runs_only("baseline", baseline_run), _runs_only("candidate", baseline_run),
                 _policy(tmp_path, False), progress=False)
    assert r.drift.stats is None  # nothing was teacher-forced
    by_name = {c.name: c for c in r.checks}
    for name in KL_CHECKS:
        assert by_name[name].skipped and by_name[name].passed and by_name[name].value is None
    decided = [c for c in r.checks if not c.skipped]
    assert {c.name for c in decided} == {"accuracy drop", "paired test (mcnemar)", "greedy output agreement"}
    assert all(c.passed for c in decided)
    assert r.verdict == "pass", gate_markdown(r)
    reported = {c["name"]: c["skipped"] for c in r.to_dict()["checks"]}  # the JSON report says so too
    assert all(reported[name] for name in KL_CHECKS) and not reported["accuracy drop"]
    assert any("KL statistics not computed" in n for n in r.notes)
    rows = [line for line in gate_markdown(r).splitlines() if line.startswith("| ") and "|" in line[2:]]
    for name in KL_CHECKS:  # the markdown report says "skipped", not "pass"
        (row,) = [line for line in rows if line.startswith(f"| {name} |")]
        assert "| skipped |" in row


def test_require_logit_drift_false_still_fails_on_accuracy(baseline_run, tmp_path):
    assert any(i.score >= 0.5 for i in baseline_run.items), "the reference target gets some items right"
    r = run_gate(_runs_only("baseline", baseline_run), _runs_only("candidate", _everything_wrong(baseline_run)),
                 _policy(tmp_path, False), progress=False)
    failed = {c.name for c in r.checks if not c.passed}
    assert "accuracy drop" in failed and not failed & set(KL_CHECKS)
    assert r.verdict == "fail"
