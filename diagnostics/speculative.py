"""Speculative decoding: acceptance rate per draft position by replica and version, and its drops.

Steps carry, per step, the draft tokens proposed and accepted and the accepted count per draft
position. The number of drafts is not recorded, so a position's rate is accepted / (proposed / k)
with k the replica's num_speculative_tokens: exact when every draft has k tokens (draft-model
mode), a lower bound for n-gram drafts that can be shorter. The overall rate (accepted /
proposed) is exact. A group (a replica against the others of its model and mode, or a candidate
scope against a baseline) whose rate is lower by at least 10 points on a two-proportion z test
(Bonferroni over positions) is a drop; a chi-square test says whether replicas differ at all.
"""

from __future__ import annotations

import json

from diagnostics import hypothesis_tests
from diagnostics.findings import Finding, insufficient
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope, replicas_in, requests_in, steps_in

DIAGNOSTIC = "speculative"
KIND = "spec_acceptance_drop"
MIN_PROPOSED = 100
MIN_DROP = 0.10  # absolute drop in acceptance rate worth a finding
CRITICAL_DROP = 0.25
ALPHA = 0.01

_STEPS = """
SELECT replica_id, model_name, engine_version, speculative_mode, count() AS steps,
       sum(spec_proposed) AS proposed, sum(spec_accepted) AS accepted, sumForEach(per_pos) AS per_pos
FROM {source}
WHERE spec_proposed > 0
GROUP BY replica_id, model_name, engine_version, speculative_mode
ORDER BY model_name, replica_id
"""

_REQUESTS = """
SELECT replica_id, workload, count() AS requests, sum(spec_proposed) AS proposed, sum(spec_accepted) AS accepted
FROM {source}
WHERE spec_proposed > 0
GROUP BY replica_id, workload
"""


def _k(identity: dict) -> int:
    try:
        return int(json.loads(identity.get("config_json") or "{}").get("num_speculative_tokens") or 0)
    except (json.JSONDecodeError, TypeError, ValueError):
        return 0


def acceptance(store, scope: Scope) -> list[dict]:
    """Per replica (and version): proposed, accepted, per-position accepted and estimated drafts."""
    source = steps_in("t.replica_id AS replica_id, t.spec_proposed AS spec_proposed, "
                      "t.spec_accepted AS spec_accepted, t.spec_accepted_per_pos AS per_pos")
    rows = store.query_arrow(_STEPS.replace("{source}", source), scope.parameters()).to_pylist()
    identity = {r["replica_id"]: r for r in replicas_in(store, scope)}
    for r in rows:
        k = _k(identity.get(r["replica_id"], {})) or max(1, len(r["per_pos"]))
        r["k"] = k
        r["drafts"] = r["proposed"] / k
        r["rate"] = r["accepted"] / r["proposed"] if r["proposed"] else None
        r["per_pos_rate"] = [a / r["drafts"] for a in r["per_pos"]] if r["drafts"] else []
    return rows


def _pool(rows: list[dict]) -> dict:
    per_pos: list[float] = []
    for r in rows:
        per_pos += [0] * (len(r["per_pos"]) - len(per_pos))
        for i, a in enumerate(r["per_pos"]):
            per_pos[i] += a
    proposed = sum(r["proposed"] for r in rows)
    drafts = sum(r["drafts"] for r in rows)
    return {"proposed": proposed, "accepted": sum(r["accepted"] for r in rows), "drafts": drafts, "per_pos": per_pos,
            "replicas": sorted({r["replica_id"] for r in rows})}


def compare_groups(base: dict, cand: dict) -> dict | None:
    """Overall and per-position tests of candidate against baseline; None when there is no drop."""
    overall = hypothesis_tests.two_proportions(base["accepted"], base["proposed"], cand["accepted"], cand["proposed"])
    positions = []
    for i in range(min(len(base["per_pos"]), len(cand["per_pos"]))):
        t = hypothesis_tests.two_proportions(int(base["per_pos"][i]), max(1, round(base["drafts"])),
                                  int(cand["per_pos"][i]), max(1, round(cand["drafts"])))
        positions.append({"position": i, **t.to_dict()})
    tests = 1 + len(positions)
    drops = [p for p in positions if -p["difference"] >= MIN_DROP and p["p_value"] * tests < ALPHA]
    overall_drop = overall is not None and -overall.difference >= MIN_DROP and overall.p_value * tests < ALPHA
    if not drops and not overall_drop:
        return None
    return {"overall": overall.to_dict() if overall else None, "positions": positions, "dropped_positions": drops,
            "overall_drop": overall_drop, "bonferroni_tests": tests}


def _finding(subject: str, scope: Scope, base: dict, cand: dict, result: dict, what: str, extra: dict) -> Finding:
    worst = max([-p["difference"] for p in result["dropped_positions"]]
                + ([-result["overall"]["difference"]] if result["overall_drop"] else []))
    severity = "critical" if worst >= CRITICAL_DROP else "warning"
    o = result["overall"]
    pos = ", ".join(f"position {p['position']}: {p['rate_a']:.0%} -> {p['rate_b']:.0%}"
                    for p in result["dropped_positions"][:3])
    summary = (f"{what}: speculative acceptance {o['rate_a']:.0%} -> {o['rate_b']:.0%} "
               f"(z test p={o['p_value']:.1e})" + (f"; {pos}" if pos else ""))
    evidence = {"baseline": base, "candidate": cand, **result, **extra,
                "method": "two-proportion z tests (overall accepted/proposed; per position accepted/drafts with "
                          "drafts = proposed / k), Bonferroni over positions"}
    return Finding(KIND, severity, subject, summary, DIAGNOSTIC, scope, evidence)


def run(store, request: DiagnosticRequest) -> list[Finding]:
    scope, baseline, candidate = request.scope, request.baseline, request.candidate
    if baseline is not None and candidate is not None:
        base, cand = _pool(acceptance(store, baseline)), _pool(acceptance(store, candidate))
        subject = f"{candidate.label()} vs {baseline.label()}"
        if min(base["proposed"], cand["proposed"]) < MIN_PROPOSED:
            return [insufficient(KIND, subject, DIAGNOSTIC, candidate, f"draft tokens proposed: baseline "
                                 f"{base['proposed']}, candidate {cand['proposed']} (need {MIN_PROPOSED} each)")]
        result = compare_groups(base, cand)
        return [_finding(subject, candidate, base, cand, result, subject, {})] if result else []
    rows = acceptance(store, scope)
    findings = []
    by_group: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["proposed"] < MIN_PROPOSED:
            findings.append(insufficient(KIND, r["replica_id"], DIAGNOSTIC, scope,
                                         f"{r['proposed']} draft tokens proposed on {r['replica_id']} "
                                         f"(need {MIN_PROPOSED})", proposed=r["proposed"]))
        else:
            by_group.setdefault((r["model_name"], r["speculative_mode"]), []).append(r)
    workloads = _by_workload(store, scope)
    for (model, mode), group in by_group.items():
        heterogeneity = hypothesis_tests.chi_square_homogeneity([r["accepted"] for r in group], [r["proposed"] for r in group])
        table = [{k: r[k] for k in ("replica_id", "engine_version", "proposed", "accepted", "rate", "per_pos_rate")}
                 for r in group]
        for r in group:  # each replica against the rest of its model and mode
            rest = [x for x in group if x["replica_id"] != r["replica_id"]]
            if not rest:
                continue
            result = compare_groups(_pool(rest), _pool([r]))
            if result:
                extra = {"model_name": model, "speculative_mode": mode, "replicas": table,
                         "chi_square": heterogeneity, "by_workload": workloads.get(r["replica_id"], [])}
                findings.append(_finding(r["replica_id"], scope, _pool(rest), _pool([r]), result,
                                         f"{r['replica_id']} vs its {len(rest)} peer(s)", extra))
        versions = sorted({r["engine_version"] for r in group})
        for old, new in zip(versions, versions[1:]):  # and version against version
            base = _pool([r for r in group if r["engine_version"] == old])
            cand = _pool([r for r in group if r["engine_version"] == new])
            result = compare_groups(base, cand)
            if result:
                subject = f"version={new} vs version={old}"
                findings.append(_finding(subject, scope, base, cand, result, subject,
                                         {"model_name": model, "speculative_mode": mode, "replicas": table}))
    return findings


def _by_workload(store, scope: Scope) -> dict[str, list[dict]]:
    source = requests_in("t.replica_id AS replica_id, t.workload AS workload, t.spec_proposed AS spec_proposed, "
                         "t.spec_accepted AS spec_accepted", scope=scope)
    out: dict[str, list[dict]] = {}
    for r in store.query_arrow(_REQUESTS.replace("{source}", source), scope.parameters()).to_pylist():
        r["rate"] = r["accepted"] / r["proposed"] if r["proposed"] else None
        out.setdefault(r["replica_id"], []).append(r)
    return out
