"""Who a latency change point belongs to: the replica whose identity change preceded it, else the one
replica that carries it, else the fleet.

A change point is found on the fleet's requests pooled (diagnostics.regression.creep): latency relative to
its workload / prompt-length stratum stepped up at time T. Pooled, it cannot say whose. Here each replica's
own requests around T are compared, before T (from the start of the segment before the step) against after
(to the end of the segment after), each relative to its stratum's median over that span, Mann-Whitney U
with the ratio of medians:

1. `identity_event`: a replica that restarted with another identity (diagnostics.identity_events) between
   the start of the segment before the step and one bucket after T, and whose own requests show the step
   (ratio >= the change point's bar, p < ALPHA), where no replica without such a change stepped too: the
   finding is that replica's, citing its event ("since 05:01:10 UTC, when max_num_seqs went 16 → 2");
   with several, the one whose step is the largest;
2. `only_replica`: no such event, and exactly one replica shows the step while every other replica's ratio
   stays under the bar: the finding is that replica's, said as not explained by an identity change;
3. otherwise the fleet's (every replica stepped: load, the host, a shared dependency), with each replica's
   ratio in the evidence, so a reader sees it was looked for.

A replica whose requests are too few on either side (MIN_SAMPLES) cannot show a step and is not blamed.
"""

from __future__ import annotations

import numpy as np

from diagnostics import identity_events
from evals.stats import compare_samples
from diagnostics.scope import Scope

ALPHA = 0.01
MIN_SAMPLES = 8  # requests of a replica on each side of the step before its own step is tested
SAMPLE = 500  # per replica and side: groupArraySample's size (a literal in the SQL)

# `source`: a subquery with replica_id, stratum, arrival_time and value (the metric, finite or not)
_MEDIANS = """
SELECT stratum, median(value) AS med
FROM {source}
WHERE isFinite(value) AND value > 0
  AND arrival_time >= toDateTime64({lo:Float64}, 6, 'UTC') AND arrival_time < toDateTime64({hi:Float64}, 6, 'UTC')
GROUP BY stratum
"""
_SIDES = f"""
SELECT replica_id, arrival_time >= toDateTime64({{at:Float64}}, 6, 'UTC') AS after, count() AS n,
       groupArraySample({SAMPLE}, 1)(value / arrayElement({{meds:Array(Float64)}}, indexOf({{keys:Array(String)}},
                                                                                     stratum))) AS sample
FROM {{source}}
WHERE isFinite(value) AND value > 0 AND has({{keys:Array(String)}}, stratum)
  AND arrival_time >= toDateTime64({{lo:Float64}}, 6, 'UTC') AND arrival_time < toDateTime64({{hi:Float64}}, 6, 'UTC')
GROUP BY replica_id, after
"""


_SERVED = """
SELECT replica_id, count() AS n FROM {source} WHERE isFinite(value) GROUP BY replica_id ORDER BY replica_id
"""


def served_replicas(store, source: str, params: dict) -> list[str]:
    """The replicas with served requests in `source` (the scope's window)."""
    return [r["replica_id"] for r in store.query_arrow(_SERVED.replace("{source}", source), params).to_pylist()]


def replica_steps(store, source: str, params: dict, lo: float, at: float, hi: float) -> dict[str, dict]:
    """replica -> {ratio (after / before, medians of latency relative to its stratum), p, n_before, n_after};
    a replica with too few requests on a side has ratio None."""
    window = {**params, "lo": lo, "hi": hi, "at": at}
    medians = [r for r in store.query_arrow(_MEDIANS.replace("{source}", source), window).to_pylist()
               if r["med"] and r["med"] > 0]
    if not medians:
        return {}
    window.update(keys=[r["stratum"] for r in medians], meds=[float(r["med"]) for r in medians])
    sides: dict[str, dict] = {}
    for r in store.query_arrow(_SIDES.replace("{source}", source), window).to_pylist():
        sides.setdefault(r["replica_id"], {})["after" if r["after"] else "before"] = np.asarray(r["sample"], float)
    out = {}
    for rid, s in sorted(sides.items()):
        before, after = s.get("before", np.array([])), s.get("after", np.array([]))
        c = (compare_samples(before, after, bootstrap=False)
             if min(len(before), len(after)) >= MIN_SAMPLES else None)
        out[rid] = {"n_before": int(len(before)), "n_after": int(len(after)),
                    "ratio": None if c is None or c.ratio is None else float(c.ratio),
                    "p": None if c is None else float(c.p_value)}
    return out


def _stepped(s: dict, bar: float) -> bool:
    return s["ratio"] is not None and s["ratio"] >= bar and s["p"] is not None and s["p"] < ALPHA


def attribute(store, scope: Scope, finding, source: str, params: dict, bar: float):
    """Name the replica a fleet's change point belongs to (the module's rules), in place: subject, summary and
    evidence "attribution" (and "identity_events" where an event is cited). Returns the finding."""
    ev = finding.evidence
    at, lo, hi, width = ev["change_at"], ev["before_from"], ev["after_to"], ev["bucket_seconds"]
    steps = replica_steps(store, source, params, lo, at, hi)
    stepped = {rid: s for rid, s in steps.items() if _stepped(s, bar)}
    events = {rid: [e for e in evs if lo <= e.time <= at + width]
              for rid, evs in identity_events.events(store, scope).items()}
    preceding = {rid: evs[-1] for rid, evs in events.items() if evs and rid in stepped}
    attribution = {"rule": "fleet", "replicas": steps, "bar": bar}
    if preceding and set(stepped) <= set(preceding):  # a replica that stepped with no change of its own: the fleet's
        rid = max(preceding, key=lambda r: stepped[r]["ratio"])
        event = preceding[rid]
        attribution.update(rule="identity_event", replica=rid, event=event.describe())
        ev["identity_events"] = [event.describe()]  # cited here: diagnostics.run does not cite it again
        finding.summary = f"{rid}: {finding.summary}; {_said(stepped[rid])} on {rid} alone, {event.since()}"
        finding.subject = f"{finding.subject.split(':', 1)[0]}: {rid}"
    elif len(stepped) == 1 and (peers := [s for r, s in steps.items() if r not in stepped]) \
            and all(s["ratio"] is not None and s["ratio"] < bar for s in peers):
        (rid, s), = stepped.items()
        attribution.update(rule="only_replica", replica=rid)
        finding.summary = (f"{rid}: {finding.summary}; {_said(s)} on {rid} alone, its peers under "
                           f"{bar:g}x (no identity change of {rid} precedes it)")
        finding.subject = f"{finding.subject.split(':', 1)[0]}: {rid}"
    else:
        finding.summary += ("; every replica with requests on both sides stepped" if len(stepped) > 1
                            and len(stepped) == sum(s["ratio"] is not None for s in steps.values())
                            else "; no one replica carries it")
    ev["attribution"] = attribution
    return finding


def _said(s: dict) -> str:
    return f"{s['ratio']:.2f}x (MWU p={s['p']:.1e}, {s['n_before']} -> {s['n_after']} requests)"
