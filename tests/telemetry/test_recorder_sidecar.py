"""Proof: recorder -> sidecar over clickhouse-connect, with the sidecar killed mid-run and restarted:
nothing lost, nothing duplicated (count and ids match exactly)."""

from __future__ import annotations

import threading
import time

import pytest

from telemetry import synthetic
from telemetry.recorder import Recorder
from telemetry.sidecar.process import start_sidecar
from telemetry.store import open_store

N_REQUESTS = 3000


@pytest.mark.slow
def test_sidecar_killed_mid_run_loses_nothing_and_duplicates_nothing(tmp_path):
    data_dir = tmp_path / "store"
    sidecar = start_sidecar(data_dir)
    rec = Recorder(sidecar.url, "crash", flush_interval=0.05, max_batch_rows=100, spool_dir=tmp_path / "spool")
    requests = synthetic.records("requests", N_REQUESTS, replica_id="crash")
    progress = threading.Event()

    def produce():  # the engine: steady traffic, whatever happens to the store
        for i, record in enumerate(requests):
            rec.on_request_finished(record)
            if i == N_REQUESTS // 3:
                progress.set()
            if i % 50 == 0:
                time.sleep(0.01)

    producer = threading.Thread(target=produce)
    producer.start()
    progress.wait(60)
    while rec.stats()["requests"]["written"] == 0:  # the store has taken some rows ...
        time.sleep(0.01)
    sidecar.kill()  # ... when it crashes, likely in the middle of an insert
    while rec.stats()["requests"]["spooled"] == 0 and producer.is_alive():
        time.sleep(0.01)
    restarted = start_sidecar(data_dir, port=sidecar.port)
    try:
        producer.join()
        rec.close()
        stats = rec.stats()["requests"]
        assert stats["spooled"] > 0, "the outage should have sent batches to the spool"
        assert stats["written"] == N_REQUESTS and stats["dropped"] == 0 and stats["replayed"] == stats["spooled"]
        assert rec.spool.files() == []
        with open_store(restarted.url) as store:
            df = store.query_df("SELECT request_id, output_token_ids FROM requests WHERE replica_id = 'crash'")
    finally:
        restarted.stop()
    assert len(df) == N_REQUESTS  # no duplicates
    expected = {r.request_id: r.output_token_ids for r in requests}
    assert set(df["request_id"]) == set(expected)  # nothing lost
    assert all(list(ids) == expected[rid] for rid, ids in zip(df["request_id"], df["output_token_ids"]))
