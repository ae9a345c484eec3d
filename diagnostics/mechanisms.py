"""Mechanisms: why a replica is slow, as far as its own records say, compared with its peers in the same window.

A latency or lag finding names a replica; this module looks in the store for what would make it slow and
cites what it finds, with the numbers on both sides, or says that nothing was found:

- preemptions: the share of its requests preempted at least once (the request is the unit: one long request
  preempted ten times is one), from the `requests` table; where no request of the group records any, the
  share of its steps that preempted (`steps`), as a vLLM fleet whose proxy does not see them;
- KV pressure: the share of its steps with the KV cache at least KV_FULL used (blocks used / total);
- queue against max_num_seqs: the share of its steps where requests waited while every slot its scheduler
  allows (max_num_seqs, from its identity) was running;
- CPU quota: a cgroup CPU quota (the identity's placement.cgroup, engine/cgroup_limits.py) below its peers';
- prefix hits: its prefix-cache hit rate (hit / looked-up prompt tokens) below its peers' by MIN_PREFIX_GAP;
- host time: its median host time per step (the step's wall time less its forward pass) over its peers'.

Each proportion is cited only when it is a real difference: at least MIN_EVENTS events on the replica, at
least MIN_RATIO times the peers' rate (the peers' rate floored at one event, so peers with none do not make
any count a difference) and a two-proportion test at p < ALPHA. A preemption count every replica shows at
the same rate is how the fleet runs, not what makes one of them slow.

Throttling is recorded only at start (the cgroup's counters then, under `_start`): the quota is what the
store can compare over a window; the counters are given as evidence.
"""

from __future__ import annotations

from collections import Counter

from diagnostics import config_keys, hypothesis_tests
from diagnostics.prefix_hits import MIN_GAP as MIN_PREFIX_GAP
from diagnostics.scope import Scope
from telemetry.contract.derived import window_sql

ALPHA = 0.01
MIN_EVENTS = 10  # preempted requests, full-KV steps, saturated steps on the replica before one is a cause
MIN_RATIO = 2.0  # the replica's rate over its peers' (floored at one event)
KV_FULL = 0.9  # share of KV blocks used at which a step counts as under KV pressure
MIN_STEPS = 20  # steps on each side before host time is compared
HOST_RATIO = 1.5  # median host time per step over the peers'
HOST_MIN_SECONDS = 5e-4  # ... and at least this much more per step (50 us over 20 us is no cause)
MIN_PREFIX_TOKENS = 500  # looked-up prompt tokens on each side before hit rates are compared
QUOTA_KEY = "placement.cgroup.cpu_quota_cpus"
NOT_FOUND = "cause not found in the records"
LOOKED_AT = ("preemptions", "KV usage", "queue against max_num_seqs", "CPU quota", "prefix hits", "host time")

_STEPS = f"""
SELECT replica_id,
       countIf(phase != 'idle') AS steps,
       sum(num_preempted) AS preemptions_total,
       countIf(phase != 'idle' AND num_preempted > 0) AS preempting_steps,
       countIf(phase != 'idle' AND kv_blocks_total > 0 AND kv_blocks_used >= {KV_FULL} * kv_blocks_total) AS kv_full,
       max(kv_blocks_total) AS kv_blocks,
       avgIf(kv_blocks_used / kv_blocks_total, phase != 'idle' AND kv_blocks_total > 0) AS kv_used_mean,
       countIf(phase != 'idle' AND num_waiting > 0
               AND num_running >= transform(replica_id, {{ids:Array(String)}}, {{limits:Array(Int64)}}, 0))
           AS saturated,
       avgIf(num_waiting, phase != 'idle') AS waiting_mean,
       sum(prefix_hit_tokens) AS prefix_hit, sum(prefix_query_tokens) AS prefix_query,
       quantileExactIf(0.5)(duration_seconds - forward_seconds, phase != 'idle') AS host_median
FROM steps
WHERE {window_sql('start_time')} AND has({{ids:Array(String)}}, replica_id)
GROUP BY replica_id
"""

_REQUESTS = f"""
SELECT replica_id, count() AS requests, countIf(preemptions > 0) AS preempted, sum(preemptions) AS preemptions_total
FROM requests
WHERE {window_sql('arrival_time')} AND has({{ids:Array(String)}}, replica_id)
GROUP BY replica_id
"""


def _flat(identity: dict) -> dict:
    return config_keys.flat(identity.get("config_json"))


def max_num_seqs(identity: dict) -> int:
    """The scheduler's sequence limit its identity records (any section's key ending max_num_seqs), 0 if none."""
    for k, v in sorted(_flat(identity).items()):
        if k.rsplit(".", 1)[-1] == "max_num_seqs" and isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return 0


def _rows(store, sql: str, parameters: dict) -> dict[str, dict]:
    return {r["replica_id"]: r for r in store.query_arrow(sql, parameters).to_pylist()}


def _sum(rows: list[dict], key: str) -> float:
    return sum(r.get(key) or 0 for r in rows)


def _proportion(mine: int, n_mine: int, theirs: int, n_theirs: int) -> dict | None:
    """The test's numbers when `mine` of `n_mine` is a real excess over `theirs` of `n_theirs`, else None."""
    if mine < MIN_EVENTS or n_mine <= 0 or n_theirs <= 0:
        return None
    rate, peer_rate = mine / n_mine, theirs / n_theirs
    if rate < MIN_RATIO * max(theirs, 1) / n_theirs:
        return None
    t = hypothesis_tests.two_proportions(theirs, n_theirs, mine, n_mine)
    if t is None or t.p_value >= ALPHA:
        return None
    return {"replica": {"events": mine, "of": n_mine, "rate": rate},
            "peers": {"events": theirs, "of": n_theirs, "rate": peer_rate},
            "ratio": rate / peer_rate if peer_rate else None, "test": t.to_dict()}


def _preemptions(me_s, peer_s, me_r, peer_r, any_request_records) -> dict | None:
    if any_request_records:
        c = _proportion(me_r.get("preempted", 0), me_r.get("requests", 0),
                        int(_sum(peer_r, "preempted")), int(_sum(peer_r, "requests")))
        unit = "requests"
    else:
        c = _proportion(me_s.get("preempting_steps", 0), me_s.get("steps", 0),
                        int(_sum(peer_s, "preempting_steps")), int(_sum(peer_s, "steps")))
        unit = "steps"
    if c is None:
        return None
    total = max(me_s.get("preemptions_total") or 0, me_r.get("preemptions_total") or 0)
    c["said"] = (f"{total} preemptions: {c['replica']['events']} of {c['replica']['of']} {unit} preempted "
                 f"({c['replica']['rate']:.0%}) vs {c['peers']['rate']:.1%} on peers")
    c["replica"]["preemptions"], c["unit"] = total, unit
    return c


def _kv(me_s, peer_s) -> dict | None:
    c = _proportion(me_s.get("kv_full", 0), me_s.get("steps", 0), int(_sum(peer_s, "kv_full")),
                    int(_sum(peer_s, "steps")))
    if c is None:
        return None
    peer_blocks = sorted({r.get("kv_blocks") for r in peer_s})
    c["replica"].update(kv_blocks_total=me_s.get("kv_blocks"), kv_used_mean=me_s.get("kv_used_mean"))
    c["peers"].update(kv_blocks_total=peer_blocks)
    c["said"] = (f"KV cache >= {KV_FULL:.0%} used in {c['replica']['rate']:.0%} of steps "
                 f"({me_s.get('kv_blocks')} blocks) vs {c['peers']['rate']:.1%} on peers "
                 f"({', '.join(str(b) for b in peer_blocks)} blocks)")
    return c


def _queue(me_s, peer_s, limit: int, peer_limits: list[int]) -> dict | None:
    c = _proportion(me_s.get("saturated", 0), me_s.get("steps", 0), int(_sum(peer_s, "saturated")),
                    int(_sum(peer_s, "steps")))
    if c is None:
        return None
    common = Counter(peer_limits).most_common(1)[0][0] if peer_limits else 0
    c["replica"].update(max_num_seqs=limit or None, waiting_mean=me_s.get("waiting_mean"))
    c["peers"].update(max_num_seqs=dict(Counter(peer_limits)),
                      waiting_mean=_sum(peer_s, "waiting_mean") / len(peer_s) if peer_s else None)
    slots = f"all {limit} of max_num_seqs running" if limit else "requests running"
    versus = f" (max_num_seqs {common})" if common and common != limit else ""
    c["said"] = (f"requests waited with {slots} in {c['replica']['rate']:.0%} of steps (mean "
                 f"{me_s.get('waiting_mean') or 0:.1f} waiting) vs {c['peers']['rate']:.1%} on peers{versus}")
    return c


def _quota(me: dict, peers: list[dict]) -> dict | None:
    mine = _flat(me).get(QUOTA_KEY)
    theirs = [_flat(p).get(QUOTA_KEY) for p in peers]
    known = [t for t in theirs if t is not None]
    if not isinstance(mine, (int, float)) or isinstance(mine, bool) or not known:
        return None
    common = Counter(str(t) for t in known).most_common(1)[0][0]
    reference = next(t for t in known if str(t) == common)
    if isinstance(reference, (int, float)) and not reference > mine:
        return None  # "max" (no quota) or a larger one: only a smaller quota slows it
    throttling = config_keys.document(me.get("config_json")).get("_start", {}).get("cgroup_throttling")
    cpu_max = _flat(me).get("placement.cgroup.cpu_max")
    return {"replica": {"cpu_quota_cpus": mine, "cpu_max": cpu_max, "throttling_at_start": throttling},
            "peers": {"cpu_quota_cpus": dict(Counter(str(t) for t in theirs))}, "reference": reference,
            "said": f"CPU quota {mine:g} CPUs (cgroup cpu.max {cpu_max}) vs {reference} on peers"}


def _prefix(me_s, peer_s) -> dict | None:
    q, pq = me_s.get("prefix_query", 0) or 0, _sum(peer_s, "prefix_query")
    if q < MIN_PREFIX_TOKENS or pq < MIN_PREFIX_TOKENS:
        return None
    rate, peer_rate = (me_s.get("prefix_hit", 0) or 0) / q, _sum(peer_s, "prefix_hit") / pq
    if peer_rate - rate < MIN_PREFIX_GAP:
        return None
    return {"replica": {"hit_tokens": me_s.get("prefix_hit"), "query_tokens": q, "rate": rate},
            "peers": {"hit_tokens": _sum(peer_s, "prefix_hit"), "query_tokens": pq, "rate": peer_rate},
            "said": f"prefix-cache hits {rate:.0%} of looked-up prompt tokens vs {peer_rate:.0%} on peers"}


def _host(me_s, peer_s) -> dict | None:
    counted = [r for r in peer_s if (r.get("steps") or 0) > 0]
    if (me_s.get("steps") or 0) < MIN_STEPS or _sum(counted, "steps") < MIN_STEPS:
        return None
    mine = me_s.get("host_median") or 0.0
    # the peers' median of per-replica medians, weighted by steps (a peer's typical step, not one outlier)
    weighted = sorted((r["host_median"] or 0.0, r["steps"]) for r in counted)
    half, seen, theirs = _sum(counted, "steps") / 2, 0, 0.0
    for value, n in weighted:
        seen += n
        theirs = value
        if seen >= half:
            break
    if mine < HOST_RATIO * theirs or mine - theirs < HOST_MIN_SECONDS:
        return None
    return {"replica": {"host_seconds_median": mine, "steps": me_s.get("steps")},
            "peers": {"host_seconds_median": theirs, "steps": _sum(counted, "steps")},
            "ratio": mine / theirs if theirs else None,
            "said": f"host time {mine * 1e3:.1f} ms per step (median, outside the forward pass) vs "
                    f"{theirs * 1e3:.1f} ms on peers"}


def cited(store, scope: Scope, replica: str, peers: list[str], identity: dict[str, dict]) -> list[dict]:
    """What the store records that would make `replica` slower than `peers` in `scope`'s window, most
    fundamental first (a quota, then memory, then the queue it causes, then the rest): each {mechanism,
    said (for people), replica, peers (their numbers) ...}. Empty when nothing is a real difference."""
    ids = [replica, *peers]
    limits = [max_num_seqs(identity.get(r, {})) for r in ids]
    window = {k: v for k, v in scope.parameters().items() if k in ("start", "end")}
    steps = _rows(store, _STEPS, {**window, "ids": ids, "limits": limits})
    reqs = _rows(store, _REQUESTS, {**window, "ids": ids})
    me_s, peer_s = steps.get(replica, {}), [steps[p] for p in peers if p in steps]
    me_r, peer_r = reqs.get(replica, {}), [reqs[p] for p in peers if p in reqs]
    any_request_records = any((r.get("preempted") or 0) > 0 for r in reqs.values())
    me_id = identity.get(replica, {"replica_id": replica})
    found = {
        "cpu_quota": _quota(me_id, [identity.get(p, {"replica_id": p}) for p in peers]),
        "preemptions": _preemptions(me_s, peer_s, me_r, peer_r, any_request_records),
        "kv_pressure": _kv(me_s, peer_s),
        "queue_at_max_num_seqs": _queue(me_s, peer_s, limits[0], limits[1:]),
        "prefix_hits": _prefix(me_s, peer_s),
        "host_time": _host(me_s, peer_s),
    }
    return [{"mechanism": name, **c} for name, c in found.items() if c is not None]


def explain(mechanisms: list[dict], limit: int = 3) -> str:
    """One clause for a finding's summary: `cause: <what>; <what>` or that nothing was found."""
    if not mechanisms:
        return f"{NOT_FOUND} ({', '.join(LOOKED_AT)} compared with its peers)"
    return "cause: " + "; ".join(m["said"] for m in mechanisms[:limit])
