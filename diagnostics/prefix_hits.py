"""Prefix-cache hits: a replica that reuses far less of its prompts than its peers do for the same
workload (`prefix_hit_gap`): prefix caching off, a smaller cache, or a router that stopped being sticky.

Like for like: what a prefix cache can reuse depends on what the clients send (a tenant with its own
system prompt, longer prompts, another few-shot header), so requests are compared within prompt
families (diagnostics.prompt_family: the shared prompt head and the prompt-length bucket) that both
sides served, never across them; and within the same offered load at arrival (the tokens the load
balancer sent the replica in the seconds before: diagnostics.request_strata), since a replica sent
several times the load evicts its cached prefixes sooner, which is its traffic, not a fault. Per
(model, workload), each request's hit rate
(telemetry.contract.derived.PREFIX_HIT_RATE_SQL: cached_tokens / prompt_tokens) on one replica against
its peers' pooled requests of the same families: van Elteren's stratified Mann-Whitney
(evals.stats.stratified), Holm over replicas x workloads (per model); the gap (peers' mean rate - the
replica's, within strata, weighted by the replica's requests) with a percentile bootstrap interval
resampling requests within strata (offered load counts the client requests in the scope only). It
fires when the adjusted p < ALPHA and the interval's lower bound is at least MIN_GAP. The evidence
adds the steps' view
(prefix_hit_tokens / prefix_query_tokens per replica) and the config keys about prefix caching on
which the replica differs (enable_prefix_caching ...).
"""

from __future__ import annotations

import numpy as np

from diagnostics import config_keys, prompt_family, request_strata
from diagnostics.findings import Finding
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope, replicas_in, requests_in
from evals.stats import holm, stratified, van_elteren
from evals.stats.stratified import standardized_difference
from telemetry.contract import derived
from telemetry.contract.derived import replica_filter_sql, window_sql
from telemetry.contract.probes import ACTIVE_WORKLOADS_SQL

KIND = "prefix_hit_gap"
ALPHA = 0.01
MIN_REQUESTS = 20
MIN_GAP = 0.10  # hit-rate points
SAMPLE = 2000

# a stratum: the prompt family and the offered load at arrival (diagnostics.request_strata's: the
# tokens that arrived at the replica in the OFFERED_WINDOW seconds before, 2x buckets)
_SQL = """
SELECT model_name, workload, concat(family, '|offered ', toString({offered})) AS stratum, replica_id, count() AS n,
       groupArraySample({sample}, 13)(rate) AS rates
FROM (SELECT *, sum(work) OVER (PARTITION BY replica_id ORDER BY at
                                RANGE BETWEEN {window} PRECEDING AND CURRENT ROW) - work AS arrived
      FROM {families})
GROUP BY model_name, workload, stratum, replica_id
ORDER BY model_name, workload, stratum, replica_id
"""
_RATE = (derived.PREFIX_HIT_RATE_SQL.replace("cached_tokens", "t.cached_tokens")
         .replace("prompt_tokens", "t.prompt_tokens"))
_COLUMNS = (f"t.replica_id AS replica_id, {prompt_family.COLUMNS}, t.finish_reason AS finish_reason, "
            f"t.cached_tokens AS cached_tokens, {_RATE} AS rate, toUnixTimestamp64Micro(t.arrival_time) AS at, "
            f"toUInt64(t.prompt_tokens + t.output_tokens) AS work")
_CLIENT = """
(SELECT * FROM {source}
 WHERE finish_reason NOT IN ('abort', 'error') AND isFinite(rate) AND workload NOT IN {active})  -- client traffic
"""

_STEPS = f"""
SELECT replica_id, sum(prefix_hit_tokens) AS hit, sum(prefix_query_tokens) AS query FROM steps
WHERE {window_sql('start_time')} AND {replica_filter_sql()} GROUP BY replica_id
"""


def _sql(scope: Scope) -> str:
    client = _CLIENT.replace("{active}", ACTIVE_WORKLOADS_SQL).replace("{source}", requests_in(_COLUMNS, scope=scope))
    return (_SQL.replace("{families}", prompt_family.with_family(client)).replace("{sample}", str(SAMPLE))
            .replace("{offered}", request_strata.LOG2_BUCKET.format(x="arrived"))
            .replace("{window}", str(int(request_strata.OFFERED_WINDOW * 1e6))))


def _gap(mine: dict, peers: dict, keys: list, seed: int = 0) -> tuple[float, tuple[float, float], float, float]:
    """Peers' rate - the replica's within the families `keys`, weighted by its requests: the gap, its
    bootstrap interval (requests resampled within families), the replica's and the peers' rates."""
    pairs = [(mine[k], peers[k]) for k in keys]
    point, (low, high), level = standardized_difference(pairs, np.random.default_rng(seed))
    return -point, (-high, -low), level + point, level


def run(store, request: DiagnosticRequest, identity: dict | None = None) -> list[Finding]:
    """`identity` ({replica id: its replicas row}): the caller's, where it has read them already."""
    scope = request.scope
    identity = {r["replica_id"]: r for r in replicas_in(store, scope)} if identity is None else identity
    rows = store.query_arrow(_sql(scope), scope.parameters()).to_pylist()
    # (model, workload) -> replica -> family -> the sampled rates of its requests
    groups: dict[tuple[str, str], dict[str, dict[str, np.ndarray]]] = {}
    for r in rows:
        by_family = groups.setdefault((r["model_name"], r["workload"]), {}).setdefault(r["replica_id"], {})
        by_family[r["stratum"]] = np.asarray(r["rates"], dtype=float)
    findings, steps = [], None
    for model in sorted({m for m, _ in groups}):
        tests = []
        for (m, workload), group in sorted(groups.items()):
            if m != model or len(group) < 2:
                continue
            for rid, mine in sorted(group.items()):
                theirs = {f: np.concatenate([g[f] for o, g in group.items() if o != rid and f in g])
                          for f in {f for o, g in group.items() if o != rid for f in g}}
                keys = stratified.comparable(mine, theirs)
                if min(sum(len(mine[k]) for k in keys), sum(len(theirs[k]) for k in keys), MIN_REQUESTS) \
                        < MIN_REQUESTS:
                    continue
                test = van_elteren([(mine[k], theirs[k]) for k in keys])
                tests.append((rid, workload, mine, theirs, keys, test))
        if not tests:
            continue
        adjusted = holm([test for *_, test in tests])
        gaps: dict[str, dict] = {}
        for (rid, workload, mine, theirs, keys, test), q in zip(tests, adjusted):
            if q >= ALPHA:
                continue
            gap, ci, rate, peers_rate = _gap(mine, theirs, keys)
            if gap >= MIN_GAP and ci[0] >= MIN_GAP:
                gaps.setdefault(rid, {})[workload] = {
                    "hit_rate": rate, "peers_hit_rate": peers_rate, "gap": gap, "gap_ci": ci,
                    "requests": sum(len(mine[k]) for k in keys), "peer_requests": sum(len(theirs[k]) for k in keys),
                    "requests_left_out": sum(len(v) for k, v in mine.items() if k not in keys),
                    "prompt_families": len(keys), "van_elteren_p": test.p_value, "holm_p": q}
        if gaps and steps is None:
            steps = {r["replica_id"]: r for r in store.query_arrow(_STEPS, scope.parameters()).to_pylist()}
        replicas = sorted({t[0] for t in tests})
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
               f"{w['gap_ci'][0]:.0%}-{w['gap_ci'][1]:.0%}, van Elteren p={w['van_elteren_p']:.1e}, "
               f"in the {w['prompt_families']} prompt families both served)" + why)
    evidence = {"model_name": model, "replica": rid, "peers": [p["replica_id"] for p in peers],
                "workloads": by_workload, "config_differences": diffs, "step_hit_rates": step_rates,
                "unit": "request (cached_tokens / prompt_tokens)",
                "correction": f"Holm over {family} tests (replicas x workloads)",
                "method": "per-request hit rate vs the peers' pooled requests of the same workload, within the "
                          "prompt families (shared prompt head, prompt-length bucket) both served: van Elteren "
                          "stratified Mann-Whitney; gap in mean rate within families, weighted by the replica's "
                          "requests, with a bootstrap interval resampling requests within families"}
    return Finding(KIND, "warning", rid, summary, "replicas", scope, evidence)
