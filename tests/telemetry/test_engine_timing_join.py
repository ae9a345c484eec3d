"""A proxied request's row and the engine's own timing of it join on (replica_id, request_id).

The proxy sees no queue and no prefill split (its row has scheduled_time 0); vLLM's plugin behind it
writes `engine_request_timings` under the proxy's id (engine.serving.vllm_adapter.stats_records). Joined,
the request has the engine's split and the proxy's token IDs together.
"""

import pytest

from dashboards import queries
from engine.serving.vllm_adapter.stats_records import engine_timing_record
from telemetry import synthetic
from telemetry.contract import derived


def _proxied_row(i: int):
    row = synthetic.request(i, "v0")
    row.request_id, row.scheduled_time, row.queue_seconds, row.prefill_seconds = f"px-{i}", 0.0, 0.0, 0.0
    return row


def _engine_row(proxied, engine_id: str):
    engine = synthetic.request(0, "v0")
    engine.request_id, engine.prompt_token_ids, engine.output_token_ids = engine_id, [], []
    engine.arrival_time = proxied.arrival_time + 0.004  # the engine got it after the proxy did
    engine.queue_seconds, engine.prefill_seconds = 0.03, 0.01
    engine.ttft_seconds = 0.04
    return engine_timing_record(engine)


@pytest.fixture
def joined_store(store):
    proxied = [_proxied_row(i) for i in range(3)]
    store.insert_records("requests", proxied)
    # vLLM's ids for the first two (a completion, a chat); the third request has no engine row
    store.insert_records("engine_request_timings", [_engine_row(proxied[0], "cmpl-px-0-0"),
                                                    _engine_row(proxied[1], "chatcmpl-px-1")])
    yield store, proxied
    for table in ("requests", "engine_request_timings"):
        store.command(f"TRUNCATE TABLE {table}")


def test_engine_timing_joins_the_proxys_row_with_its_token_ids(joined_store):
    store, proxied = joined_store
    queue, prefill = derived.engine_timed_sql("queue_seconds"), derived.engine_timed_sql("prefill_seconds")
    rows = store.query_df(f"SELECT t.request_id AS id, length(t.output_token_ids) AS n_out, {queue} AS queue, "
                          f"{prefill} AS prefill, e.engine_request_id AS engine_id FROM requests AS t "
                          f"{derived.ENGINE_TIMING_JOIN_SQL} WHERE t.replica_id = 'v0' ORDER BY id")
    by_id = {r["id"]: r for r in rows.to_dict("records")}
    assert by_id["px-0"]["engine_id"] == "cmpl-px-0-0" and by_id["px-1"]["engine_id"] == "chatcmpl-px-1"
    for rid in ("px-0", "px-1"):  # the engine's split, beside the proxy's token IDs
        assert (by_id[rid]["queue"], by_id[rid]["prefill"]) == pytest.approx((0.03, 0.01))
        assert by_id[rid]["n_out"] == len(proxied[0].output_token_ids) > 0
    assert (by_id["px-2"]["queue"], by_id["px-2"]["engine_id"]) == (0.0, "")  # no engine row: the request's own
    assert len(rows) == 3  # the join adds no row


def test_the_request_view_shows_what_the_engine_measured(joined_store):
    store, proxied = joined_store
    found = store.query_df(queries.ENGINE_TIMING, {"request_id": "px-1"})
    assert found["engine_request_id"].tolist() == ["chatcmpl-px-1"]
    assert found["before_engine_seconds"][0] == pytest.approx(proxied[1].ttft_seconds - 0.04)
    assert store.query_df(queries.ENGINE_TIMING, {"request_id": "px-2"}).empty


def test_only_engine_measured_columns_can_be_taken_from_the_engine():
    with pytest.raises(ValueError, match="not an engine-timed column"):
        derived.engine_timed_sql("output_token_ids")
