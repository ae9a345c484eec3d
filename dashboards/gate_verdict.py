"""The Evals page's bridge to the eval gate (`evals.gate`).

The gate's own checks on two stored runs: accuracy drop and the paired test per suite, and
greedy-output agreement (`evals.gate.compare_suite`, `accuracy_checks`, `drift_checks` with the
policy's thresholds). The KL-divergence checks need both configurations loaded in engines, so
the dashboard leaves them to `infersight eval gate` and says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import streamlit as st

from evals import gate
from evals import policy as policy_module
from evals.results import EvalRun


@dataclass
class GateVerdict:
    available: bool
    headline: str
    passed: bool = True
    checks: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _policy():
    default = Path(policy_module.__file__).resolve().parent / "policies" / "default.toml"
    policy = policy_module.load_policy(default) if default.is_file() else policy_module.Policy()
    # teacher-forced KL needs engines: not computed from stored runs
    policy.max_mean_kl = policy.max_p99_kl = policy.min_same_top_p = None
    return policy


@st.cache_data(ttl=300, show_spinner="Running the eval gate's checks ...")
def cached(baseline_run: str, candidate_run: str) -> GateVerdict:
    """The verdict for two runs of the dashboard's store (runs are immutable: cache it)."""
    from dashboards import data

    return run(data.store(), baseline_run=baseline_run, candidate_run=candidate_run)


def run(store, *, baseline_run: str, candidate_run: str) -> GateVerdict:
    try:
        policy = _policy()
        base = EvalRun.from_store(store, baseline_run)
        cand = EvalRun.from_store(store, candidate_run)
        comparison = gate.compare_suite(base, cand, policy)
        drift = gate.compute_drift([base], None, None, [cand])
        checks = gate.accuracy_checks(comparison, policy) + gate.drift_checks(drift, policy)
    except Exception as e:  # the page keeps working when the gate cannot decide
        return GateVerdict(False, f"The eval gate could not decide on these runs: {e}")
    passed = all(c.passed for c in checks)
    failed = [c.name for c in checks if not c.passed]
    headline = ("pass: " if passed else "FAIL: ") + (
        "every check within the policy" if passed else ", ".join(failed) + " outside the policy")
    rows = [{"check": c.name, "scope": c.scope, "value": c.value, "threshold": c.threshold, "op": c.op,
             "passed": c.passed, "detail": c.detail} for c in checks]
    notes = ["KL divergence and same-top-token checks need both configurations loaded: run "
             "`infersight eval gate` for the full gate."]
    return GateVerdict(True, headline, passed, rows, notes)
