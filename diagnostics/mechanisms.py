"""Mechanisms: why something is slow, as far as its own records say, against what it is compared with.

A latency or lag finding names a subject and a reference: a lagging replica and its peers in the same window
(diagnostics.replicas, diagnostics.steps), a candidate and its baseline (diagnostics.regression), the
time after a change point and the time before it. This module looks in the store for what would make the
subject slow and cites what it finds, with the numbers on both sides, or says that nothing was found
(each side's records pooled over its replicas):

- preemptions: the share of its requests preempted at least once (the request is the unit: one long request
  preempted ten times is one), from the `requests` table; where no request of the group records any, the
  share of its steps that preempted (`steps`), as a vLLM fleet whose proxy does not see them;
- KV pressure: the share of its steps with the KV cache at least KV_FULL used (blocks used / total);
- queue against max_num_seqs: the share of its steps where requests waited while every slot its scheduler
  allows (max_num_seqs, from its identity) was running;
- CPU quota: a cgroup CPU quota (the identity's placement.cgroup, engine/core/cgroup_limits.py) below its peers';
- CPU throttling: the share of its cgroup's CPU periods throttled over the window (the steps carry the
  cgroup's counters, each replica's difference between its first and last step), above its peers' (a peer
  without a quota has no periods: throttled never);
- prefix hits: its prefix-cache hit rate (hit / looked-up prompt tokens) below its peers' by MIN_PREFIX_GAP;
- host time: its median host time per step (the step's wall time less its forward pass) over its peers', in
  strata of batch size (sequences, powers of two: host time grows with the batch, so a replica that batched
  more is not said to spend more time per step for it).

Each proportion is cited only when it is a real difference: at least MIN_EVENTS events on the subject, at
least MIN_RATIO times the reference's rate (floored at one event, so a reference with none does not make any
count a difference) and a two-proportion test at p < ALPHA. A preemption count every replica shows at the
same rate is how the fleet runs, not what makes one of them slow. The test takes steps as independent,
which consecutive steps are not (they share a batch): for KV pressure and the queue it is a screen, and the
ratio bar, not the p-value, carries the decision. These are citations beside a finding its own diagnostic
has already tested, not findings of their own.

A quota is a setting; throttling is what it did in the window: a quota the replica never reached is no cause,
and a quota set on a running process (after its start row was written) shows only as throttling.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

import numpy as np

from diagnostics import config_keys
from diagnostics.prefix_hits import MIN_GAP as MIN_PREFIX_GAP
from diagnostics.scope import Scope, replicas_in, requests_in, steps_in
from evals.stats import two_proportions

ALPHA = 0.01
MIN_EVENTS = 10  # preempted requests, full-KV steps, saturated steps on the replica before one is a cause
MIN_RATIO = 2.0  # the replica's rate over its peers' (floored at one event)
KV_FULL = 0.9  # share of KV blocks used at which a step counts as under KV pressure
MIN_STEPS = 20  # steps on each side of a batch-size stratum before its host times are compared
HOST_RATIO = 1.5  # median host time per step over the peers' (weighted geometric mean over strata)
HOST_MIN_SECONDS = 5e-4  # ... and at least this much more per step (50 us over 20 us is no cause)
MIN_PREFIX_TOKENS = 500  # looked-up prompt tokens on each side before hit rates are compared
QUOTA_KEY = "placement.cgroup.cpu_quota_cpus"
NOT_FOUND = "cause not found in the records"
LOOKED_AT = ("preemptions", "KV usage", "queue against max_num_seqs", "CPU quota", "CPU throttling", "prefix hits",
             "host time")

# one side's steps and requests, pooled over its replicas (`source`: scope.steps_in / requests_in, the side's
# window, replicas, versions, config hashes and models)
_STEPS = f"""
SELECT count() AS steps,
       sum(num_preempted) AS preemptions_total,
       countIf(num_preempted > 0) AS preempting_steps,
       countIf(kv_blocks_total > 0 AND kv_blocks_used >= {KV_FULL} * kv_blocks_total) AS kv_full,
       groupUniqArray(kv_blocks_total) AS kv_blocks,
       avgIf(kv_blocks_used / kv_blocks_total, kv_blocks_total > 0) AS kv_used_mean,
       countIf(num_waiting > 0
               AND num_running >= transform(replica_id, {{ids:Array(String)}}, {{limits:Array(Int64)}}, 0))
           AS saturated,
       avg(num_waiting) AS waiting_mean,
       sum(prefix_hit_tokens) AS prefix_hit, sum(prefix_query_tokens) AS prefix_query
FROM {{source}}
WHERE phase != 'idle'
"""
_HOST = """
SELECT toUInt8(floor(log2(greatest(num_seqs, 1)))) AS batch, count() AS n, quantileExact(0.5)(host_seconds) AS median
FROM {source}
WHERE phase != 'idle'
GROUP BY batch
"""
_STEP_COLUMNS = ("t.replica_id AS replica_id, t.phase AS phase, t.num_preempted AS num_preempted, "
                 "t.kv_blocks_total AS kv_blocks_total, t.kv_blocks_used AS kv_blocks_used, "
                 "t.num_waiting AS num_waiting, t.num_running AS num_running, "
                 "t.prefix_hit_tokens AS prefix_hit_tokens, t.prefix_query_tokens AS prefix_query_tokens, "
                 "t.num_seqs AS num_seqs, t.duration_seconds - t.forward_seconds AS host_seconds, "
                 "t.cpu_periods AS cpu_periods, t.cpu_throttled_periods AS cpu_throttled_periods, "
                 "t.cpu_throttled_seconds AS cpu_throttled_seconds")
# each replica's cgroup counters over the window (cumulative: last minus first), summed over the side
_THROTTLED = """
SELECT sum(periods) AS periods, sum(throttled) AS throttled, sum(seconds) AS seconds
FROM (SELECT replica_id, max(cpu_periods) - min(cpu_periods) AS periods,
             max(cpu_throttled_periods) - min(cpu_throttled_periods) AS throttled,
             max(cpu_throttled_seconds) - min(cpu_throttled_seconds) AS seconds
      FROM {source} GROUP BY replica_id)
"""
MIN_THROTTLED_SHARE = 0.05  # of its periods, against peers that have no quota (no periods to compare)
_REQUEST_COLUMNS = "t.preemptions AS preemptions"
_REQUESTS = """
SELECT count() AS requests, countIf(preemptions > 0) AS preempted, sum(preemptions) AS preemptions_total
FROM {source}
"""


@dataclass(frozen=True)
class Side:
    """What is compared: the scope's records (window, replicas, versions ...) and its replicas' identity rows."""
    scope: Scope
    identities: tuple[dict, ...]


def _flat(identity: dict) -> dict:
    return config_keys.flat(identity.get("config_json"))


def max_num_seqs(identity: dict) -> int:
    """The scheduler's sequence limit its identity records (any section's key ending max_num_seqs), 0 if none."""
    for k, v in sorted(_flat(identity).items()):
        if k.rsplit(".", 1)[-1] == "max_num_seqs" and isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return 0


def _totals(store, side: Side, ids: list[str], limits: list[int]) -> tuple[dict, dict]:
    """(its steps' numbers, its requests' numbers), each pooled over the side's replicas."""
    params = {**side.scope.parameters(), "ids": ids, "limits": limits}
    steps = store.query_arrow(_STEPS.replace("{source}", steps_in(_STEP_COLUMNS)), params).to_pylist()[0]
    steps["throttling"] = store.query_arrow(_THROTTLED.replace("{source}", steps_in(_STEP_COLUMNS)),
                                            params).to_pylist()[0]
    steps["host"] = {r["batch"]: r for r in store.query_arrow(_HOST.replace("{source}", steps_in(_STEP_COLUMNS)),
                                                               params).to_pylist()}
    source = requests_in(_REQUEST_COLUMNS, scope=side.scope)
    reqs = store.query_arrow(_REQUESTS.replace("{source}", source), side.scope.parameters()).to_pylist()[0]
    return steps, reqs


def _common(values: list):
    """The most common value (None when there is none)."""
    known = [v for v in values if v is not None]
    if not known:
        return None
    top = Counter(json.dumps(v, sort_keys=True) for v in known).most_common(1)[0][0]
    return next(v for v in known if json.dumps(v, sort_keys=True) == top)


def _proportion(mine: int, n_mine: int, theirs: int, n_theirs: int) -> dict | None:
    """The test's numbers when `mine` of `n_mine` is a real excess over `theirs` of `n_theirs`, else None."""
    mine, n_mine, theirs, n_theirs = int(mine or 0), int(n_mine or 0), int(theirs or 0), int(n_theirs or 0)
    if mine < MIN_EVENTS or n_mine <= 0 or n_theirs <= 0:
        return None
    rate, other_rate = mine / n_mine, theirs / n_theirs
    if rate < MIN_RATIO * max(theirs, 1) / n_theirs:
        return None
    t = two_proportions(theirs, n_theirs, mine, n_mine)
    if t is None or t.p_value >= ALPHA:
        return None
    return {"replica": {"events": mine, "of": n_mine, "rate": rate},
            "others": {"events": theirs, "of": n_theirs, "rate": other_rate},
            "ratio": rate / other_rate if other_rate else None, "test": t.to_dict()}


def _preemptions(mine: dict, theirs: dict, others: str) -> dict | None:
    """Preempted requests where either side's requests record any, else preempting steps."""
    (ms, mr), (ts, tr) = mine, theirs
    if (mr.get("preempted") or 0) + (tr.get("preempted") or 0) > 0:
        c, unit = _proportion(mr.get("preempted"), mr.get("requests"), tr.get("preempted"), tr.get("requests")), \
            "requests"
    else:
        c, unit = _proportion(ms.get("preempting_steps"), ms.get("steps"), ts.get("preempting_steps"),
                              ts.get("steps")), "steps"
    if c is None:
        return None
    total = max(ms.get("preemptions_total") or 0, mr.get("preemptions_total") or 0)
    c["replica"]["preemptions"], c["unit"] = total, unit
    c["said"] = (f"{total} preemptions: {c['replica']['events']} of {c['replica']['of']} {unit} preempted "
                 f"({c['replica']['rate']:.0%}) vs {c['others']['rate']:.1%} {others}")
    return c


def _blocks(steps: dict) -> str:
    return ", ".join(str(b) for b in sorted(steps.get("kv_blocks") or [])) or "?"


def _kv(mine: dict, theirs: dict, others: str) -> dict | None:
    (ms, _), (ts, _) = mine, theirs
    c = _proportion(ms.get("kv_full"), ms.get("steps"), ts.get("kv_full"), ts.get("steps"))
    if c is None:
        return None
    c["replica"].update(kv_blocks_total=sorted(ms.get("kv_blocks") or []), kv_used_mean=ms.get("kv_used_mean"))
    c["others"].update(kv_blocks_total=sorted(ts.get("kv_blocks") or []), kv_used_mean=ts.get("kv_used_mean"))
    c["said"] = (f"KV cache >= {KV_FULL:.0%} used in {c['replica']['rate']:.0%} of steps ({_blocks(ms)} blocks) "
                 f"vs {c['others']['rate']:.1%} {others} ({_blocks(ts)} blocks)")
    return c


def _queue(mine: dict, theirs: dict, limit, other_limit, others: str) -> dict | None:
    (ms, _), (ts, _) = mine, theirs
    c = _proportion(ms.get("saturated"), ms.get("steps"), ts.get("saturated"), ts.get("steps"))
    if c is None:
        return None
    c["replica"].update(max_num_seqs=limit or None, waiting_mean=ms.get("waiting_mean"))
    c["others"].update(max_num_seqs=other_limit or None, waiting_mean=ts.get("waiting_mean"))
    slots = f"all {limit} of max_num_seqs running" if limit else "requests running"
    versus = f" (max_num_seqs {other_limit})" if other_limit and other_limit != limit else ""
    c["said"] = (f"requests waited with {slots} in {c['replica']['rate']:.0%} of steps (mean "
                 f"{ms.get('waiting_mean') or 0:.1f} waiting) vs {c['others']['rate']:.1%} {others}{versus}")
    return c


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _quota(mine: Side, theirs: Side, others: str) -> dict | None:
    """A cgroup CPU quota smaller than the other side's ("max": none), with both values."""
    quota = _common([_flat(r).get(QUOTA_KEY) for r in mine.identities])
    reference = _common([_flat(r).get(QUOTA_KEY) for r in theirs.identities])
    if not _number(quota) or reference is None or (_number(reference) and not reference > quota):
        return None  # no quota, or the others' own or a larger one: only a smaller quota slows it
    me = next(r for r in mine.identities if _flat(r).get(QUOTA_KEY) == quota)
    cpu_max = _flat(me).get("placement.cgroup.cpu_max")
    throttling = config_keys.document(me.get("config_json")).get("_start", {}).get("cgroup_throttling")
    return {"replica": {"cpu_quota_cpus": quota, "cpu_max": cpu_max, "throttling_at_start": throttling},
            "others": {"cpu_quota_cpus": dict(Counter(str(_flat(r).get(QUOTA_KEY)) for r in theirs.identities))},
            "reference": reference,
            "said": f"CPU quota {quota:g} CPUs (cgroup cpu.max {cpu_max}) vs {reference} {others}"}


def _throttling(mine: dict, theirs: dict, others: str) -> dict | None:
    """The share of its cgroup's CPU periods throttled, over the other side's (or over none, where the other
    side ran without a quota: no periods, never throttled)."""
    m, t = mine[0]["throttling"], theirs[0]["throttling"]
    throttled, periods = int(m.get("throttled") or 0), int(m.get("periods") or 0)
    if int(t.get("periods") or 0) > 0:
        c = _proportion(throttled, periods, t.get("throttled"), t.get("periods"))
    elif throttled >= MIN_EVENTS and throttled >= MIN_THROTTLED_SHARE * periods:
        c = {"replica": {"events": throttled, "of": periods, "rate": throttled / periods},
             "others": {"events": 0, "of": 0, "rate": 0.0}, "ratio": None, "test": None}
    else:
        c = None
    if c is None:
        return None
    c["replica"]["throttled_seconds"] = float(m.get("seconds") or 0.0)
    c["others"]["throttled_seconds"] = float(t.get("seconds") or 0.0)
    versus = f"{c['others']['rate']:.1%} {others}" if c["others"]["of"] else f"none {others} (no CPU quota)"
    c["said"] = (f"CPU throttled in {c['replica']['rate']:.0%} of its cgroup's periods "
                 f"({throttled} of {periods}, {c['replica']['throttled_seconds']:.1f} s) vs {versus}")
    return c


def _prefix(mine: dict, theirs: dict, others: str) -> dict | None:
    (ms, _), (ts, _) = mine, theirs
    q, tq = ms.get("prefix_query") or 0, ts.get("prefix_query") or 0
    if q < MIN_PREFIX_TOKENS or tq < MIN_PREFIX_TOKENS:
        return None
    rate, other_rate = (ms.get("prefix_hit") or 0) / q, (ts.get("prefix_hit") or 0) / tq
    if other_rate - rate < MIN_PREFIX_GAP:
        return None
    return {"replica": {"hit_tokens": ms.get("prefix_hit"), "query_tokens": q, "rate": rate},
            "others": {"hit_tokens": ts.get("prefix_hit"), "query_tokens": tq, "rate": other_rate},
            "said": f"prefix-cache hits {rate:.0%} of looked-up prompt tokens vs {other_rate:.0%} {others}"}


def _host(mine: dict, theirs: dict, others: str) -> dict | None:
    """Median host time per step over the other side's in the same batch-size strata (both with MIN_STEPS
    steps), a geometric mean weighted by the subject's steps."""
    (ms, _), (ts, _) = mine, theirs
    strata = [(a, ts["host"][b], b) for b, a in sorted(ms.get("host", {}).items())
              if b in ts.get("host", {}) and a["n"] >= MIN_STEPS and ts["host"][b]["n"] >= MIN_STEPS
              and a["median"] > 0 and ts["host"][b]["median"] > 0]
    if not strata:
        return None
    weights = np.array([a["n"] for a, _, _ in strata], float)
    m, t = np.array([a["median"] for a, _, _ in strata]), np.array([o["median"] for _, o, _ in strata])
    ratio = float(np.exp(np.average(np.log(m / t), weights=weights)))
    m_typical, t_typical = float(np.average(m, weights=weights)), float(np.average(t, weights=weights))
    if ratio < HOST_RATIO or m_typical - t_typical < HOST_MIN_SECONDS:
        return None
    return {"replica": {"host_seconds_median": m_typical, "steps": int(weights.sum())},
            "others": {"host_seconds_median": t_typical, "steps": int(sum(o["n"] for _, o, _ in strata))},
            "ratio": ratio, "batch_size_strata": [f"{2 ** b}-{2 ** (b + 1) - 1} sequences" for _, _, b in strata],
            "said": f"host time {m_typical * 1e3:.1f} ms per step (median, outside the forward pass) vs "
                    f"{t_typical * 1e3:.1f} ms {others} at the same batch sizes"}


def compared(store, subject: Side, reference: Side, others: str = "on peers") -> list[dict]:
    """What the records of `subject` show that would make it slower than `reference` (its peers in the same
    window, a baseline, the time before a change), most fundamental first (a quota, then memory, then the
    queue it causes, then the rest): each {mechanism, said (for people; the reference said as `others`: "on
    peers", "on the baseline", "before the change"),
    replica (the subject's numbers), others (the reference's) ...}. Empty when nothing is a real difference."""
    everyone = {r["replica_id"]: r for r in (*reference.identities, *subject.identities) if "replica_id" in r}
    ids = sorted(everyone)
    limits = [max_num_seqs(everyone[r]) for r in ids]
    mine, theirs = _totals(store, subject, ids, limits), _totals(store, reference, ids, limits)
    limit = _common([max_num_seqs(r) for r in subject.identities])
    other_limit = _common([max_num_seqs(r) for r in reference.identities])
    found = {
        "cpu_quota": _quota(subject, reference, others),
        "cpu_throttling": _throttling(mine, theirs, others),
        "preemptions": _preemptions(mine, theirs, others),
        "kv_pressure": _kv(mine, theirs, others),
        "queue_at_max_num_seqs": _queue(mine, theirs, limit, other_limit, others),
        "prefix_hits": _prefix(mine, theirs, others),
        "host_time": _host(mine, theirs, others),
    }
    return [{"mechanism": name, **c} for name, c in found.items() if c is not None]


def cited(store, scope: Scope, replica: str, peers: list[str], identity: dict[str, dict]) -> list[dict]:
    """`compared` for one replica against its peers in `scope`'s window."""
    if not peers:
        return []

    def side(ids):
        return Side(scope.narrowed(replicas=tuple(ids)), tuple(identity.get(r, {"replica_id": r}) for r in ids))

    return compared(store, side([replica]), side(peers))


def between(store, subject: Scope, reference: Scope, others: str) -> list[dict]:
    """`compared` for two scopes (a candidate and its baseline, the time after a change and before it), each
    with the identities of the replicas that ran in it."""
    return compared(store, Side(subject, tuple(replicas_in(store, subject))),
                    Side(reference, tuple(replicas_in(store, reference))), others)


def cite(store, scope: Scope, finding, identity: dict[str, dict]):
    """Look for the mechanism of a finding about one replica against its peers (evidence "replica" and "peers")
    and say it: one clause appended to its summary, the numbers under evidence "mechanisms". Returns it."""
    return said(finding, cited(store, scope, finding.evidence["replica"], list(finding.evidence["peers"]), identity))


def said(finding, found: list[dict]):
    """`found` said in the finding: one clause appended to its summary, the numbers under evidence "mechanisms"."""
    finding.summary = f"{finding.summary}; {explain(found)}"
    finding.evidence["mechanisms"] = found
    return finding


def explain(mechanisms: list[dict], limit: int = 3) -> str:
    """One clause for a finding's summary: `cause: <what>; <what>` or that nothing was found."""
    if not mechanisms:
        return f"{NOT_FOUND} ({', '.join(LOOKED_AT)} compared)"
    return "cause: " + "; ".join(m["said"] for m in mechanisms[:limit])


# What a setting does by itself, whatever traffic the replica got. Prefix hits and host time also move with
# which prompts a replica served (one that refuses long prompts hits the cache less), and nothing here
# compares like with like, so they are no evidence of what a setting did.
SETTING_EFFECTS = ("cpu_quota", "cpu_throttling", "preemptions", "kv_pressure", "queue_at_max_num_seqs")


def effects(store, scope: Scope, finding, identity: dict[str, dict]):
    """What a replica named for other options than its reference replicas (evidence "replica" and
    "reference_replicas": diagnostics.identity's config_mismatch) shows in the same window against them: a
    smaller KV cache's preemptions, a smaller max_num_seqs' queue, a CPU quota's throttling. The difference is
    the finding whether or not it shows; what it did is said only where the records show it (no clause, no
    evidence otherwise: a setting that did nothing yet is not a cause of anything). Returns the finding."""
    rid, refs = finding.evidence.get("replica"), [r for r in finding.evidence.get("reference_replicas", ()) if r]
    if not isinstance(rid, str) or not refs:
        return finding
    found = [m for m in cited(store, scope, rid, refs, identity) if m["mechanism"] in SETTING_EFFECTS]
    if found:
        finding.summary = (f"{finding.summary}; in this window it shows: "
                           + "; ".join(m["said"] for m in found[:3]))
        finding.evidence["mechanisms"] = found
    return finding
