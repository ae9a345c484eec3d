"""The gate on the reference target: a candidate that should pass passes, one that really drifts fails,
and every verdict is the conjunction of checks that each follow from a measured statistic."""

from __future__ import annotations

import pytest

from evals.gate import run_gate
from evals.policy import load_policy
from evals.report import gate_markdown
from evals.sides import Side


@pytest.fixture(scope="module")
def policy(tmp_path_factory, heldout_path):
    path = tmp_path_factory.mktemp("policy") / "p.toml"
    path.write_text(f'[run]\nsuites = ["{heldout_path}"]\nper_task = 4\n')  # the default thresholds
    return load_policy(path)


def _gate(baseline_run, engine_config, policy, **candidate):
    base = Side("baseline", {baseline_run.run.suite: baseline_run}, engine_config())
    return run_gate(base, Side("candidate", config=engine_config(**candidate)), policy, progress=False)


def _assert_checks_follow_from_statistics(result, policy):
    stats, greedy = result.drift.stats, result.drift.greedy
    expected = {
        "mean KL divergence": stats.kl_mean <= policy.max_mean_kl,
        "p99 KL divergence": stats.kl_p99 <= policy.max_p99_kl,
        "same top token": stats.same_top_p >= policy.min_same_top_p,
        "greedy output agreement": greedy.agreement >= policy.min_greedy_agreement,
    }
    for suite in result.suites:
        expected["accuracy drop"] = suite.baseline_accuracy - suite.candidate_accuracy <= policy.max_accuracy_drop
        worse = suite.candidate_correct < suite.baseline_correct
        expected["paired test (mcnemar)"] = not (worse and suite.mcnemar["p_mid"] < policy.alpha)
    assert {c.name: c.passed for c in result.checks} == expected
    assert result.verdict == ("pass" if all(expected.values()) else "fail")


def test_bfloat16_passes(baseline_run, engine_config, policy):
    r = _gate(baseline_run, engine_config, policy, dtype="bfloat16")
    _assert_checks_follow_from_statistics(r, policy)
    assert r.verdict == "pass", gate_markdown(r)
    assert r.drift.baseline_reproduction == 1.0  # the fp32 engine teacher-forced = its own greedy run
    assert 0 < r.drift.stats.kl_mean < 0.01 and r.drift.stats.same_top_p > 0.98


def test_int8_passes(baseline_run, engine_config, policy):
    r = _gate(baseline_run, engine_config, policy, quantization="int8")
    _assert_checks_follow_from_statistics(r, policy)
    assert r.verdict == "pass", gate_markdown(r)
    assert r.drift.stats.kl_mean < 0.01


def test_damaged_checkpoint_fails(baseline_run, engine_config, policy, damaged_dir):
    r = _gate(baseline_run, engine_config, policy, model=damaged_dir)
    _assert_checks_follow_from_statistics(r, policy)
    assert r.verdict == "fail"
    failed = {c.name for c in r.checks if not c.passed}
    assert {"mean KL divergence", "same top token"} <= failed, gate_markdown(r)
    md = gate_markdown(r)
    assert "# Eval gate: **FAIL**" in md and "**FAIL**" in md and "mean KL divergence" in md


def test_same_configuration_is_a_perfect_pass(baseline_run, engine_config, policy):
    r = _gate(baseline_run, engine_config, policy)
    assert r.verdict == "pass"
    assert r.drift.stats.kl_max == pytest.approx(0.0, abs=1e-9) and r.drift.stats.same_top_p == 1.0
    assert r.drift.greedy.agreement == 1.0 and r.suites[0].mcnemar["discordant"] == 0
