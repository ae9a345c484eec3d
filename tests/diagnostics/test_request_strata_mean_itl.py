"""The strata's mean ITL is the column materialized at insert (migration 0010), not token_times read and
unpacked at query time: every sampled value is still the contract's derivation (derived.mean_itl) of that
request's token times, sampled groups included, and the query returns what the one before it did."""

from __future__ import annotations

import dataclasses
import math
import random

import numpy as np

from diagnostics import request_strata as rs
from diagnostics.request_strata import PROMPT_BUCKET
from diagnostics.scope import Scope, requests_in
from telemetry import synthetic
from telemetry.contract import derived
from telemetry.contract.probes import ACTIVE_WORKLOADS_SQL

T0 = synthetic.T0 + 50_000
PER_REPLICA = 1500  # 500 per workload over 30 s: groups past SAMPLE_PER_STRATUM, so sampling is exercised


def _token_times(rng: random.Random, k: int) -> list[float]:
    n = rng.choice([1, 2, 16, 16, 16, 40]) if k % 50 else 0  # one token: no gap; none: not a finished one
    t, out = rng.uniform(0.01, 0.05), []
    for _ in range(n):
        out.append(t)
        t += rng.choice([0.0, -0.001, rng.uniform(0.002, 0.03)])  # ties, a clock stepping back, gaps
    return out


def _fleet(store) -> dict[tuple[str, int], list[float]]:
    """(replica, arrival in ms) -> token times as stored (Float32)."""
    rng, times = random.Random(3), {}
    for rid in ("r0", "r1"):
        records = []
        for i in range(PER_REPLICA):
            r = synthetic.request(i, replica_id=rid, t=T0 + 0.002 * (rid == "r1"), prompt_len=40)
            r = dataclasses.replace(r, arrival_time=T0 + i * 0.02 + 0.002 * (rid == "r1"))
            tt = _token_times(rng, i)
            records.append(dataclasses.replace(r, token_times=tt, output_tokens=len(tt),
                                               output_token_ids=list(range(len(tt)))))
            times[(rid, round(r.arrival_time * 1000))] = [float(np.float32(x)) for x in tt]
        store.insert_records("requests", records)
    return times


def test_sampled_mean_itl_is_the_contracts_derivation_of_each_requests_token_times(clean):
    times = _fleet(clean)
    out = rs.samples(clean, Scope(start=T0 - 1))
    assert {rid for _, rid in out} == {"r0", "r1"}
    checked = sampled = 0
    for (_, rid), entry in out.items():
        for stratum, values in entry["strata"].items():
            itl, at = values["itl"], entry["arrivals"][stratum]["itl"]
            assert len(itl) == len(at)
            for v, a in zip(itl, at):
                expected = derived.mean_itl(times[(rid, round(a * 1000))])
                assert v == expected, (rid, stratum, a)  # exact, not approximately
                checked += 1
            # one-token requests have a TTFT but no ITL (nan, left out): none is lost or invented
            ttft_at = entry["arrivals"][stratum]["ttft"]
            gaps = [a for a in ttft_at if len(times[(rid, round(a * 1000))]) > 1]
            assert sorted(gaps) == sorted(at)
            sampled += len(ttft_at) == rs.SAMPLE_PER_STRATUM
    assert checked > 1000 and sampled > 0  # many values, and groups where the reservoir sampled
    assert not any(math.isnan(v) for e in out.values() for s in e["strata"].values() for v in s["itl"])


def test_the_query_reads_the_materialized_column_not_token_times():
    sql = rs._sql(Scope(start=T0))
    assert "token_times" not in sql  # reading and unpacking them cost ~0.6 s per 1M requests
    assert "mean_itl_seconds" in sql


# the query as it was before migration 0010: the mean ITL derived from each sampled request's token_times,
# the buckets and TPOT computed before the offered-load window (the reference the new one must equal)
_PREVIOUS = """
SELECT model_name, replica_id, workload, offered,
       concat(model_name, '|', workload, '|', pbucket, '|out ', toString(obucket), '|offered ', toString(offered))
           AS stratum, n, {unpack}
FROM (SELECT model_name, replica_id, workload, pbucket, obucket, offered, count() AS n,
             groupArraySample({cap}, {seed})(({sampled})) AS s
      FROM (SELECT model_name, replica_id, workload, pbucket, obucket, {sampled}, {offered} AS offered
            FROM (SELECT *, sum(work) OVER (PARTITION BY replica_id ORDER BY at
                                            RANGE BETWEEN {window} PRECEDING AND CURRENT ROW) - work AS arrived
                  FROM (SELECT *, toUnixTimestamp64Micro(arrival_time) AS at,
                               toUInt64(prompt_tokens + output_tokens) AS work FROM {source}))
            WHERE arrival_time >= toDateTime64({start:Float64}, 6, 'UTC')
              AND finish_reason NOT IN ('abort', 'error') AND output_tokens > 0 AND workload NOT IN {active})
      GROUP BY model_name, replica_id, workload, pbucket, obucket, offered)
"""


def _previous_sql(scope: Scope) -> str:
    sampled = tuple("token_times" if m == "itl" else m for m in rs.METRICS) + rs._EXTRA
    exprs = {**rs._EXPR, "token_times": "t.token_times"}
    unpack = ", ".join(f"arrayMap(x -> {derived.mean_itl_sql(f'x.{i + 1}') if m == 'token_times' else f'x.{i + 1}'}"
                       f", s) AS {'itl' if m == 'token_times' else m}" for i, m in enumerate(sampled))
    source = requests_in(
        "t.replica_id AS replica_id, t.model_name AS model_name, t.workload AS workload, "
        "t.arrival_time AS arrival_time, "
        "t.finish_reason AS finish_reason, t.output_tokens AS output_tokens, t.prompt_tokens AS prompt_tokens, "
        f"{PROMPT_BUCKET} AS pbucket, toUInt32(floor(2 * log2(greatest(t.output_tokens, 1)))) AS obucket, "
        + ", ".join(f"{exprs[m]} AS {m}" for m in sampled if m != "at"), prefix="reach_", scope=scope)
    return (_PREVIOUS.replace("{active}", ACTIVE_WORKLOADS_SQL).replace("{source}", source)
            .replace("{cap}", str(rs.SAMPLE_PER_STRATUM)).replace("{seed}", str(rs.SEED))
            .replace("{sampled}", ", ".join(sampled)).replace("{unpack}", unpack)
            .replace("{window}", str(int(rs.OFFERED_WINDOW * 1e6))).replace("{offered}", rs.LOG2_BUCKET.format(x="arrived")))


def test_the_query_returns_what_the_previous_one_did(clean):
    _fleet(clean)
    clean.insert_records("requests", [dataclasses.replace(synthetic.request(i, replica_id="r0"),  # load only
                                                          arrival_time=T0 + 0.01 + i * 0.1, workload="probe")
                                      for i in range(100)])
    scope = Scope(start=T0 + 3)  # the requests of the 5 s before count as load, not as samples
    params = {**scope.parameters(), **scope.narrowed(start=scope.start - rs.OFFERED_WINDOW).parameters("reach_")}
    one_thread = " SETTINGS max_threads = 1"  # groupArraySample's reservoir depends on the order rows come in
    keys = [(c, "ascending") for c in ("model_name", "replica_id", "stratum")]
    got = clean.query_arrow(rs._sql(scope) + one_thread, params).sort_by(keys)
    want = clean.query_arrow(_previous_sql(scope) + one_thread, params).sort_by(keys)
    assert got.num_rows > 20 and len(set(got.column("offered").to_pylist())) > 1
    assert got.column_names == want.column_names
    for name in got.column_names:
        assert _plain(got.column(name).to_pylist()) == _plain(want.column(name).to_pylist()), name


def _plain(values):  # nan as a marker: nan != nan would fail list equality
    if isinstance(values, list):
        return [_plain(v) for v in values]
    return "nan" if isinstance(values, float) and math.isnan(values) else values
