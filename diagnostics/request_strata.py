"""Requests put in strata of like with like, in ClickHouse, sampled per (model, replica, stratum).

A stratum is (model, workload, prompt-length bucket, output-length bucket, offered load at arrival):
- prompt length: PROMPT_BUCKET (4x wide);
- output length: powers of sqrt(2) (floor(2 log2 n)), so e2e compares requests of near-equal length;
- offered load at arrival: the tokens (prompt + output) of the requests that arrived at the same
  replica in the OFFERED_WINDOW seconds before it (a window function over its arrivals), bucketed
  by powers of 2. That is what the load balancer sent, not how the replica coped: its running /
  waiting sequences at arrival are a consequence of its speed (a slow replica queues more), so
  strata of them would compare a slow replica's requests with its peers' rare congested ones and
  hide the slowdown. Tokens, not requests: a replica sent the long prompts queues its short ones
  behind their prefills at the same request rate (its tail lengthens, diagnostics.tail_latency),
  which is its traffic, not its speed. Every request the replica received counts as load (probes
  and aborted ones too), those of the OFFERED_WINDOW seconds before the scope's start as well.
Metrics per request (telemetry.contract.derived): queue, prefill, TTFT, decode time per output token
(TPOT) and the request's mean ITL; e2e too, which is only meaningful inside the output-length bucket.
Prefill and TTFT have strata of their own (`by_computed`, BY_COMPUTED): model, workload, computed
prompt tokens (prompt less prefix-cache hits: the work a prefill does; sqrt 2 buckets) and offered
load. A prompt's length says little about its prefill when most of it is cached (on the real fleet
64 of ~85 prompt tokens were: a replica whose peers got more cache hits at the same prompt length
read 1.57x slower on prefill in the simulator), and output length cannot affect a prefill, which
comes before it. (Seconds per computed token in the same strata carried no more: 1.53x [1.18,
1.81] against 1.58x for seconds on the real 32-token budget canary, and within a bucket it still
varies with the count: 0.95x and 1.04x, significant, on a simulated fleet where seconds read 1.00x.)
These strata are the SQL groups' samples re-keyed in Python: exact while no (replica, group) holds
more than SAMPLE_PER_STRATUM requests, beyond that a mixture weighted by the samples (as the tail
rule's merged output buckets).
Each group is a reservoir sample (groupArraySample, fixed seed) of at most SAMPLE_PER_STRATUM
requests plus its exact count: Python sees thousands of rows for millions of requests.
"""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc

from diagnostics.scope import Scope, requests_in
from telemetry.contract import derived
from telemetry.contract.probes import ACTIVE_WORKLOADS_SQL

METRICS = ("queue", "prefill", "ttft", "tpot", "itl", "e2e")
BY_COMPUTED = ("prefill", "ttft")  # compared in strata of computed prompt tokens (`by_computed`)
LABELS = {"queue": "queue time", "prefill": "prefill time", "ttft": "time to first token",
          "tpot": "decode time per output token", "itl": "mean inter-token latency", "e2e": "end-to-end latency"}
SAMPLE_PER_STRATUM = 200
SEED = 7
OFFERED_WINDOW = 5.0  # seconds of arrivals before a request whose tokens count as its offered load

# the prompt tokens a prefill computes: those the prefix cache did not serve
_COMPUTED = "greatest(toInt64(t.prompt_tokens) - toInt64(t.cached_tokens), 1)"
_EXPR = {"queue": "t.queue_seconds", "prefill": "t.prefill_seconds", "ttft": "t.ttft_seconds",
         "tpot": derived.TPOT_SQL.replace("output_tokens", "t.output_tokens")
                                 .replace("e2e_seconds", "t.e2e_seconds").replace("ttft_seconds", "t.ttft_seconds"),
         "itl": "t.mean_itl_seconds", "e2e": "t.e2e_seconds", "cbucket": f"toUInt32(floor(2 * log2({_COMPUTED})))"}
# sampled per request, in METRICS' order (the mean ITL as materialized at insert, migration 0010:
# deriving it here from the sampled token_times read and unpacked every request's array, the query
# took 2.30 s CPU over 1M requests against 1.70 s, same rows); then the arrival (epoch microseconds),
# for the tail rule's bootstrap over time blocks (diagnostics.tail_latency); then its computed-token
# bucket (`by_computed`)
_EXTRA = ("at", "cbucket")
_SAMPLED = METRICS + _EXTRA

LOG2_BUCKET = "toUInt8(if({x} < 1, 0, 1 + floor(log2({x}))))"

# The window function sorts every row it is given by (replica, arrival), all its columns along: it is
# given the raw columns only (_RAW), and the buckets and TPOT are computed after it, on the rows kept.
# Sorting the computed ones too (a prompt-bucket string, TPOT, two buckets, arrival_time beside `at`)
# cost 3-8% of the query's CPU time over 1M requests (1.70 s against 1.61 s, 1.74 s against 1.68 s:
# medians of 10 and 20 alternating rounds on a shared 2-core host), the same rows out.
_RAW = ("replica_id", "model_name", "workload", "finish_reason", "output_tokens", "prompt_tokens", "cached_tokens",
        "queue_seconds", "prefill_seconds", "ttft_seconds", "e2e_seconds", "mean_itl_seconds")

# grouped by the strata's columns (a string per group, not per request, is built outside)
_SQL = """
SELECT model_name, replica_id, workload, offered,
       concat(model_name, '|', workload, '|', pbucket, '|out ', toString(obucket), '|offered ', toString(offered))
           AS stratum, n, {unpack}
FROM (
SELECT model_name, replica_id, workload, pbucket, obucket, offered, count() AS n,
       groupArraySample({cap}, {seed})(({sampled})) AS s
FROM (
    SELECT t.model_name AS model_name, t.replica_id AS replica_id, t.workload AS workload, {pbucket} AS pbucket,
           toUInt32(floor(2 * log2(greatest(t.output_tokens, 1)))) AS obucket, {metrics}, t.at AS at,
           -- arrivals at this replica in the window before this one (the frame holds it and its ties)
           {log2} AS offered
    FROM (SELECT *, sum(work) OVER (PARTITION BY replica_id ORDER BY at
                                    RANGE BETWEEN {window} PRECEDING AND CURRENT ROW) - work AS arrived
          FROM (SELECT *, toUInt64(prompt_tokens + output_tokens) AS work FROM {source})) AS t
    -- the earlier ones only count as load
    WHERE t.at >= toUnixTimestamp64Micro(toDateTime64({start:Float64}, 6, 'UTC'))
      AND t.finish_reason NOT IN ('abort', 'error') AND t.output_tokens > 0
      AND t.workload NOT IN {active}  -- probes and rescores: the prober's rounds, not client traffic
)
GROUP BY model_name, replica_id, workload, pbucket, obucket, offered
)
"""

# every rule that compares like for like by prompt length uses these strata (4x wide)
PROMPT_BUCKET = ("multiIf(t.prompt_tokens < 64, 'prompt<64', t.prompt_tokens < 256, 'prompt 64-255', "
                 "t.prompt_tokens < 1024, 'prompt 256-1023', t.prompt_tokens < 4096, 'prompt 1024-4095', "
                 "'prompt>=4096')")


def _sql(scope: Scope) -> str:
    unpack = ", ".join(f"arrayMap(x -> x.{i + 1}, s) AS {m}" for i, m in enumerate(_SAMPLED))
    metrics = ", ".join(f"{_EXPR[m]} AS {m}" for m in _SAMPLED if m != "at")
    raw = ", ".join(f"t.{c} AS {c}" for c in _RAW)
    source = requests_in(f"{raw}, toUnixTimestamp64Micro(t.arrival_time) AS at",
                         prefix="reach_", scope=scope)  # from OFFERED_WINDOW before the start: their load
    return (_SQL.replace("{active}", ACTIVE_WORKLOADS_SQL).replace("{source}", source)
            .replace("{cap}", str(SAMPLE_PER_STRATUM)).replace("{seed}", str(SEED))
            .replace("{metrics}", metrics).replace("{sampled}", ", ".join(_SAMPLED))
            .replace("{unpack}", unpack).replace("{window}", str(int(OFFERED_WINDOW * 1e6)))
            .replace("{log2}", LOG2_BUCKET.format(x="t.arrived")).replace("{pbucket}", PROMPT_BUCKET))


def without_output_bucket(stratum: str) -> str:
    """The stratum with its output-length bucket left out: for queue time and TTFT, which come before
    the request's own output (its length cannot have caused them), the finer strata only cost requests."""
    head, sep, rest = stratum.partition("|out ")
    return head + rest[rest.index("|"):] if sep else stratum


def samples(store, scope: Scope) -> dict[tuple[str, str], dict]:
    """(model, replica) -> {"n": requests, "strata": {stratum: {metric: finite values}},
    "arrivals": {stratum: {metric: those values' arrival times, epoch seconds}},
    "by_computed": {computed-token stratum: {BY_COMPUTED metric: finite values}}}."""
    start = scope.start - OFFERED_WINDOW if scope.start is not None else None
    table = store.query_arrow(_sql(scope), {**scope.parameters(), **scope.narrowed(start=start).parameters("reach_")})
    if table.num_rows == 0:
        return {}
    lengths = pc.list_value_length(table.column("ttft").combine_chunks()).to_numpy(zero_copy_only=False)
    columns = {m: table.column(m).combine_chunks().flatten().to_numpy(zero_copy_only=False).astype(float)
               for m in METRICS}
    arrivals = table.column("at").combine_chunks().flatten().to_numpy(zero_copy_only=False).astype(float) / 1e6
    cbucket = table.column("cbucket").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    out: dict[tuple[str, str], dict] = {}
    for i, (model, rid, stratum, n, workload, offered) in enumerate(zip(*(
            table.column(c).to_pylist() for c in ("model_name", "replica_id", "stratum", "n", "workload", "offered")))):
        entry = out.setdefault((model, rid), {"n": 0, "strata": {}, "arrivals": {}, "by_computed": {}})
        entry["n"] += int(n)
        lo, hi = bounds[i], bounds[i + 1]
        values, times = {}, {}
        for m in METRICS:
            v = columns[m][lo:hi]
            finite = np.isfinite(v)
            values[m], times[m] = v[finite], arrivals[lo:hi][finite]
        entry["strata"][stratum] = values
        entry["arrivals"][stratum] = times
        b = cbucket[lo:hi]
        for bucket in np.unique(b):
            by = entry["by_computed"].setdefault(f"{model}|{workload}|computed {int(bucket)}|offered {offered}",
                                                 {m: [] for m in BY_COMPUTED})
            for m in BY_COMPUTED:
                v = columns[m][lo:hi]
                by[m].append(v[(b == bucket) & np.isfinite(v)])
    for entry in out.values():  # each stratum's pieces joined once, not re-copied per SQL group
        entry["by_computed"] = {s: {m: np.concatenate(parts) for m, parts in by.items()}
                                for s, by in entry["by_computed"].items()}
    return out
