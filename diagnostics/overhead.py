"""Host overhead: the share of step time spent outside the forward pass, per replica.

Every replica gets an info finding with its share and where the host time goes (schedule,
prepare, sample, postprocess, telemetry), plus the groups of its latest py-spy profile when one
is stored. On an accelerator the share is the time the device waits on the host: above 30% is a
warning, above 50% critical. On a CPU the forward pass is host work too, so the share alone
decides nothing there; what does, on any device, is a replica whose host time per step is an
outlier among its peers (stratified by step phase and batch size, robust z and Mann-Whitney U).
"""

from __future__ import annotations

import numpy as np

from diagnostics.findings import Finding
from diagnostics.regression import BATCH_BUCKET
from diagnostics.replicas import differs_in, identity_differences
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope, replicas_in, steps_in
from evals.stats import DELTA_SMALL, compare_samples, robust_z
from telemetry.contract import derived

DIAGNOSTIC = "overhead"
WARN_SHARE, CRITICAL_SHARE = 0.30, 0.50  # accelerators only
MIN_STEPS = 50
MIN_RATIO = 1.5
MIN_Z = 3.5
ALPHA = 0.01
PARTS = ("schedule", "prepare", "sample", "postprocess", "telemetry")


# the steps every query reads, each host part a column of its own
_SOURCE_COLUMNS = ("t.replica_id AS replica_id, t.phase AS phase, " + BATCH_BUCKET + " AS bucket, "
                   "t.duration_seconds AS duration, t.forward_seconds AS forward, "
                   + ", ".join(f"t.{p}_seconds AS {p}" for p in PARTS))
_PART_TOTALS = ", ".join(f"sum({p}) AS {p}_total" for p in PARTS)

_SHARES = """
SELECT replica_id, any(model_name) AS model_name, count() AS steps, sum(duration) AS total,
       sum(forward) AS forward_total,
       {parts},
       {host_q} AS host_q
FROM {source}
WHERE phase != 'idle'
GROUP BY replica_id
ORDER BY replica_id
"""

_STRATA = """
SELECT concat(model_name, '|', phase, '|', bucket) AS stratum, median(greatest(duration - forward, 0)) AS med
FROM {source} WHERE phase != 'idle' GROUP BY stratum
"""

_RELATIVE = """
SELECT replica_id, median(rel) AS rel_median, groupArraySample(1000, 1)(rel) AS sample
FROM (SELECT replica_id,
             greatest(duration - forward, 0) / arrayElement({meds:Array(Float64)},
                 indexOf({keys:Array(String)}, concat(model_name, '|', phase, '|', bucket))) AS rel
      FROM {source} WHERE phase != 'idle' AND has({keys:Array(String)}, concat(model_name, '|', phase, '|', bucket)))
WHERE isFinite(rel)
GROUP BY replica_id
"""

_PROFILE = """
SELECT replica_id, argMax(profile_id, start_time) AS profile_id FROM profiles
WHERE has({replicas:Array(String)}, replica_id) GROUP BY replica_id
"""

_PROFILE_GROUPS = """
SELECT profile_id, `group`, sum(samples) AS samples FROM profiles
WHERE has({ids:Array(String)}, profile_id) GROUP BY profile_id, `group`
"""


def _source() -> str:
    return steps_in(_SOURCE_COLUMNS)


def shares(store, scope: Scope) -> list[dict]:
    sql = (_SHARES.replace("{parts}", _PART_TOTALS)
           .replace("{host_q}", derived.quantiles_sql("greatest(duration - forward, 0)"))
           .replace("{source}", _source()))
    rows = store.query_arrow(sql, scope.parameters()).to_pylist()
    for r in rows:
        total = r["total"] or 0.0
        r["host_share"] = 1.0 - r["forward_total"] / total if total > 0 else None
        r["split"] = {p: (r[f"{p}_total"] / total if total > 0 else None) for p in PARTS}
    return rows


def measures_host_time(row: dict) -> bool:
    """Does the replica's engine split its steps into host and forward time? An engine that reports every
    step as all forward (vLLM's stat logger gives no split) has no host time to compare: a peer's host
    time over its zero would read as an infinite outlier."""
    return bool(row["total"]) and row["forward_total"] < row["total"]


def relative_host_time(store, scope: Scope) -> dict[str, dict]:
    source = _source()
    strata = [s for s in store.query_arrow(_STRATA.replace("{source}", source), scope.parameters()).to_pylist()
              if s["med"] and s["med"] > 0]
    if not strata:
        return {}
    params = {**scope.parameters(), "keys": [s["stratum"] for s in strata], "meds": [s["med"] for s in strata]}
    rows = store.query_arrow(_RELATIVE.replace("{source}", source), params).to_pylist()
    return {r["replica_id"]: {"rel_median": r["rel_median"], "sample": np.asarray(r["sample"], float)} for r in rows}


def latest_profiles(store, replica_ids: list[str]) -> dict[str, dict]:
    if not replica_ids:
        return {}
    latest = store.query_arrow(_PROFILE, {"replicas": replica_ids}).to_pylist()
    if not latest:
        return {}
    groups = store.query_arrow(_PROFILE_GROUPS, {"ids": [r["profile_id"] for r in latest]}).to_pylist()
    out = {}
    for r in latest:
        g = {x["group"]: x["samples"] for x in groups if x["profile_id"] == r["profile_id"]}
        total = sum(g.values()) or 1
        out[r["replica_id"]] = {"profile_id": r["profile_id"], "group_shares": {k: v / total for k, v in g.items()}}
    return out


def run(store, request: DiagnosticRequest) -> list[Finding]:
    scope = request.scope
    rows = shares(store, scope)
    identity = {r["replica_id"]: r for r in replicas_in(store, scope)}
    profiles = latest_profiles(store, [r["replica_id"] for r in rows])
    relative = relative_host_time(store, scope)
    findings = []
    for r in rows:
        rid = r["replica_id"]
        device = identity.get(rid, {}).get("device", "")
        share = r["host_share"]
        if r["steps"] < MIN_STEPS or share is None:
            severity, what = "info", f"{r['steps']} steps: too few to judge"
        elif not measures_host_time(r):
            severity, what = "info", "its engine reports no host / forward split (all step time as forward): not judged"
        elif device and not device.startswith("cpu") and share >= CRITICAL_SHARE:
            severity, what = "critical", f"the {device} waits on the host for {share:.0%} of each step"
        elif device and not device.startswith("cpu") and share >= WARN_SHARE:
            severity, what = "warning", f"the {device} waits on the host for {share:.0%} of each step"
        else:
            severity, what = "info", f"{share:.0%} of step time is outside the forward pass"
        split = ", ".join(f"{p} {v:.0%}" for p, v in r["split"].items() if v is not None)
        evidence = {"replica": rid, "model_name": r["model_name"], "device": device, "steps": r["steps"],
                    "host_share": share, "split_of_step_time": r["split"],
                    "host_seconds_per_step": dict(zip(derived.QUANTILE_NAMES, r["host_q"])),
                    "profile": profiles.get(rid)}
        findings.append(Finding("host_overhead", severity, rid, f"{rid}: {what} ({split})", DIAGNOSTIC, scope,
                                evidence))
    findings += _outliers(rows, relative, identity, profiles, scope)
    return findings


def _outliers(rows, relative, identity, profiles, scope) -> list[Finding]:
    findings = []
    by_model: dict[str, list[str]] = {}
    for r in rows:
        if r["steps"] >= MIN_STEPS and r["replica_id"] in relative and measures_host_time(r):
            by_model.setdefault(r["model_name"], []).append(r["replica_id"])
    for model, ids in by_model.items():
        if len(ids) < 2:
            continue
        values = {rid: relative[rid]["rel_median"] for rid in ids}
        z, _, _ = robust_z(values)
        for rid in ids:
            peers = [p for p in ids if p != rid]
            peer_median = float(np.median([values[p] for p in peers]))
            ratio = values[rid] / peer_median if peer_median > 0 else np.inf
            if ratio < MIN_RATIO or (len(ids) > 2 and z[rid] < MIN_Z):
                continue
            rest = np.concatenate([relative[p]["sample"] for p in peers])
            c = compare_samples(rest, relative[rid]["sample"], bootstrap=True)
            if c is None or c.p_value * len(ids) >= ALPHA or c.cliffs_delta < DELTA_SMALL:
                continue
            diffs = identity_differences(identity.get(rid, {"replica_id": rid}),
                                         [identity.get(p, {"replica_id": p}) for p in peers])
            differs = differs_in(diffs)
            summary = (f"{rid}: host time per step is {ratio:.2f}x its peers' in the same phase and batch size "
                       f"(MWU p={c.mwu_p:.1e})" + (f"; differs in {differs}" if differs else ""))
            evidence = {"replica": rid, "model_name": model, "peers": peers, "ratio_to_peers": ratio,
                        "robust_z": z[rid] if len(ids) > 2 else None, "test_vs_peers": c.to_dict(),
                        "identity_differences": diffs, "profile": profiles.get(rid),
                        "method": "host seconds per step relative to the (model, phase, batch size) stratum median"}
            findings.append(Finding("host_overhead_outlier", "critical" if ratio >= 3 else "warning", rid, summary,
                                    DIAGNOSTIC, scope, evidence))
    return findings
