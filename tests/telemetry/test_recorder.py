"""The recorder: buffers, writes, spools when the store is unreachable, replays without duplicates,
counts every row, and never raises into (or blocks) the engine."""

from __future__ import annotations

import shutil
import socket
import time

import pytest

from telemetry.contract.hooks import EngineObserver, MultiObserver
from telemetry import synthetic
from telemetry.recorder import Recorder


def closed_port_url() -> str:
    """An http endpoint on localhost where nothing listens: a store that is down."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def spool_dir(tmp_path):
    return tmp_path / "spool"


def _count(store, table, where="1", params=None):
    return int(store.query_df(f"SELECT count() AS n FROM {table} WHERE {where}", params)["n"][0])


def test_hooks_buffer_and_close_writes_everything(store, spool_dir):
    rec = Recorder(store.path, "r-all", spool_dir=spool_dir, flush_interval=60)
    assert isinstance(rec, EngineObserver) and rec.enabled
    rec.on_replica_start(synthetic.replica("r-all"))
    for i in range(300):
        rec.on_step(synthetic.step(i, "r-all"))
    requests = synthetic.records("requests", 40, replica_id="r-all")
    for r in requests:
        rec.on_request_finished(r)
    rec.record("findings", synthetic.finding("f-rec"))
    rec.record("eval_items", synthetic.eval_item(1, run_id="run-rec"))
    rec.close()
    stats = rec.stats()
    assert stats["steps"] == {"written": 300, "spooled": 0, "replayed": 0, "dropped": 0}
    assert stats["requests"]["written"] == 40 and stats["replicas"]["written"] == 1
    assert stats["findings"]["written"] == 1 and stats["eval_items"]["written"] == 1
    df = store.query_df("SELECT request_id, output_token_ids FROM requests WHERE replica_id = 'r-all' "
                     "ORDER BY request_id")
    by_id = {r.request_id: r.output_token_ids for r in requests}
    assert sorted(df["request_id"]) == sorted(by_id)
    assert all(list(ids) == by_id[rid] for rid, ids in zip(df["request_id"], df["output_token_ids"]))
    assert _count(store, "steps", "replica_id = 'r-all'") == 300


def test_batches_flush_by_size_and_by_interval(store, spool_dir):
    with Recorder(store, "r-size", spool_dir=spool_dir, flush_interval=60, max_batch_rows=50) as rec:
        for i in range(120):
            rec.on_step(synthetic.step(i, "r-size"))
        deadline = time.monotonic() + 30
        while rec.stats()["steps"]["written"] < 100 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rec.stats()["steps"]["written"] >= 100  # two full batches went without waiting 60 s
    with Recorder(store, "r-interval", spool_dir=spool_dir, flush_interval=0.2) as rec:
        rec.on_step(synthetic.step(0, "r-interval"))
        deadline = time.monotonic() + 30
        while rec.stats()["steps"]["written"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rec.stats()["steps"]["written"] == 1


def test_appends_racing_with_flushes_are_each_stored_once(store, spool_dir):
    # the hooks append without a lock while the flusher takes batches: none lost, none twice
    import threading

    with Recorder(store, "r-race", spool_dir=spool_dir, flush_interval=0.01, max_batch_rows=37) as rec:
        def flusher():
            for _ in range(40):
                rec.flush()

        t = threading.Thread(target=flusher)
        t.start()
        for i in range(2000):
            rec.on_step(synthetic.step(i, "r-race"))
        t.join()
    assert rec.stats()["steps"] == {"written": 2000, "spooled": 0, "replayed": 0, "dropped": 0}
    ids = store.query_df("SELECT step_id FROM steps WHERE replica_id = 'r-race'")["step_id"]
    assert sorted(ids) == list(range(2000))


def test_text_is_stored_only_when_allowed(store, spool_dir):
    for store_text in (False, True):
        rid = f"r-text-{store_text}"
        record = synthetic.request(0, rid)
        record.prompt_text, record.output_text = "secret prompt", "secret output"
        record.upstream_error_body = '{"detail": [{"input": "secret prompt"}]}'  # a proxy's upstream 422 quotes it
        with Recorder(store, rid, spool_dir=spool_dir, store_text=store_text) as rec:
            rec.on_request_finished(record)
        row = store.query_df("SELECT prompt_text, output_text, upstream_error_body, prompt_text_hash FROM requests "
                         "WHERE replica_id = {r:String}", {"r": rid}).iloc[0]
        expected = ("secret prompt", "secret output", record.upstream_error_body) if store_text else ("", "", "")
        assert (row["prompt_text"], row["output_text"], row["upstream_error_body"]) == expected
        assert row["prompt_text_hash"] == record.prompt_text_hash  # the hash is always kept


def test_malformed_rows_are_dropped_and_counted_the_rest_written(store, spool_dir):
    bad = synthetic.step(1, "r-bad")
    bad.num_seqs = -5  # UInt32 column
    with Recorder(store, "r-bad", spool_dir=spool_dir) as rec:
        rec.on_step(synthetic.step(0, "r-bad"))
        rec.on_step(bad)
        rec.on_step(synthetic.step(2, "r-bad"))
        rec.on_step(None)  # not even a record: must not raise into the engine
    assert rec.stats()["steps"] == {"written": 2, "spooled": 0, "replayed": 0, "dropped": 2}
    assert rec.failures == 1
    assert _count(store, "steps", "replica_id = 'r-bad'") == 2


def test_full_buffer_drops_with_a_count(store, spool_dir):
    with Recorder(store, "r-full", spool_dir=spool_dir, flush_interval=60, max_batch_rows=1000,
                  max_buffer_rows=10) as rec:
        for i in range(15):
            rec.on_step(synthetic.step(i, "r-full"))
        assert rec.stats()["steps"]["dropped"] == 5 and rec.pending_rows() == 10
    assert rec.stats()["steps"]["written"] == 10


def test_unreachable_store_spools_then_a_full_spool_drops_and_the_caller_keeps_going(spool_dir):
    rec = Recorder(closed_port_url(), "r-down", spool_dir=spool_dir, flush_interval=60, max_batch_rows=100,
                   spool_max_bytes=64 << 10)
    started = time.perf_counter()
    for batch in range(30):
        for i in range(100):
            rec.on_request_finished(synthetic.request(batch * 100 + i, "r-down"))
        rec.flush()  # each flush: the batch goes to the spool until it is full, then is dropped
    rec.close()
    elapsed = time.perf_counter() - started
    stats = rec.stats()["requests"]
    assert stats["written"] == 0 and stats["spooled"] > 0 and stats["dropped"] > 0
    assert stats["spooled"] + stats["dropped"] == 3000
    assert rec.spool.size_bytes <= 64 << 10
    assert sum(rec.spool.read(p).data.num_rows for p in rec.spool.files()) == stats["spooled"]
    assert elapsed < 120  # sanity bound only: the store being down never hangs the caller


def test_spool_replays_into_the_store_exactly_once(store, tmp_path):
    spool_dir = tmp_path / "spool"
    down = Recorder(closed_port_url(), "r-replay", spool_dir=spool_dir, flush_interval=60, max_batch_rows=25)
    requests = synthetic.records("requests", 100, replica_id="r-replay")
    for r in requests:
        down.on_request_finished(r)
    down.close()
    assert down.stats()["requests"]["spooled"] == 100
    copy = tmp_path / "spool-copy"
    shutil.copytree(spool_dir, copy)  # the same batches, as if a replay were retried after a lost answer

    up = Recorder(store, "r-replay", spool_dir=spool_dir)
    up.close()
    assert up.stats()["requests"] == {"written": 100, "spooled": 0, "replayed": 100, "dropped": 0}
    assert up.spool.files() == []
    again = Recorder(store, "r-replay", spool_dir=copy)
    again.close()
    assert again.stats()["requests"]["replayed"] == 100  # sent again, under the same tokens ...
    ids = store.query_df("SELECT request_id FROM requests WHERE replica_id = 'r-replay'")["request_id"]
    assert sorted(ids) == sorted(r.request_id for r in requests)


def test_recorder_works_inside_a_multi_observer(store, spool_dir):
    rec = Recorder(store, "r-multi", spool_dir=spool_dir)
    multi = MultiObserver([rec, EngineObserver()])
    multi.on_step(synthetic.step(0, "r-multi"))
    multi.close()
    assert rec.stats()["steps"]["written"] == 1


def test_record_rejects_unknown_tables(store, spool_dir):
    with Recorder(store, "r-unknown", spool_dir=spool_dir) as rec:
        with pytest.raises(ValueError, match="unknown table"):
            rec.record("nope", synthetic.step(0))
    rec.on_step(synthetic.step(1, "r-unknown"))  # after close: dropped and counted, never raised
    assert rec.stats()["steps"]["dropped"] == 1


def test_default_spool_is_private_and_cleaned_up(store):
    a, b = Recorder(store, "r-default"), Recorder(store, "r-default")
    assert a.spool.directory != b.spool.directory  # another run's leftovers are never replayed here
    a.close()
    b.close()
    assert not a.spool.directory.exists() and not b.spool.directory.exists()
