"""The gate's readable report (markdown) and the drift summary as text."""

from __future__ import annotations

from evals.gate import GateResult
from evals.logit_drift import DriftReport


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _tok(token_id: int, text: str) -> str:
    """`17 'ing'`: the ID and its text, escaped so that a newline or a pipe cannot break the table."""
    if not text:
        return str(token_id)
    shown = repr(text).replace("|", "\\|")
    return f"{token_id} {shown}"


def drift_lines(d: DriftReport) -> list[str]:
    lines = []
    s = d.stats
    if s is not None:
        lines += [
            f"| positions (teacher-forced output tokens) | {s.positions} |",
            f"| mean KL divergence | {s.kl_mean:.6f} ± {s.kl_mean_se:.6f} |",
            f"| median KL divergence | {s.kl_median:.6f} |",
            f"| p99 KL divergence | {s.kl_p99:.6f} |",
            f"| max KL divergence | {s.kl_max:.6f} |",
            f"| same top p | {100 * s.same_top_p:.3f} ± {100 * s.same_top_p_se:.3f} % |",
            f"| mean Δp | {100 * s.delta_p_mean:.3f} ± {100 * s.delta_p_mean_se:.3f} % |",
            f"| RMS Δp | {100 * s.delta_p_rms:.3f} % |",
        ]
        if d.baseline_reproduction is not None:
            lines.append(f"| baseline reproduces its own run's tokens | {_pct(d.baseline_reproduction)} |")
    g = d.greedy
    if g is not None:
        lo, hi = g.agreement_ci
        lines.append(f"| greedy outputs identical | {g.identical}/{g.items} = {_pct(g.agreement)} "
                     f"[{_pct(lo)} - {_pct(hi)}] |")
        if g.divergence_positions:
            lines.append(f"| first divergence (token index), median / min | {g.median_first_divergence:g} / "
                         f"{g.min_first_divergence} |")
    return ["| statistic | value |", "|---|---|"] + lines if lines else ["(no drift statistics)"]


def gate_markdown(r: GateResult) -> str:
    out = [f"# Eval gate: **{r.verdict.upper()}**", "",
           f"- baseline: {r.baseline}", f"- candidate: {r.candidate}",
           f"- policy: {r.policy.get('path') or '(defaults)'}", ""]
    failed = [c for c in r.checks if not c.passed]
    if failed:
        out.append("Failed checks: " + "; ".join(f"{c.name} ({c.scope})" for c in failed) + ".")
        out.append("")
    out += ["## Accuracy", "",
            "| suite | items | baseline | candidate | Δ | McNemar b / c, mid-p | bootstrap Δ [CI] |",
            "|---|---|---|---|---|---|---|"]
    for s in r.suites:
        mc, bs = s.mcnemar, s.bootstrap
        out.append(
            f"| {s.suite} | {s.items} "
            f"| {_pct(s.baseline_accuracy)} [{_pct(s.baseline_ci[0])} - {_pct(s.baseline_ci[1])}] "
            f"| {_pct(s.candidate_accuracy)} [{_pct(s.candidate_ci[0])} - {_pct(s.candidate_ci[1])}] "
            f"| {100 * s.delta:+.1f} pt | {mc['baseline_only']} / {mc['candidate_only']}, {mc['p_mid']:.3g} "
            f"| {100 * bs['delta']:+.1f} pt [{100 * bs['ci_low']:+.1f}, {100 * bs['ci_high']:+.1f}] |")
    for s in r.suites:
        if len(s.by_task) > 1:
            out += ["", f"Per task ({s.suite}):", "", "| task | items | baseline | candidate |", "|---|---|---|---|"]
            for task, t in s.by_task.items():
                out.append(f"| {task} | {t['n']} | {_pct(t['baseline'] / t['n'])} | {_pct(t['candidate'] / t['n'])} |")
    out += ["", "## Drift (candidate vs the baseline's outputs, teacher-forced)", ""] + drift_lines(r.drift)
    if r.drift.worst:
        out += ["", "Largest KL positions:", "", "| item | output index | token | KL | baseline top | candidate top |",
                "|---|---|---|---|---|---|"]
        out += [f"| {w.item_id} | {w.position} | {_tok(w.token_id, w.token)} | {w.kl:.4f} "
                f"| {_tok(w.baseline_top, w.baseline_top_token)} | {_tok(w.candidate_top, w.candidate_top_token)} |"
                for w in r.drift.worst]
    out += ["", "## Checks", "", "| check | scope | value | threshold | result | detail |", "|---|---|---|---|---|---|"]
    for c in r.checks:
        value = "not measured" if c.value is None else f"{c.value:.4g}"
        thr = f"p < {c.threshold:g} and worse" if c.op == "not significantly worse" else f"{c.op} {c.threshold:g}"
        result = "skipped" if c.skipped else ("pass" if c.passed else "**FAIL**")
        out.append(f"| {c.name} | {c.scope} | {value} | {thr} | {result} | {c.detail} |")
    if r.notes:
        out += ["", "## Notes", ""] + [f"- {n}" for n in r.notes]
    return "\n".join(out) + "\n"
