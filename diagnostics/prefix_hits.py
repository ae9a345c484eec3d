"""Prefix-cache hits: a replica that reuses far less of its prompts than its peers do for the same
workload (`prefix_hit_gap`): prefix caching off, a smaller cache, or a router that stopped being sticky.

Per (model, workload), each request's hit rate (telemetry.contract.derived.PREFIX_HIT_RATE_SQL:
cached_tokens / prompt_tokens) on one replica against its peers' pooled requests: Mann-Whitney U +
Kolmogorov-Smirnov (the larger p), Holm over replicas x workloads (per model); the gap (peers' mean
rate - the replica's) with a percentile bootstrap interval over requests. It fires when the adjusted
p < ALPHA and the interval's lower bound is at least MIN_GAP. The evidence adds the steps' view
(prefix_hit_tokens / prefix_query_tokens per replica) and the config keys about prefix caching on
which the replica differs (enable_prefix_caching ...).
"""

from __future__ import annotations

import numpy as np

from diagnostics import config_keys, hypothesis_tests
from diagnostics.findings import Finding
from diagnostics.scope import Scope, requests_in
from telemetry.contract import derived
from telemetry.contract.derived import replica_filter_sql, window_sql
from telemetry.contract.probes import ACTIVE_WORKLOADS_SQL

KIND = "prefix_hit_gap"
ALPHA = 0.01
MIN_REQUESTS = 20
MIN_GAP = 0.10  # hit-rate points
SAMPLE = 2000
BOOTSTRAP = 1000

_SQL = """
SELECT model_name, workload, replica_id, count() AS n, sum(cached_tokens) AS cached, sum(prompt_tokens) AS prompt,
       groupArraySample({sample}, 13)(rate) AS rates
FROM {source}
WHERE finish_reason NOT IN ('abort', 'error') AND isFinite(rate) AND workload NOT IN {active}  -- client traffic
GROUP BY model_name, workload, replica_id
ORDER BY model_name, workload, replica_id
"""

_STEPS = f"""
SELECT replica_id, sum(prefix_hit_tokens) AS hit, sum(prefix_query_tokens) AS query FROM steps
WHERE {window_sql('start_time')} AND {replica_filter_sql()} GROUP BY replica_id
"""


def _sql(scope: Scope) -> str:
    rate = (derived.PREFIX_HIT_RATE_SQL.replace("cached_tokens", "t.cached_tokens")
            .replace("prompt_tokens", "t.prompt_tokens"))
    cols = (f"t.replica_id AS replica_id, t.model_name AS model_name, t.workload AS workload, "
            f"t.finish_reason AS finish_reason, t.cached_tokens AS cached_tokens, "
            f"t.prompt_tokens AS prompt_tokens, {rate} AS rate")
    return _SQL.replace("{active}", ACTIVE_WORKLOADS_SQL).replace("{source}", requests_in(cols, scope=scope)).replace("{sample}", str(SAMPLE))


def _gap_ci(peers: np.ndarray, mine: np.ndarray, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    p = peers[rng.integers(0, len(peers), (BOOTSTRAP, len(peers)))].mean(axis=1)
    m = mine[rng.integers(0, len(mine), (BOOTSTRAP, len(mine)))].mean(axis=1)
    gaps = p - m
    return float(np.quantile(gaps, 0.025)), float(np.quantile(gaps, 0.975))


def run(store, scope: Scope, identity: dict) -> list[Finding]:
    rows = store.query_arrow(_sql(scope), scope.parameters()).to_pylist()
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        r["rates"] = np.asarray(r["rates"], dtype=float)
        groups.setdefault((r["model_name"], r["workload"]), []).append(r)
    findings, steps = [], None
    for model in sorted({m for m, _ in groups}):
        tests = []
        for (m, workload), group in sorted(groups.items()):
            if m != model or len(group) < 2:
                continue
            for me in group:
                theirs = np.concatenate([p["rates"] for p in group if p is not me])
                c = hypothesis_tests.compare_samples(theirs, me["rates"], bootstrap=False, min_samples=MIN_REQUESTS)
                if c is not None:
                    tests.append((me, workload, theirs, c))
        if not tests:
            continue
        adjusted = hypothesis_tests.holm([t[3].p_value for t in tests])
        gaps: dict[str, dict] = {}
        for (me, workload, theirs, c), q in zip(tests, adjusted):
            gap = float(theirs.mean() - me["rates"].mean())
            if q >= ALPHA or gap < MIN_GAP:
                continue
            ci = _gap_ci(theirs, me["rates"])
            if ci[0] >= MIN_GAP:
                gaps.setdefault(me["replica_id"], {})[workload] = {
                    "hit_rate": float(me["rates"].mean()), "peers_hit_rate": float(theirs.mean()), "gap": gap,
                    "gap_ci": ci, "requests": int(me["n"]), "peer_requests": len(theirs),
                    "mwu_p": c.mwu_p, "ks_p": c.ks_p, "holm_p": q, "cliffs_delta": c.cliffs_delta}
        if gaps and steps is None:
            steps = {r["replica_id"]: r for r in store.query_arrow(_STEPS, scope.parameters()).to_pylist()}
        replicas = sorted({t[0]["replica_id"] for t in tests})
        for rid, by_workload in gaps.items():
            findings.append(_finding(model, rid, by_workload, replicas, identity, steps or {}, scope, len(tests)))
    return findings


def _finding(model, rid, by_workload, replicas, identity, steps, scope, family) -> Finding:
    peers = [identity.get(p, {"replica_id": p}) for p in replicas if p != rid]
    diffs = config_keys.differences(identity.get(rid, {}), peers, lambda k: "prefix_caching" in k)
    workload, w = max(by_workload.items(), key=lambda kv: kv[1]["gap"])
    step_rates = {r: (s["hit"] / s["query"] if s["query"] else None) for r, s in steps.items() if r in replicas}
    why = ("; config differs: " + config_keys.describe(diffs)) if diffs else \
        "; no prefix-caching config difference recorded (check cache size, evictions and request routing)"
    summary = (f"{rid} ({model}, workload {workload}) hits its prefix cache on {w['hit_rate']:.0%} of prompt tokens "
               f"per request vs {w['peers_hit_rate']:.0%} on its peers (gap {w['gap']:.0%}, 95% CI "
               f"{w['gap_ci'][0]:.0%}-{w['gap_ci'][1]:.0%}, MWU p={w['mwu_p']:.1e})" + why)
    evidence = {"model_name": model, "replica": rid, "peers": [p["replica_id"] for p in peers],
                "workloads": by_workload, "config_differences": diffs, "step_hit_rates": step_rates,
                "unit": "request (cached_tokens / prompt_tokens)",
                "correction": f"Holm over {family} tests (replicas x workloads)",
                "method": "per-request hit rate vs the peers' pooled requests of the same workload (MWU + KS), "
                          "gap in mean rate with a bootstrap interval"}
    return Finding(KIND, "warning", rid, summary, "replicas", scope, evidence)
