"""Speculative decoding: acceptance rate (overall and per draft position) by replica and version, and its drops.

The unit is the request, never the draft token: acceptance varies between requests far more than
a binomial over tokens allows (prompts differ in how predictable they are), so token-level tests
call identical replicas different. Each group's rate is a ratio estimator, accepted / proposed
summed over its clusters, with the delta-method cluster variance (evals.stats.ClusterSums;
sums from diagnostics.spec_sums):
- overall: requests as clusters, stratified by workload and standardised to the two sides' pooled
  mix, so a replica that served more of a low-acceptance workload is not called a drop; where
  requests carry no speculative counts, 10-second blocks of steps as clusters (unstratified);
- per position (steps only carry them): time blocks as clusters; rate = accepted / (proposed / k).
Comparisons: each replica against the rest of its model and mode, each version against the one
before, or an explicit candidate against a baseline. A drop is a finding when the overall rate
falls significantly (Holm over every overall comparison of the run, alpha 0.01; both the
difference and the log ratio Wald tests) and materially: by >= 20% relative or >= 10 points
absolute. Positions (Holm over comparisons x positions) say where it dropped; they do not fire
on their own, since they cannot be stratified by workload (the overall rate is their mean). A
cluster-robust Wald test says whether the replicas of a group differ at all.
"""

from __future__ import annotations

from diagnostics.findings import Finding, insufficient
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope
from diagnostics.spec_sums import BLOCK_SECONDS, acceptance, pool
from evals.stats import ClusterSums, RatioComparison, compare_ratios, holm, ratio_homogeneity

DIAGNOSTIC = "speculative"
KIND = "spec_acceptance_drop"
MIN_PROPOSED = 100
MIN_CLUSTERS = 20  # requests (or time blocks) per side in a shared workload for a cluster variance
MIN_DROP = 0.10  # absolute drop in acceptance rate worth a finding
MIN_RELATIVE_DROP = 0.20  # or relative: 9.9% -> 7.7% matters although it is 2.2 points
CRITICAL_DROP = 0.25
CRITICAL_RELATIVE_DROP = 0.5
ALPHA = 0.01


def _overall(base: dict, cand: dict) -> tuple[str, RatioComparison | None]:
    """Requests (stratified by workload) where both sides have them, else time blocks of steps."""
    c = compare_ratios(base["requests"], cand["requests"], min_clusters=MIN_CLUSTERS, confidence=1 - ALPHA)
    if c is not None:
        return "request", c
    return f"{BLOCK_SECONDS}-second block of steps", compare_ratios(
        {"all": base["blocks"]}, {"all": cand["blocks"]}, min_clusters=MIN_CLUSTERS, confidence=1 - ALPHA)


def compare_groups(base: dict, cand: dict) -> dict:
    """Overall and per-position comparisons of candidate against baseline (not yet corrected)."""
    unit, overall = _overall(base, cand)
    positions = []
    for i in range(min(len(base["positions"]), len(cand["positions"]))):
        c = compare_ratios({"all": base["positions"][i]}, {"all": cand["positions"][i]},
                           min_clusters=MIN_CLUSTERS, confidence=1 - ALPHA)
        if c is not None:
            positions.append({"position": i, "rate_a": c.rate_baseline, "rate_b": c.rate_candidate,
                              "difference": c.difference, "difference_ci": c.difference_ci,
                              "relative": c.relative, "relative_ci": c.relative_ci, "p_value": c.p_value,
                              "blocks_a": c.clusters_baseline, "blocks_b": c.clusters_candidate})
    return {"unit": unit, "overall": overall, "positions": positions}


def _material(difference: float, relative: float | None) -> bool:
    return -difference >= MIN_DROP or (relative is not None and -relative >= MIN_RELATIVE_DROP)


def decide(results: list[dict]) -> None:
    """Holm over the overall tests of all comparisons, and over all their positions; marks drops in place."""
    tested = [r for r in results if r["overall"] is not None]
    for r, p in zip(tested, holm([r["overall"].p_value for r in tested])):
        o = r["overall"]
        r["p_adjusted"] = p
        r["overall_drop"] = p < ALPHA and o.difference < 0 and _material(o.difference, o.relative)
    positions = [p for r in tested for p in r["positions"]]
    for pos, p in zip(positions, holm([p["p_value"] for p in positions])):
        pos["p_adjusted"] = p
        pos["dropped"] = p < ALPHA and pos["difference"] < 0 and _material(pos["difference"], pos["relative"])
    for r in tested:
        r["dropped_positions"] = [p for p in r["positions"] if p["dropped"]]


def _finding(r: dict) -> Finding:
    o: RatioComparison = r["overall"]
    worst_abs = max([-o.difference] + [-p["difference"] for p in r["dropped_positions"]])
    critical = worst_abs >= CRITICAL_DROP or -o.relative >= CRITICAL_RELATIVE_DROP
    pos = ", ".join(f"position {p['position']}: {p['rate_a']:.0%} -> {p['rate_b']:.0%}"
                    for p in r["dropped_positions"][:3])
    summary = (f"{r['what']}: speculative acceptance {o.rate_baseline:.1%} -> {o.rate_candidate:.1%} "
               f"({o.relative:+.0%}, {1 - ALPHA:.0%} CI {o.relative_ci[0]:+.0%} to {o.relative_ci[1]:+.0%}; "
               f"per {r['unit']}, {o.clusters_baseline} vs {o.clusters_candidate}; Holm p={r['p_adjusted']:.1e})"
               + (f"; {pos}" if pos else ""))
    evidence = {"baseline": _describe(r["base"]), "candidate": _describe(r["cand"]), "unit": r["unit"],
                "overall": o.to_dict(), "overall_drop": True, "p_adjusted": r["p_adjusted"],
                "positions": r["positions"], "dropped_positions": r["dropped_positions"], **r["extra"],
                "controlled_for": "workload mix (strata standardised to the pooled mix)" if r["unit"] == "request"
                else "nothing: steps carry no workload",
                "method": f"ratio estimator accepted/proposed per group with delta-method cluster variance "
                          f"(cluster = {r['unit']}); Wald z on the difference and the log ratio; Holm over all "
                          f"overall comparisons (and over comparisons x positions); a drop is significant and "
                          f">= {MIN_RELATIVE_DROP:.0%} relative or >= {MIN_DROP:.0%} points"}
    return Finding(KIND, "critical" if critical else "warning", r["subject"], summary, DIAGNOSTIC, r["scope"], evidence)


def _describe(g: dict) -> dict:
    return {"replicas": g["replicas"], "proposed": g["proposed"], "accepted": g["accepted"],
            "drafts": g["drafts"], "per_pos": g["per_pos"], "requests": g["requests_n"], "blocks": g["blocks"].n}


def _comparison(subject: str, what: str, scope: Scope, base: dict, cand: dict, extra: dict) -> dict:
    return {"subject": subject, "what": what, "scope": scope, "base": base, "cand": cand, "extra": extra,
            **compare_groups(base, cand)}


def _insufficient(r: dict) -> Finding:
    return insufficient(KIND, r["subject"], DIAGNOSTIC, r["scope"],
                        f"fewer than {MIN_CLUSTERS} requests with drafts per side in any shared workload, and fewer "
                        f"than {MIN_CLUSTERS} {BLOCK_SECONDS}-second blocks of speculative steps per side "
                        f"(baseline {r['base']['requests_n']} requests / {r['base']['blocks'].n} blocks, candidate "
                        f"{r['cand']['requests_n']} / {r['cand']['blocks'].n})")


def _heterogeneity(group: list[dict]) -> tuple[float, float] | None:
    """(chi-square, p) of the cluster-robust test that the group's replicas share one rate."""
    use_requests = all(r["requests"] for r in group)
    sums = [sum(r["requests"].values(), ClusterSums()) if use_requests else r["blocks"] for r in group]
    test = ratio_homogeneity(sums)
    return (test.statistic, test.p_value) if test is not None else None


def run(store, request: DiagnosticRequest) -> list[Finding]:
    scope, baseline, candidate = request.scope, request.baseline, request.candidate
    findings, comparisons = [], []
    if baseline is not None and candidate is not None:
        base, cand = pool(acceptance(store, baseline)), pool(acceptance(store, candidate))
        subject = f"{candidate.label()} vs {baseline.label()}"
        if min(base["proposed"], cand["proposed"]) < MIN_PROPOSED:
            return [insufficient(KIND, subject, DIAGNOSTIC, candidate, f"draft tokens proposed: baseline "
                                 f"{base['proposed']}, candidate {cand['proposed']} (need {MIN_PROPOSED} each)")]
        comparisons.append(_comparison(subject, subject, candidate, base, cand, {}))
    else:
        by_group: dict[tuple, list[dict]] = {}
        for r in acceptance(store, scope):
            if r["proposed"] < MIN_PROPOSED:
                findings.append(insufficient(KIND, r["replica_id"], DIAGNOSTIC, scope,
                                             f"{r['proposed']} draft tokens proposed on {r['replica_id']} "
                                             f"(need {MIN_PROPOSED})", proposed=r["proposed"]))
            else:
                by_group.setdefault((r["model_name"], r["speculative_mode"]), []).append(r)
        for (model, mode), group in by_group.items():
            table = [{k: r[k] for k in ("replica_id", "engine_version", "proposed", "accepted", "rate", "per_pos_rate")}
                     for r in group]
            context = {"model_name": model, "speculative_mode": mode, "replicas": table}
            heterogeneity = _heterogeneity(group)
            for r in group:  # each replica against the rest of its model and mode
                rest = [x for x in group if x["replica_id"] != r["replica_id"]]
                if rest:
                    by_workload = [{"workload": w, "requests": s.n, "proposed": s.p, "accepted": s.a, "rate": s.rate}
                                   for w, s in sorted(r["requests"].items())]
                    comparisons.append(_comparison(r["replica_id"], f"{r['replica_id']} vs its {len(rest)} peer(s)",
                                                   scope, pool(rest), pool([r]),
                                                   {**context, "chi_square": heterogeneity,
                                                    "by_workload": by_workload}))
            versions = sorted({r["engine_version"] for r in group})
            for old, new in zip(versions, versions[1:]):  # and version against version
                subject = f"version={new} vs version={old}"
                comparisons.append(_comparison(subject, subject, scope,
                                               pool([r for r in group if r["engine_version"] == old]),
                                               pool([r for r in group if r["engine_version"] == new]), context))
    decide(comparisons)
    for r in comparisons:
        if r["overall"] is None:
            findings.append(_insufficient(r))
        elif r["overall_drop"]:
            findings.append(_finding(r))
    return findings
