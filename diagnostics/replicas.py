"""Replicas: which replica of a model is slower than its peers, and what about it is different.

Each request's TTFT, mean inter-token latency and end-to-end latency is divided by the median of its
stratum (model, workload, prompt-length bucket) over the whole scope, so a replica that happened
to get longer prompts is not called slow. Per replica, the median of those relative latencies;
among the replicas of one model, a robust outlier (median / MAD z-score, with the MAD floored at
5% of the median) that is also at least 25% slower than its peers and significantly so against
their pooled requests (Mann-Whitney U + Kolmogorov-Smirnov, Bonferroni over replicas) is a
lagging replica. Its identity is then compared with its peers' (NUMA mismatch, CPU count, CPUs
shared, config hash, version, tokenizer and chat-template hashes, quantization ...): the
differences are the first explanation to check.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from diagnostics import hypothesis_tests
from diagnostics.findings import Finding, insufficient
from diagnostics.regression import METRICS, PROMPT_BUCKET
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope, replicas_in, requests_in
from telemetry.contract import derived

DIAGNOSTIC = "replicas"
KIND = "lagging_replica"
LATENCIES = ("ttft", "itl", "e2e")
MIN_REQUESTS = 20
MIN_RATIO = 1.25  # slower than the peers' median by at least this much
CRITICAL_RATIO = 2.0
MIN_Z = 3.5
ALPHA = 0.01
# identity fields compared with the peers, in the order a person would check them
IDENTITY = ("numa_mismatch", "cpu_count", "config_hash", "engine_version", "tokenizer_hash", "chat_template_hash",
            "quantization", "speculative_mode", "attention_backend", "dtype", "device", "weights_hash", "host",
            "gpu_numa_node")


def _source(scope: Scope) -> str:
    cols = ", ".join(f"{METRICS[m][1]} AS {m}" for m in LATENCIES)
    return requests_in(f"t.replica_id AS replica_id, t.model_name AS model_name, t.workload AS workload, "
                       f"{PROMPT_BUCKET} AS bucket, t.finish_reason AS finish_reason, "
                       f"t.first_token_time AS first_token_time, {cols}", scope=scope)


_FILTER = "finish_reason NOT IN ('abort', 'error') AND first_token_time > toDateTime64(0, 6, 'UTC')"

_STRATA = """
SELECT concat(model_name, '|', workload, '|', bucket) AS stratum,
       medianIf(ttft, isFinite(ttft)) AS ttft, medianIf(itl, isFinite(itl)) AS itl,
       medianIf(e2e, isFinite(e2e)) AS e2e
FROM {source} WHERE {filter}
GROUP BY stratum
"""

# itl is each request's mean ITL (diagnostics.regression.METRICS): requests are what is compared
_PER_REPLICA = """
SELECT model_name, replica_id, count() AS n,
       medianIf(rel_ttft, isFinite(rel_ttft)) AS ttft_rel, medianIf(rel_itl, isFinite(rel_itl)) AS itl_rel,
       medianIf(rel_e2e, isFinite(rel_e2e)) AS e2e_rel,
       {quantiles},
       groupArraySample(1000, 1)((rel_ttft, rel_itl, rel_e2e)) AS sample
FROM (
    SELECT model_name, replica_id, ttft, itl, e2e,
           indexOf({keys:Array(String)}, concat(model_name, '|', workload, '|', bucket)) AS i,
           ttft / arrayElement({ttft_meds:Array(Float64)}, i) AS rel_ttft,
           itl / arrayElement({itl_meds:Array(Float64)}, i) AS rel_itl,
           e2e / arrayElement({e2e_meds:Array(Float64)}, i) AS rel_e2e
    FROM {source} WHERE {filter}
)
WHERE i > 0
GROUP BY model_name, replica_id
ORDER BY model_name, replica_id
"""


def _finite(x) -> np.ndarray:
    a = np.asarray(x, dtype=float)
    return a[np.isfinite(a)]


def per_replica(store, scope: Scope) -> list[dict]:
    """One row per replica: request count, relative latency medians, raw quantiles, a sample."""
    source = _source(scope)
    strata = store.query_arrow(_STRATA.replace("{source}", source).replace("{filter}", _FILTER),
                               scope.parameters()).to_pylist()
    if not strata:
        return []
    meds = {m: [float(s[m]) if s[m] and np.isfinite(s[m]) and s[m] > 0 else np.nan for s in strata]
            for m in LATENCIES}
    params = {**scope.parameters(), "keys": [s["stratum"] for s in strata],
              **{f"{m}_meds": meds[m] for m in LATENCIES}}
    quantiles = ",\n       ".join(f"{derived.quantiles_sql(m, f'isFinite({m})')} AS {m}_q" for m in LATENCIES)
    rows = store.query_arrow(_PER_REPLICA.replace("{quantiles}", quantiles).replace("{source}", source)
                             .replace("{filter}", _FILTER),
                             params).to_pylist()
    for r in rows:
        sample = np.array([list(t.values()) if isinstance(t, dict) else list(t) for t in r.pop("sample")],
                          dtype=float).reshape(-1, len(LATENCIES))
        r["samples"] = {m: _finite(sample[:, i]) for i, m in enumerate(LATENCIES)}
    return rows


def identity_differences(subject: dict, peers: list[dict]) -> list[dict]:
    """Identity fields on which `subject` differs from the most common value among `peers`."""
    out = []
    for f in IDENTITY:
        counts = Counter(str(p.get(f)) for p in peers)
        if not counts:
            break
        common, _ = counts.most_common(1)[0]
        if str(subject.get(f)) != common:
            out.append({"field": f, "replica": subject.get(f), "peers": dict(counts)})
    mine = set(subject.get("cpu_affinity") or [])
    shared = sorted(p["replica_id"] for p in peers if mine & set(p.get("cpu_affinity") or []))
    if mine and shared:
        out.append({"field": "cpus_shared_with", "replica": sorted(mine), "peers": shared})
    return out


def _explain(diffs: list[dict]) -> str:
    if not diffs:
        return "no identity difference recorded (look at the host: neighbours, load, throttling)"
    parts = []
    for d in diffs[:4]:
        if d["field"] == "cpus_shared_with":
            parts.append(f"shares CPUs {d['replica']} with {', '.join(d['peers'])}")
        else:
            peers = ", ".join(f"{v}" for v in d["peers"])
            parts.append(f"{d['field']} {d['replica']} (peers: {peers})")
    return "differs in " + "; ".join(parts)


def run(store, request: DiagnosticRequest) -> list[Finding]:
    scope = request.scope
    rows = per_replica(store, scope)
    identity = {r["replica_id"]: r for r in replicas_in(store, scope)}
    findings: list[Finding] = []
    by_model: dict[str, list[dict]] = {}
    for r in rows:
        if r["n"] < MIN_REQUESTS:
            findings.append(insufficient(KIND, r["replica_id"], DIAGNOSTIC, scope,
                                         f"{r['n']} requests on {r['replica_id']} (need {MIN_REQUESTS})",
                                         requests=r["n"], model_name=r["model_name"]))
        else:
            by_model.setdefault(r["model_name"], []).append(r)
    for model, group in by_model.items():
        if len(group) < 2:
            continue
        findings += _outliers(model, group, identity, scope)
    return findings


def _outliers(model: str, group: list[dict], identity: dict, scope: Scope) -> list[Finding]:
    findings = []
    flagged: dict[str, dict] = {}
    for metric in LATENCIES:
        values = {r["replica_id"]: float(r[f"{metric}_rel"]) for r in group
                  if r[f"{metric}_rel"] is not None and np.isfinite(r[f"{metric}_rel"])}
        if len(values) < 2:
            continue
        z, _, mad = hypothesis_tests.robust_z(values)
        for r in group:
            rid = r["replica_id"]
            if rid not in values:
                continue
            peers = [p for p in group if p["replica_id"] != rid and p["replica_id"] in values]
            peer_median = float(np.median([values[p["replica_id"]] for p in peers]))
            ratio = values[rid] / peer_median if peer_median > 0 else np.inf
            # with two replicas the z-score cannot tell which one is odd: ratio and tests decide
            if ratio < MIN_RATIO or (len(values) > 2 and z[rid] < MIN_Z):
                continue
            rest = np.concatenate([p["samples"][metric] for p in peers])
            c = hypothesis_tests.compare_samples(rest, r["samples"][metric], bootstrap=False)
            if c is None or c.p_value * len(values) >= ALPHA or c.cliffs_delta < hypothesis_tests.DELTA_SMALL:
                continue
            c = hypothesis_tests.compare_samples(rest, r["samples"][metric], bootstrap=True)
            entry = flagged.setdefault(rid, {"metrics": {}})
            entry["metrics"][metric] = {
                "relative_median": values[rid], "peers_relative_median": peer_median, "ratio_to_peers": ratio,
                "robust_z": z[rid] if len(values) > 2 else None, "mad": mad,
                "quantiles_seconds": dict(zip(derived.QUANTILE_NAMES, r[f"{metric}_q"])),
                "peers_p50_seconds": {p["replica_id"]: p[f"{metric}_q"][0] for p in peers},
                "test_vs_peers": c.to_dict()}
    for rid, entry in flagged.items():
        worst_metric, worst = max(entry["metrics"].items(), key=lambda kv: kv[1]["ratio_to_peers"])
        me = identity.get(rid, {"replica_id": rid})
        peers = [identity.get(p["replica_id"], {"replica_id": p["replica_id"]}) for p in group
                 if p["replica_id"] != rid]
        diffs = identity_differences(me, peers)
        ratio = worst["ratio_to_peers"]
        severity = "critical" if ratio >= CRITICAL_RATIO else "warning"
        summary = (f"{rid} is {ratio:.2f}x slower than its {len(peers)} peer(s) of {model} on {worst_metric} "
                   f"(p50 {worst['quantiles_seconds']['p50'] * 1000:.1f} ms; "
                   f"MWU p={worst['test_vs_peers']['mwu_p']:.1e}); "
                   + _explain(diffs))
        evidence = {"model_name": model, "replica": rid, "peers": [p["replica_id"] for p in peers],
                    "metrics": entry["metrics"], "identity_differences": diffs,
                    "identity": {k: me.get(k) for k in
                                 (*IDENTITY, "cpu_affinity", "cpu_numa_nodes", "mem_policy_nodes")},
                    "requests": {r["replica_id"]: r["n"] for r in group},
                    "method": "latency relative to the (model, workload, prompt-length) stratum median; robust z "
                              "(median/MAD) among replicas, ratio to peers, MWU + KS against the peers' requests"}
        findings.append(Finding(KIND, severity, rid, summary, DIAGNOSTIC, scope, evidence))
    return findings
