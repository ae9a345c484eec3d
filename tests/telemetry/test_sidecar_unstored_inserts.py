"""Proof: an insert the store did not write is never acknowledged. The sidecar runs as a service
without CAP_DAC_OVERRIDE would (root here, so the capability is dropped with setpriv); its data
directory turns unwritable while a real Recorder sends, then writable again. chdb's insert stream
reports such inserts as written; the sidecar answers them 503, so the recorder spools them and
replays them with their dedup tokens: rows stored == records acknowledged, by request id, no
duplicates, and meanwhile /health says degraded, the metric counts, the log says it once."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import httpx
import pytest

from telemetry import synthetic
from telemetry.recorder import Recorder
from telemetry.sidecar.process import start_sidecar
from telemetry.store import open_store

N = 600
REPLICA = "unwritable"


def _as_a_service() -> tuple[str, ...]:
    """What makes permissions bind the sidecar: nothing for a non-root user; for root, no
    CAP_DAC_OVERRIDE (nor the capabilities that would stand in for it)."""
    if os.geteuid() != 0:
        return ()
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv is needed to run the sidecar without CAP_DAC_OVERRIDE")
    caps = "-dac_override,-dac_read_search,-fowner"
    return ("setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}", "--")


def _make_unwritable(data_dir: Path) -> dict[Path, int]:
    modes = {d: d.stat().st_mode & 0o7777 for d in [data_dir, *data_dir.rglob("*")] if d.is_dir()}
    for d in modes:
        d.chmod(0o555)
    return modes


def _wait(condition, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _stored(store) -> tuple[int, set[str]]:
    df = store.query_df("SELECT request_id FROM requests WHERE replica_id = {r:String}", {"r": REPLICA})
    return len(df), set(df["request_id"])


def _failed_writes(sidecar) -> float:
    for line in httpx.get(f"{sidecar.url}/metrics", timeout=30).text.splitlines():
        if line.startswith("infersight_sidecar_failed_writes_total{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no infersight_sidecar_failed_writes_total sample")


def test_an_insert_the_store_did_not_write_is_retried_until_stored(tmp_path):
    data_dir = tmp_path / "store"
    sidecar = start_sidecar(data_dir, wrapper=_as_a_service())
    rec = Recorder(sidecar.url, REPLICA, flush_interval=0.05, max_batch_rows=50, spool_dir=tmp_path / "spool",
                   max_backoff=1.0)
    records = synthetic.records("requests", N, replica_id=REPLICA)
    written = lambda: rec.stats()["requests"]["written"]  # noqa: E731 - what the recorder was told is stored
    try:
        with open_store(sidecar.url) as store:
            for r in records[:200]:
                rec.on_request_finished(r)
            _wait(lambda: written() == 200, "the first records to be stored")
            assert _failed_writes(sidecar) == 0

            modes = _make_unwritable(data_dir)
            try:
                for r in records[200:400]:
                    rec.on_request_finished(r)
                # every record of the outage answered, one way or the other
                _wait(lambda: written() + rec.stats()["requests"]["spooled"] >= 400, "the records to be answered")
                count, ids = _stored(store)
                assert count == written() and len(ids) == count  # acknowledged == stored
                assert rec.stats()["requests"]["spooled"] > 0
                health = httpx.get(f"{sidecar.url}/health", timeout=30)
                assert health.status_code == 503 and health.json()["status"] == "degraded", health.text
                assert "not being stored" in health.json()["reason"]
                assert _failed_writes(sidecar) > 0
            finally:
                for d, mode in modes.items():
                    d.chmod(mode)

            for r in records[400:]:
                rec.on_request_finished(r)
            _wait(lambda: written() == N and not rec.spool.files(), "every record to be stored", timeout=180)
            rec.close()
            stats = rec.stats()["requests"]
            assert stats["dropped"] == 0 and stats["replayed"] == stats["spooled"] > 0
            count, ids = _stored(store)
        assert count == N  # no duplicates
        assert ids == {r.request_id for r in records}  # nothing lost
        health = httpx.get(f"{sidecar.url}/health", timeout=30).json()
        assert health["writes"] == {"failing": False}
        output = sidecar.output()
        assert output.count("inserts are not being stored") == 1, output  # once per episode
        assert output.count("inserts are stored again") == 1, output
    finally:
        rec.close()
        sidecar.stop()


def test_another_inserts_failure_is_not_counted_against_a_stored_insert(tmp_path):
    """The failed-insert counter is the process's: a writer's INSERT ... SELECT failing while a good
    insert streams must not make the good one 'not stored' (a 503 and a degraded /health, for any
    writer to trigger at will). The good insert's stream starts the failing one from another thread
    and gives it time to fail before its own rows finish; inserts run one at a time, so it waits."""
    import threading

    from telemetry.schema import migrate
    from telemetry.store.errors import StoreError

    with open_store(str(tmp_path / "store")) as store:
        migrate(store)
        outcome: list[str] = []

        def failing_insert():
            try:
                store.execute("INSERT INTO requests (request_id) SELECT toString(throwIf(number = 3)) FROM numbers(9)")
                outcome.append("stored")
            except StoreError as e:
                outcome.append(f"refused {e.code}")

        other = threading.Thread(target=failing_insert)
        now = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()).encode()  # inside the table's TTL

        def chunks():
            yield b"('a', '" + now + b"')"
            other.start()
            other.join(timeout=5)  # ends here only if it could run beside this insert
            yield b",('b', '" + now + b"')"

        rows = store.insert_stream(f"INSERT INTO {store.database}.requests (request_id, arrival_time)", "Values",
                                   chunks())
        other.join(timeout=120)
        assert rows == 2
        assert outcome == ["refused 395"]  # FUNCTION_THROW_IF_VALUE_IS_NON_ZERO
        assert store.query_df("SELECT count() AS n FROM requests WHERE request_id IN ('a', 'b')")["n"][0] == 2
