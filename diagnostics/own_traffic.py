"""Own traffic: a replica that waits because it was sent heavier work is not a lagging replica.

The like-for-like strata (diagnostics.request_strata) count offered load in tokens, prompt and output alike.
An output token, though, holds a sequence slot for a whole step, while a prompt token is one of many a prefill
step computes at once: a tenant asking for 8x the output fills max_num_seqs at the same offered tokens, and its
requests then really wait. That queue is what the replica was sent, not how it serves. A lag finding is kept at
info, with that said, only when every one of these holds:

- the only mechanism found in its records (diagnostics.mechanisms) is the queue at max_num_seqs: a quota,
  throttling, preemptions, KV pressure or host time are causes of its own;
- its identity does not differ from its peers' (a smaller max_num_seqs, another config: a cause of its own);
- the sequence-steps it was offered per second (the output tokens of the requests that arrived at it, each a
  slot held for one step, over the span of its arrivals) are at least HEAVIER times its peers' median;
- its steps take no longer than its peers' at the same batch shape: the median step time in strata of phase,
  sequences (powers of 2) and context tokens (powers of sqrt 2: a longer output is a longer context, and attention
  reads it; in 2x buckets a healthy heavier-output canary read 1.07x, in sqrt 2 ones 1.03-1.05x), MIN_STEPS steps
  on each side, over the peers', a geometric mean weighted by its steps, is under step_model.MIN_RATIO, the
  smallest slowdown of a step worth a finding.
  A replica that is slower per step as well as sent more is slow, whatever else it was sent; with no batch
  shape in common nothing says it is not, and the finding stands.
"""

from __future__ import annotations

import numpy as np

from diagnostics.mechanisms import MIN_STEPS
from diagnostics.scope import Scope, requests_in, steps_in

HEAVIER = 1.5  # offered sequence-steps per second over the peers' median: a load balancer's split is far closer
SAME_SPEED = 1.10  # step time over the peers' at the same batch shape (diagnostics.steps.MIN_RATIO)
SATURATION = "queue_at_max_num_seqs"
SEVERITY = "info"

_OFFERED_COLUMNS = ("t.replica_id AS replica_id, t.output_tokens AS output_tokens, "
                    "toUnixTimestamp64Micro(t.arrival_time) AS at")
_OFFERED = """
SELECT replica_id, count() AS requests, sum(output_tokens) AS sequence_steps,
       (max(at) - min(at)) / 1e6 AS span_seconds
FROM {source}
GROUP BY replica_id
"""
_STEP_TIMES_COLUMNS = ("t.replica_id AS replica_id, t.phase AS phase, t.num_seqs AS num_seqs, "
                       "t.num_context_tokens AS context_tokens, t.duration_seconds AS duration")
_STEP_TIMES = """
SELECT replica_id, phase, toUInt8(floor(log2(greatest(num_seqs, 1)))) AS seqs,
       toUInt8(floor(2 * log2(greatest(context_tokens, 1)))) AS context, count() AS n,
       quantileExact(0.5)(duration) AS median
FROM {source}
WHERE phase != 'idle'
GROUP BY replica_id, phase, seqs, context
"""


def offered(store, scope: Scope, replicas: list[str]) -> dict[str, dict]:
    """replica -> {requests, sequence_steps, span_seconds, per_second}: every request that arrived at it in the
    window (probes too: they hold slots as well)."""
    narrowed = scope.narrowed(replicas=tuple(replicas))
    source = requests_in(_OFFERED_COLUMNS, scope=narrowed)
    out = {}
    for r in store.query_arrow(_OFFERED.replace("{source}", source), narrowed.parameters()).to_pylist():
        span = max(float(r["span_seconds"] or 0.0), 1.0)
        out[r["replica_id"]] = {**r, "per_second": float(r["sequence_steps"] or 0) / span}
    return out


def step_time_ratio(store, scope: Scope, replica: str, peers: list[str]) -> dict | None:
    """The replica's median step time over its peers' (their medians weighted by their steps) in the same
    (phase, sequences, context tokens) strata, a geometric mean weighted by its steps; None without a stratum
    both sides have MIN_STEPS in."""
    narrowed = scope.narrowed(replicas=(replica, *peers))
    source = steps_in(_STEP_TIMES_COLUMNS)
    mine, theirs = {}, {}
    for r in store.query_arrow(_STEP_TIMES.replace("{source}", source), narrowed.parameters()).to_pylist():
        key = (r["phase"], r["seqs"], r["context"])
        (mine if r["replica_id"] == replica else theirs).setdefault(key, []).append(r)
    ratios, weights = [], []
    for key, (m,) in mine.items():
        others = [o for o in theirs.get(key, []) if o["n"] >= MIN_STEPS and o["median"] > 0]
        if m["n"] < MIN_STEPS or m["median"] <= 0 or not others:
            continue
        peer_median = float(np.average([o["median"] for o in others], weights=[o["n"] for o in others]))
        ratios.append(np.log(m["median"] / peer_median))
        weights.append(m["n"])
    if not ratios:
        return None
    return {"ratio": float(np.exp(np.average(ratios, weights=weights))), "strata": len(ratios),
            "steps": int(sum(weights))}


def kept_at_info(store, scope: Scope, finding):
    """The lag finding (evidence "replica", "peers", "identity_differences", "mechanisms"), at info with its
    explanation where the replica's own heavier traffic alone explains it (the module's rule); else as given."""
    ev = finding.evidence
    found = [m["mechanism"] for m in ev.get("mechanisms", [])]
    if found != [SATURATION] or ev.get("identity_differences"):
        return finding
    rid, peers = ev["replica"], list(ev["peers"])
    load = offered(store, scope, [rid, *peers])
    peer_rates = [load[p]["per_second"] for p in peers if p in load]
    if rid not in load or not peer_rates:
        return finding
    reference = float(np.median(peer_rates))
    heavier = load[rid]["per_second"] / reference if reference > 0 else float("inf")
    speed = step_time_ratio(store, scope, rid, peers)
    if heavier < HEAVIER or speed is None or speed["ratio"] >= SAME_SPEED:
        return finding
    ev["own_traffic"] = {"sequence_steps_per_second": load[rid]["per_second"], "peers_median": reference,
                         "heavier": heavier, "bar": HEAVIER, "step_time_ratio": speed, "same_speed_bar": SAME_SPEED,
                         "offered": load, "severity_before": finding.severity}
    finding.severity = SEVERITY
    finding.summary = (f"{finding.summary}; its own traffic, not a fault: it was offered "
                       f"{load[rid]['per_second']:.1f} sequence-steps/s (output tokens of its arrivals) vs "
                       f"{reference:.1f} on peers ({heavier:.1f}x), which fills max_num_seqs, and its steps take "
                       f"{speed['ratio']:.2f}x its peers' at the same batch shape")
    return finding
