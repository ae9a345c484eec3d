"""The deploy gate: does a candidate configuration answer as well as the baseline, and stay close to it?

Per suite: accuracy of both sides with Wilson intervals, and a paired test on
per-item correctness (McNemar mid-p or paired bootstrap). Pooled over suites:
the llama.cpp drift statistics of the candidate against the baseline's
teacher-forced outputs, and greedy-output agreement. Per replay run given
(`--replay`, evals/replay): the share of stored production prompts the
candidate answers token for token as the reference did. Each check compares one
of these numbers with the policy's threshold; the verdict is "pass" only when
every check passes. `infersight eval gate` exits 0 on pass, 1 on fail, 2 on error.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from evals.logit_drift import DriftReport, compute_drift
from evals.policy import Policy, policy_dict
from evals.replay.summary import summarize_replay
from evals.results import EvalRun
from evals.runner import run_suite
from evals.sides import Side
from evals.stats import mcnemar, paired_bootstrap, wilson_interval
from evals.suite import load_suite


@dataclass
class Check:
    name: str
    scope: str  # a suite name, or "all suites"
    value: float | None
    threshold: float
    op: str  # "<=" | ">=" | "not significantly worse"
    passed: bool
    detail: str = ""
    skipped: bool = False  # not measured, and the policy allows that: it does not decide the verdict


@dataclass
class SuiteComparison:
    suite: str
    items: int  # paired items (in both runs)
    baseline_correct: int
    candidate_correct: int
    baseline_accuracy: float
    candidate_accuracy: float
    baseline_ci: tuple[float, float]
    candidate_ci: tuple[float, float]
    delta: float  # candidate - baseline
    mcnemar: dict
    bootstrap: dict
    by_task: dict = field(default_factory=dict)  # task -> {n, baseline, candidate}


@dataclass
class GateResult:
    verdict: str  # "pass" | "fail"
    baseline: str
    candidate: str
    policy: dict
    suites: list[SuiteComparison]
    drift: DriftReport
    checks: list[Check]
    run_ids: dict = field(default_factory=dict)  # side -> {suite: run_id}; "replay" -> [run_id]
    notes: list[str] = field(default_factory=list)
    replays: list[dict] = field(default_factory=list)  # a ReplaySummary (as a dict) per --replay run

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["drift"] = self.drift.to_dict()
        return d


def compare_suite(base: EvalRun, cand: EvalRun, policy: Policy) -> SuiteComparison:
    cand_scores = cand.scores()
    paired = [(i, cand_scores[i.item_id]) for i in base.items if i.item_id in cand_scores]
    if not paired:
        raise ValueError(f"suite {base.run.suite}: the two runs share no item ids")
    a = [float(i.score >= 0.5) for i, _ in paired]
    b = [float(s >= 0.5) for _, s in paired]
    n, ka, kb = len(paired), int(sum(a)), int(sum(b))
    mc = mcnemar(a, b)
    boot = paired_bootstrap(a, b, policy.bootstrap_resamples, policy.confidence, policy.seed)
    by_task: dict[str, dict] = {}
    for (item, cs), x, y in zip(paired, a, b):
        t = by_task.setdefault(item.task or "(none)", {"n": 0, "baseline": 0, "candidate": 0})
        t["n"] += 1
        t["baseline"] += int(x)
        t["candidate"] += int(y)
    return SuiteComparison(
        suite=base.run.suite, items=n, baseline_correct=ka, candidate_correct=kb, baseline_accuracy=ka / n,
        candidate_accuracy=kb / n, baseline_ci=wilson_interval(ka, n, policy.confidence),
        candidate_ci=wilson_interval(kb, n, policy.confidence), delta=(kb - ka) / n,
        mcnemar={**asdict(mc), "discordant": mc.discordant}, bootstrap=asdict(boot),
        by_task=dict(sorted(by_task.items())))


def accuracy_checks(c: SuiteComparison, policy: Policy) -> list[Check]:
    drop = c.baseline_accuracy - c.candidate_accuracy
    ok = drop <= policy.max_accuracy_drop + 1e-12  # a drop of exactly the threshold is allowed
    checks = [Check("accuracy drop", c.suite, drop, policy.max_accuracy_drop, "<=", ok,
                    f"{c.baseline_accuracy:.1%} -> {c.candidate_accuracy:.1%}")]
    worse = c.candidate_correct < c.baseline_correct
    if policy.paired_test == "mcnemar":
        p = c.mcnemar["p_mid"]
        detail = (f"McNemar mid-p = {p:.3g} (baseline-only right {c.mcnemar['baseline_only']}, "
                  f"candidate-only right {c.mcnemar['candidate_only']})")
    else:
        p = c.bootstrap["p_value"]
        detail = (f"paired bootstrap p = {p:.3g}, delta {c.bootstrap['delta']:+.3f} "
                  f"[{c.bootstrap['ci_low']:+.3f}, {c.bootstrap['ci_high']:+.3f}]")
    checks.append(Check(f"paired test ({policy.paired_test})", c.suite, p, policy.alpha, "not significantly worse",
                        not (worse and p < policy.alpha), detail))
    return checks


# the checks that need the teacher-forced KL statistics (both sides' configurations loadable here)
KL_CHECKS = ("mean KL divergence", "p99 KL divergence", "same top token")


def drift_checks(d: DriftReport, policy: Policy) -> list[Check]:
    """One check per drift threshold. A KL statistic that was not computed fails its check, unless the
    policy says `require_logit_drift = false`: then the check is skipped (the gate decides on the rest)."""
    checks = []
    s = d.stats
    limits = [("mean KL divergence", policy.max_mean_kl, "<=", s.kl_mean if s else None,
               f"± {s.kl_mean_se:.2g}" if s else ""),
              ("p99 KL divergence", policy.max_p99_kl, "<=", s.kl_p99 if s else None, ""),
              ("same top token", policy.min_same_top_p, ">=", s.same_top_p if s else None,
               f"± {s.same_top_p_se:.2g}" if s else ""),
              ("greedy output agreement", policy.min_greedy_agreement, ">=", d.greedy.agreement if d.greedy else None,
               f"{d.greedy.identical}/{d.greedy.items} identical" if d.greedy else "")]
    for name, threshold, op, value, detail in limits:
        if threshold is None:
            continue
        if value is None:
            if name in KL_CHECKS and not policy.require_logit_drift:
                checks.append(Check(name, "all suites", None, threshold, op, True,
                                    "skipped: not measured, and the policy has require_logit_drift = false",
                                    skipped=True))
            else:
                checks.append(Check(name, "all suites", None, threshold, op, False, "not measured"))
            continue
        ok = value <= threshold if op == "<=" else value >= threshold
        checks.append(Check(name, "all suites", value, threshold, op, ok, detail))
    return checks


def replay_checks(runs: list[EvalRun], policy: Policy) -> tuple[list[Check], list[dict]]:
    """One check per replay run (none when min_replay_agreement is off), and each run's summary."""
    checks, summaries = [], []
    for run in runs:
        s = summarize_replay(run, policy.confidence)
        summaries.append(asdict(s))
        if policy.min_replay_agreement is None:
            continue
        lo, hi = s.ci
        detail = (f"{s.identical}/{s.items} identical [{lo:.1%} - {hi:.1%}], {s.errors} errors, "
                  f"against {s.endpoint}")
        if s.median_first_divergence is not None:
            detail += f"; first divergence median {s.median_first_divergence:g}, min {s.min_first_divergence}"
        checks.append(Check("replay agreement", f"{s.suite} ({s.run_id})", s.share, policy.min_replay_agreement,
                            ">=", s.share >= policy.min_replay_agreement, detail))
    return checks, summaries


class GateError(ValueError):
    """The gate cannot decide (bad input, nothing to compare): exit 2."""


def _engine(side: Side, cache: dict):
    if side.name not in cache:
        from evals.backends import EngineBackend

        cache[side.name] = EngineBackend(side.config)
    return cache[side.name]


def run_gate(baseline: Side, candidate: Side, policy: Policy, progress: bool = True,
             store_target=None, replays: list[EvalRun] | None = None) -> GateResult:
    """`replays`: replay runs of the candidate (evals/replay), each one more check."""
    notes: list[str] = []
    replays = list(replays or [])
    if any(not r.items for r in replays):
        raise GateError("a replay run has no items: it compares nothing")
    # which suites: both sides' runs if they have them, else the policy's
    suite_files = {load_suite(p).name: p for p in policy.suites}
    if baseline.runs and candidate.runs:
        names = [s for s in baseline.runs if s in candidate.runs]
    else:
        names = list(baseline.runs or candidate.runs or suite_files)
    if not names:
        raise GateError("no suite to compare: the runs share no suite and the policy names none")
    engines: dict = {}
    try:
        for side in (baseline, candidate):
            for name in names:
                if name in side.runs:
                    continue
                if side.config is None:
                    raise GateError(f"{side.name}: no run of suite {name!r} and no configuration to run it")
                if name not in suite_files:
                    raise GateError(f"suite {name!r} is not among the policy's suites {sorted(suite_files)}")
                suite = load_suite(suite_files[name]).subset(policy.max_items, policy.per_task)
                run = run_suite(suite, _engine(side, engines), policy.max_tokens, progress=progress,
                                notes=f"gate {side.name}")
                side.runs[name] = run
                if store_target is not None:
                    from evals.runner import store_run

                    store_run(run, store_target)
        comparisons = [compare_suite(baseline.runs[n], candidate.runs[n], policy) for n in names]
        base_runs = [baseline.runs[n] for n in names]
        cand_runs = [candidate.runs[n] for n in names]
        base_scorer = cand_scorer = None
        if baseline.config is not None and candidate.config is not None:
            from evals.teacher_forcing import EngineScorer

            base_scorer = EngineScorer(_engine(baseline, engines).engine)
            cand_scorer = EngineScorer(_engine(candidate, engines).engine)
        else:
            why = baseline.config_note or candidate.config_note or "a side has no loadable configuration"
            if policy.require_logit_drift:
                raise GateError(f"cannot compute the KL statistics ({why}); give configurations, "
                                f"or set require_logit_drift = false in the policy")
            notes.append(f"KL statistics not computed: {why}")
        drift = compute_drift(base_runs, base_scorer, cand_scorer, cand_runs, progress=progress)
    finally:
        for backend in engines.values():
            backend.close()
    if drift.baseline_reproduction is not None and drift.baseline_reproduction < 0.99:
        notes.append(f"the baseline configuration reproduces only {drift.baseline_reproduction:.1%} of its run's "
                     f"greedy tokens: the run may not come from this configuration")
    checks = [c for comp in comparisons for c in accuracy_checks(comp, policy)] + drift_checks(drift, policy)
    more, replay_summaries = replay_checks(replays, policy)
    checks += more
    if replays and policy.min_replay_agreement is None:
        notes.append("replay runs given, but the policy switches min_replay_agreement off: they do not decide")
    verdict = "pass" if all(c.passed for c in checks) else "fail"
    return GateResult(verdict=verdict, baseline=baseline.describe(), candidate=candidate.describe(),
                      policy=policy_dict(policy), suites=comparisons, drift=drift, checks=checks,
                      run_ids={"baseline": {n: baseline.runs[n].run_id for n in names},
                               "candidate": {n: candidate.runs[n].run_id for n in names},
                               **({"replay": [r.run_id for r in replays]} if replays else {})},
                      notes=notes, replays=replay_summaries)
