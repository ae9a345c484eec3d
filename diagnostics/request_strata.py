"""Requests put in strata of like with like, in ClickHouse, sampled per (model, replica, stratum).

A stratum is (model, workload, prompt-length bucket, output-length bucket, load at arrival):
- prompt length: diagnostics.regression.PROMPT_BUCKET (4x wide);
- output length: powers of sqrt(2) (floor(2 log2 n)), so e2e compares requests of near-equal length;
- load at arrival: the replica's latest step at or before the request's arrival (ASOF JOIN on
  steps), its running and waiting sequences each bucketed by powers of 2. A latest step more than
  IDLE_GAP seconds old means the replica was idle (steps are only taken while there is work).
Metrics per request (telemetry.contract.derived): queue, prefill, TTFT, decode time per output token
(TPOT) and the request's mean ITL; e2e too, which is only meaningful inside the output-length bucket.
Each group is a reservoir sample (groupArraySample, fixed seed) of at most SAMPLE_PER_STRATUM
requests plus its exact count: Python sees thousands of rows for millions of requests.
"""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc

from diagnostics.regression import PROMPT_BUCKET
from diagnostics.scope import Scope, requests_in
from telemetry.contract import derived
from telemetry.contract.derived import replica_filter_sql
from telemetry.contract.probes import ACTIVE_WORKLOADS_SQL

METRICS = ("queue", "prefill", "ttft", "tpot", "itl", "e2e")
LABELS = {"queue": "queue time", "prefill": "prefill time", "ttft": "time to first token",
          "tpot": "decode time per output token", "itl": "mean inter-token latency", "e2e": "end-to-end latency"}
SAMPLE_PER_STRATUM = 200
SEED = 7
IDLE_GAP = 1.0  # seconds

_EXPR = {"queue": "t.queue_seconds", "prefill": "t.prefill_seconds", "ttft": "t.ttft_seconds",
         "tpot": derived.TPOT_SQL.replace("output_tokens", "t.output_tokens")
                                 .replace("e2e_seconds", "t.e2e_seconds").replace("ttft_seconds", "t.ttft_seconds"),
         "token_times": "t.token_times", "e2e": "t.e2e_seconds"}
# sampled per request, in METRICS' order: the mean ITL is taken from the sampled token_times only
_SAMPLED = tuple("token_times" if m == "itl" else m for m in METRICS)

_LOG2 = "toUInt8(if({x} < 1, 0, 1 + floor(log2({x}))))"

# grouped by the strata's columns (a string per group, not per request, is built outside)
_SQL = """
SELECT model_name, replica_id,
       concat(model_name, '|', workload, '|', pbucket, '|out ', toString(obucket), '|run ', toString(run),
              '|wait ', toString(wait)) AS stratum, n, {unpack}
FROM (
SELECT model_name, replica_id, workload, pbucket, obucket, run, wait, count() AS n,
       groupArraySample({cap}, {seed})(({sampled})) AS s
FROM (
    SELECT r.model_name AS model_name, r.replica_id AS replica_id, r.workload AS workload, r.pbucket AS pbucket,
           r.obucket AS obucket, {metrics_r},
           toFloat64(r.arrival_time) - toFloat64(st.start_time) <= {idle} AS busy,
           if(busy, st.run, 0) AS run, if(busy, st.wait, 0) AS wait
    FROM {source} AS r
    ASOF LEFT JOIN (SELECT replica_id, start_time, {run} AS run, {wait} AS wait FROM steps
                    WHERE start_time < toDateTime64({end:Float64}, 6, 'UTC')
                      AND start_time >= toDateTime64({start:Float64} - 60, 6, 'UTC')
                      AND {replicas}) AS st
        ON r.replica_id = st.replica_id AND r.arrival_time >= st.start_time
    WHERE r.finish_reason NOT IN ('abort', 'error') AND r.output_tokens > 0
      AND r.workload NOT IN {active}  -- probes and rescores: the prober's rounds, not client traffic
)
GROUP BY model_name, replica_id, workload, pbucket, obucket, run, wait
)
"""


def _sql(scope: Scope) -> str:
    unpack = ", ".join(f"arrayMap(x -> {derived.mean_itl_sql(f'x.{i + 1}') if m == 'itl' else f'x.{i + 1}'}, s) AS {m}"
                       for i, m in enumerate(METRICS))
    cols = ", ".join(f"{_EXPR[m]} AS {m}" for m in _SAMPLED)
    source = requests_in(f"t.replica_id AS replica_id, t.model_name AS model_name, t.workload AS workload, "
                         f"t.arrival_time AS arrival_time, t.finish_reason AS finish_reason, "
                         f"t.output_tokens AS output_tokens, {PROMPT_BUCKET} AS pbucket, "
                         f"toUInt32(floor(2 * log2(greatest(t.output_tokens, 1)))) AS obucket, {cols}", scope=scope)
    return (_SQL.replace("{active}", ACTIVE_WORKLOADS_SQL).replace("{source}", source).replace("{cap}", str(SAMPLE_PER_STRATUM)).replace("{seed}", str(SEED))
            .replace("{metrics_r}", ", ".join(f"r.{m} AS {m}" for m in _SAMPLED))
            .replace("{sampled}", ", ".join(_SAMPLED)).replace("{unpack}", unpack).replace("{idle}", str(IDLE_GAP))
            .replace("{run}", _LOG2.format(x="num_running")).replace("{wait}", _LOG2.format(x="num_waiting"))
            .replace("{replicas}", replica_filter_sql()))


def samples(store, scope: Scope) -> dict[tuple[str, str], dict]:
    """(model, replica) -> {"n": requests, "strata": {stratum: {metric: finite values}}}."""
    table = store.query_arrow(_sql(scope), scope.parameters())
    if table.num_rows == 0:
        return {}
    lengths = pc.list_value_length(table.column("ttft").combine_chunks()).to_numpy(zero_copy_only=False)
    columns = {m: table.column(m).combine_chunks().flatten().to_numpy(zero_copy_only=False).astype(float)
               for m in METRICS}
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    out: dict[tuple[str, str], dict] = {}
    for i, (model, rid, stratum, n) in enumerate(zip(*(table.column(c).to_pylist()
                                                        for c in ("model_name", "replica_id", "stratum", "n")))):
        entry = out.setdefault((model, rid), {"n": 0, "strata": {}})
        entry["n"] += int(n)
        lo, hi = bounds[i], bounds[i + 1]
        values = {}
        for m in METRICS:
            v = columns[m][lo:hi]
            values[m] = v[np.isfinite(v)]
        entry["strata"][stratum] = values
    return out
