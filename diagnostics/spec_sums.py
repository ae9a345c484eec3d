"""Speculative acceptance as cluster sums: per replica start, the sufficient sums of its clusters.

Two units, both aggregated in ClickHouse (Python sees one row per replica, or per replica and
workload), never the draft token:
- the request (requests.spec_proposed / spec_accepted), per workload: the unit of the overall rate,
  stratified by workload;
- the time block (BLOCK_SECONDS of one replica's steps): the unit of the per-position rates, which
  only steps carry (steps carry no request id), and of the overall rate where requests carry no
  speculative counts (e.g. an engine that reports them per step only).
A position's rate is accepted / (proposed / k), k the replica's num_speculative_tokens: exact when
every draft has k tokens (draft-model mode), a lower bound for n-gram drafts that can be shorter.
"""

from __future__ import annotations

import json

from diagnostics.scope import Scope, replicas_in, requests_in, steps_in
from evals.stats import ClusterSums

BLOCK_SECONDS = 10

_IDENTITY = "replica_id, model_name, engine_version, speculative_mode"
_STEP_COLUMNS = ("t.replica_id AS replica_id, t.start_time AS start_time, t.spec_proposed AS spec_proposed, "
                 "t.spec_accepted AS spec_accepted, t.spec_accepted_per_pos AS per_pos")
_REQUEST_COLUMNS = ("t.replica_id AS replica_id, t.model_name AS model_name, t.workload AS workload, "
                    "t.spec_proposed AS spec_proposed, t.spec_accepted AS spec_accepted")

# per time block, then per replica: the blocks' sums of a, p, a^2, a p, p^2 (overall and per position)
_BLOCKS = f"""
SELECT {_IDENTITY}, count() AS blocks, sum(block_steps) AS steps,
       sum(ba) AS a, sum(bp) AS p, sum(ba * ba) AS aa, sum(ba * bp) AS ap, sum(bp * bp) AS pp,
       sumForEach(bpos) AS pos_a, sumForEach(arrayMap(x -> x * x, bpos)) AS pos_aa,
       sumForEach(arrayMap(x -> x * bp, bpos)) AS pos_ap
FROM (
    SELECT {_IDENTITY}, intDiv(toUnixTimestamp64Milli(start_time), {{block_ms:Int64}}) AS block,
           count() AS block_steps, toFloat64(sum(spec_accepted)) AS ba, toFloat64(sum(spec_proposed)) AS bp,
           arrayMap(x -> toFloat64(x), sumForEach(per_pos)) AS bpos
    FROM {{source}}
    WHERE spec_proposed > 0
    GROUP BY {_IDENTITY}, block
)
GROUP BY {_IDENTITY}
ORDER BY model_name, replica_id
"""

_REQUESTS = f"""
SELECT {_IDENTITY}, workload, count() AS n, toFloat64(sum(spec_accepted)) AS a,
       toFloat64(sum(spec_proposed)) AS p,
       sum(toFloat64(spec_accepted) * spec_accepted) AS aa, sum(toFloat64(spec_accepted) * spec_proposed) AS ap,
       sum(toFloat64(spec_proposed) * spec_proposed) AS pp
FROM {{source}}
WHERE spec_proposed > 0
GROUP BY {_IDENTITY}, workload
"""


def _k(identity: dict) -> int:
    try:
        return int(json.loads(identity.get("config_json") or "{}").get("num_speculative_tokens") or 0)
    except (json.JSONDecodeError, TypeError, ValueError):
        return 0


def acceptance(store, scope: Scope) -> list[dict]:
    """Per replica (and version): proposed, accepted, per-position accepted and rates, and the cluster
    sums: `blocks` (overall, time blocks), `positions` (per position, time blocks, trials = drafts)
    and `requests` (workload -> overall, requests)."""
    steps = steps_in(_STEP_COLUMNS)
    params = {**scope.parameters(), "block_ms": BLOCK_SECONDS * 1000}
    rows = store.query_arrow(_BLOCKS.replace("{source}", steps), params).to_pylist()
    reqs = requests_in(_REQUEST_COLUMNS)
    by_replica: dict[tuple, dict[str, ClusterSums]] = {}
    for r in store.query_arrow(_REQUESTS.replace("{source}", reqs), scope.parameters()).to_pylist():
        key = tuple(r[c] for c in ("replica_id", "model_name", "engine_version", "speculative_mode"))
        by_replica.setdefault(key, {})[r["workload"]] = ClusterSums(r["n"], r["a"], r["p"], r["aa"], r["ap"], r["pp"])
    identity = {r["replica_id"]: r for r in replicas_in(store, scope)}
    out = []
    for r in rows:
        k = _k(identity.get(r["replica_id"], {})) or max(1, len(r["pos_a"]))
        key = tuple(r[c] for c in ("replica_id", "model_name", "engine_version", "speculative_mode"))
        drafts = r["p"] / k
        out.append({
            "replica_id": r["replica_id"], "model_name": r["model_name"], "engine_version": r["engine_version"],
            "speculative_mode": r["speculative_mode"], "steps": r["steps"], "k": k,
            "proposed": int(r["p"]), "accepted": int(r["a"]), "per_pos": [int(x) for x in r["pos_a"]],
            "drafts": drafts, "rate": r["a"] / r["p"] if r["p"] else None,
            "per_pos_rate": [a / drafts for a in r["pos_a"]] if drafts else [],
            "blocks": ClusterSums(r["blocks"], r["a"], r["p"], r["aa"], r["ap"], r["pp"]),
            # trials of a position are drafts = proposed / k, so its p-sums scale by 1/k and 1/k^2
            "positions": [ClusterSums(r["blocks"], a, r["p"] / k, aa, ap / k, r["pp"] / k**2)
                          for a, aa, ap in zip(r["pos_a"], r["pos_aa"], r["pos_ap"])],
            "requests": by_replica.get(key, {}),
        })
    return out


def pool(rows: list[dict]) -> dict:
    """Several replicas as one group: counts and cluster sums add (each cluster stays one unit)."""
    positions: list[ClusterSums] = []
    requests: dict[str, ClusterSums] = {}
    for r in rows:
        positions += [ClusterSums() for _ in range(len(r["positions"]) - len(positions))]
        positions = [acc + s for acc, s in zip(positions, r["positions"])] + positions[len(r["positions"]):]
        for w, s in r["requests"].items():
            requests[w] = requests.get(w, ClusterSums()) + s
    blocks = sum((r["blocks"] for r in rows), ClusterSums())
    proposed = sum(r["proposed"] for r in rows)
    return {"replicas": sorted({r["replica_id"] for r in rows}), "proposed": proposed,
            "accepted": sum(r["accepted"] for r in rows), "drafts": sum(r["drafts"] for r in rows),
            "per_pos": [p.a for p in positions], "blocks": blocks, "positions": positions, "requests": requests,
            "requested_proposed": sum(s.p for s in requests.values()), "requests_n": sum(s.n for s in requests.values())}
