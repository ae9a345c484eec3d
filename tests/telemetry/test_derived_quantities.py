"""telemetry.contract.derived: each derived quantity's Python form and SQL form agree exactly,
edge cases included, on real records in a real store."""

from __future__ import annotations

import dataclasses
import math
import time

import pytest

from telemetry.contract import derived
from telemetry.synthetic import replica, request

T0 = float(int(time.time()) // 3600 * 3600 - 3600)  # recent: the tables' TTLs drop old rows on insert
# token_times (offsets from arrival): none, one token (no gap), two, speculative tokens accepted
# together (a 0 gap), a wall clock stepping back (clamped to 0), a long irregular one
TIMES = {
    "none": [],
    "one": [0.12],
    "two": [0.1, 0.135],
    "spec": [0.05, 0.07, 0.07, 0.07, 0.11],
    "back": [0.2, 0.19, 0.25],
    "long": [0.3 + 0.01 * k + (0.2 if k == 7 else 0.0) + 0.003 * (k % 3) for k in range(40)],
}

# r0 restarted with another config; the latest start is its identity
STARTS = [replica("r0", start_time=T0 - 100),
          dataclasses.replace(replica("r0", start_time=T0 - 50), config_json='{"v": 2}'),
          replica("r1", start_time=T0 - 70)]


def _record(i: int, name: str, replica_id: str):
    times = TIMES[name]
    r = request(i, replica_id=replica_id, t=T0, output_len=len(times))
    finish = times[-1] + 0.004 if times else 0.0
    return dataclasses.replace(r, request_id=name if replica_id == "r0" else f"{name}-{replica_id}",
                               token_times=times, output_tokens=len(times),
                               output_token_ids=list(range(len(times))),
                               ttft_seconds=times[0] if times else 0.0, e2e_seconds=finish)


@pytest.fixture(scope="module")
def derived_store(tmp_path_factory, migrated_copy):
    from telemetry.store import open_store

    store = open_store(migrated_copy(tmp_path_factory.mktemp("derived_store")))
    try:
        store.insert_records("replicas", STARTS)
        records = [_record(i, name, rid) for rid in ("r0", "r1") for i, name in enumerate(TIMES)]
        store.insert_records("requests", records)
        yield store, records
    finally:
        store.close()


def _stored_times(store) -> dict[str, list[float]]:
    rows = store.query_df("SELECT request_id, token_times FROM requests WHERE replica_id = 'r0'")
    return {r.request_id: [float(t) for t in r.token_times] for r in rows.itertuples()}


def test_per_gap_and_per_request_itl_agree_with_sql_row_by_row(derived_store):
    store, _ = derived_store
    rows = store.query_df(f"SELECT request_id, {derived.ITL_GAPS_SQL} AS gaps, {derived.MEAN_ITL_SQL} AS mean, "
                          f"{derived.TPOT_SQL} AS tpot, e2e_seconds, ttft_seconds, output_tokens "
                          f"FROM requests WHERE replica_id = 'r0'")
    times = _stored_times(store)  # float32 in the store: compare with what was stored
    for r in rows.itertuples():
        t = times[r.request_id]
        assert list(r.gaps) == derived.itl_gaps(t), r.request_id
        assert len(r.gaps) == max(len(t) - 1, 0)
        mean = derived.mean_itl(t)
        assert (math.isnan(r.mean) and math.isnan(mean)) or r.mean == pytest.approx(mean, rel=1e-12), r.request_id
        tpot = derived.tpot(r.e2e_seconds, r.ttft_seconds, r.output_tokens)
        assert (math.isnan(r.tpot) and math.isnan(tpot)) or r.tpot == pytest.approx(tpot, rel=1e-12)
    by_id = {r.request_id: r for r in rows.itertuples()}
    assert list(by_id["spec"].gaps) == pytest.approx([0.02, 0.0, 0.0, 0.04], abs=1e-6)
    assert list(by_id["back"].gaps) == pytest.approx([0.0, 0.06], abs=1e-6)  # never negative
    assert math.isnan(by_id["one"].mean) and math.isnan(by_id["none"].mean)
    assert derived.mean_itl([0.12], empty=0.0) == 0.0


def test_quantiles_over_gaps_agree_with_clickhouse(derived_store):
    store, _ = derived_store
    row = store.query_df(f"SELECT {derived.ITL_PER_GAP_QUANTILES_SQL} AS per_gap, "
                         f"{derived.quantiles_sql(derived.MEAN_ITL_SQL, 'output_tokens > 1')} AS per_request "
                         f"FROM requests WHERE replica_id = 'r0'").iloc[0]
    times = _stored_times(store).values()
    gaps = [g for t in times for g in derived.itl_gaps(t)]
    assert list(row["per_gap"]) == pytest.approx(derived.quantiles(gaps), rel=1e-12)
    means = [derived.mean_itl(t) for t in times if len(t) > 1]
    assert list(row["per_request"]) == pytest.approx(derived.quantiles(means), rel=1e-12)
    assert list(row["per_gap"]) != pytest.approx(list(row["per_request"]), rel=1e-3)  # two units, two answers
    assert derived.QUANTILE_NAMES == ("p50", "p90", "p99")
    empty = store.query_df(f"SELECT {derived.ITL_PER_GAP_QUANTILES_SQL} AS q FROM requests "
                           f"WHERE request_id IN ('none', 'one')").iloc[0]["q"]
    assert all(math.isnan(v) for v in empty) and all(math.isnan(v) for v in derived.quantiles([]))


def test_ttft_split_and_decode():
    assert derived.ttft_split(10.0, 10.5, 12.0) == (0.5, 1.5, 2.0)
    assert derived.ttft_split(10.0, 10.5, 0.0) == (0.5, 0.0, 0.0)  # scheduled, aborted before a token
    assert derived.ttft_split(10.0, 0.0, 0.0) == (0.0, 0.0, 0.0)  # aborted in the queue
    assert derived.decode_seconds(12.0, 13.0) == 1.0 and derived.decode_seconds(0.0, 13.0) == 0.0
    assert derived.e2e_seconds(10.0, 13.0) == 3.0


def test_window_and_replica_filters_agree_with_sql(derived_store):
    store, records = derived_store
    start, end = records[1].arrival_time, records[4].arrival_time
    for chosen in ([], ["r1"], ["r0", "r1"]):
        sql = (f"SELECT request_id, replica_id FROM requests WHERE {derived.window_sql('arrival_time')} "
               f"AND {derived.REPLICA_FILTER_SQL}")
        got = {tuple(r) for r in store.query_df(sql, {"start": start, "end": end, "replicas": chosen})
               [["request_id", "replica_id"]].itertuples(index=False)}
        want = {(r.request_id, r.replica_id) for r in records
                if derived.in_window(r.arrival_time, start, end) and derived.selected(r.replica_id, chosen)}
        assert got == want and got, chosen
    assert derived.in_window(1.0, 1.0, 2.0) and not derived.in_window(2.0, 1.0, 2.0)  # half-open


def test_latest_start_of_each_replica_agrees_with_sql(derived_store):
    store, _ = derived_store
    sql = derived.latest_starts_sql(["config_json", "engine_version"]) + " ORDER BY replica_id"
    rows = store.query_arrow(sql).to_pylist()
    latest = derived.latest_starts(STARTS)
    assert [r["replica_id"] for r in rows] == sorted(latest) == ["r0", "r1"]
    for r in rows:
        assert r["config_json"] == latest[r["replica_id"]].config_json
        assert r["started"].timestamp() == pytest.approx(latest[r["replica_id"]].start_time)
    assert rows[0]["config_json"] == '{"v": 2}'
    filtered = store.query_arrow(derived.latest_starts_sql(["config_json"], where="start_time < toDateTime64("
                                                           f"{T0 - 60}, 6, 'UTC')") + " ORDER BY replica_id")
    assert filtered.to_pylist()[0]["config_json"] != '{"v": 2}'  # the filter runs before the latest is taken
