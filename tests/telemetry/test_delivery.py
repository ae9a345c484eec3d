"""Delivery: every batch is stored exactly once, whatever path it took; every loss is counted and said.

Against a real sidecar (clickhouse-connect -> the sidecar's ClickHouse HTTP endpoint -> chdb) and,
for the process-level guarantees, real `infersight serve` replicas on a tiny random Llama:
the sidecar killed (-9) mid-traffic, the sidecar away long enough to fill a small spool, a replica
restarted (SIGTERM) while the sidecar is away, a replica killed (-9). Rows are checked by request
id: each answered request stored once, nothing stored twice.
"""

from __future__ import annotations

import json
import logging
import shutil
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from delivery_processes import Replica, Traffic, stored_request_ids, wait_for
from telemetry import synthetic
from telemetry.batch_token import safe_replica_id
from telemetry.columnar import records_to_arrow
from telemetry.recorder import Recorder
from telemetry.sidecar.process import start_sidecar
from telemetry.spool import Spool, replica_spool_dir
from telemetry.store import StoreUnavailableError, open_store
from telemetry.store.remote import RemoteStore


def closed_port_url() -> str:
    """A loopback endpoint where nothing listens: a store that is down."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory, migrated_copy):
    process = start_sidecar(migrated_copy(tmp_path_factory.mktemp("delivery-store")))
    yield process
    process.stop()


def _ids(sidecar, replica_id: str) -> Counter:
    return Counter(stored_request_ids(sidecar.store_url, replica_id))


class AnswerLostStore(RemoteStore):
    """The sidecar over clickhouse-connect, whose first insert is stored but whose answer is then
    lost, as when the connection drops after the sidecar committed: the recorder must resend."""

    def __init__(self, url: str):
        super().__init__(url, connect_timeout=2, send_receive_timeout=30)
        self.answers_to_lose = 1

    def insert_arrow(self, table, data, dedup_token=None):
        rows = super().insert_arrow(table, data, dedup_token)
        if self.answers_to_lose:
            self.answers_to_lose -= 1
            raise StoreUnavailableError("connection reset after the insert was committed")
        return rows


def _re_formed(data: pa.Table) -> pa.Table:
    """The same rows as other bytes: columns and rows in reverse order, in three record batches."""
    shuffled = data.select(list(reversed(data.column_names))).take(list(reversed(range(data.num_rows))))
    return pa.Table.from_batches(shuffled.to_batches(max_chunksize=data.num_rows // 3 + 1))


# the token scheme ------------------------------------------------------------------------------

def test_a_token_is_the_batch_identity_and_never_repeats(tmp_path):
    a = Recorder(closed_port_url(), "rep/1", spool_dir=tmp_path / "a", flush_interval=3600)
    b = Recorder(closed_port_url(), "rep/1", spool_dir=tmp_path / "b", flush_interval=3600)
    try:
        token = a.batch_token("requests", 7)
        replica, start, table, seq = token.split(".")
        assert (replica, start, table, seq) == (safe_replica_id("rep/1"), str(a.run_start_us), "requests", "7")
        assert a.run_start_us != b.run_start_us  # two runs of one replica, even started together
        assert a.batch_token("requests", 1) != b.batch_token("requests", 1) != a.batch_token("steps", 1)
        # ids that only differ in characters a token cannot hold still get different tokens
        assert len({safe_replica_id(r) for r in ("rep/1", "rep_1", "rep.1", "rep 1", "x" * 60, "x" * 61)}) == 6
        for i in range(3):
            a.on_request_finished(synthetic.request(i, "rep/1"))
        a.flush()  # the store is down: spooled, with the token of batch 1
        (path,) = a.spool.files()
        assert a.spool.read(path).dedup_token == a.batch_token("requests", 1)
    finally:
        a.close()
        b.close()


def test_the_store_deduplicates_by_token_not_by_bytes(sidecar):
    """What the scheme relies on, measured on chdb through the sidecar: a token names the batch
    however it is encoded; without a token, the same rows re-formed are stored again; and a
    different batch under a used token is discarded, which is why tokens must never repeat."""
    data = records_to_arrow("requests", synthetic.records("requests", 20, replica_id="by-token"))
    with open_store(sidecar.store_url) as store:
        store.insert_arrow("requests", data, dedup_token="by-token.1.requests.1")
        store.insert_arrow("requests", _re_formed(data), dedup_token="by-token.1.requests.1")
        assert _ids(sidecar, "by-token") == Counter({f"by-token-req-{i}": 1 for i in range(20)})

        bare = records_to_arrow("requests", synthetic.records("requests", 20, replica_id="no-token"))
        store.insert_arrow("requests", bare, dedup_token="no-token.1.requests.1")
        store.insert_arrow("requests", _re_formed(bare))  # a replay that lost its token
        assert set(_ids(sidecar, "no-token").values()) == {2}

        other = records_to_arrow("requests", synthetic.records("requests", 5, replica_id="reused"))
        store.insert_arrow("requests", other, dedup_token="by-token.1.requests.1")
        assert _ids(sidecar, "reused") == Counter()


def test_a_replica_spools_in_the_same_directory_at_every_start(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert replica_spool_dir("r-1") == tmp_path / "state" / "infersight" / "spool" / "r-1" == replica_spool_dir("r-1")
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert replica_spool_dir("r-1") == tmp_path / "home" / ".local" / "state" / "infersight" / "spool" / "r-1"
    assert replica_spool_dir("../r-1").parent == replica_spool_dir("r-1").parent  # an id never leaves the folder


# every path a batch can take ------------------------------------------------------------------

def test_one_batch_is_stored_once_whatever_path_it_takes(sidecar, tmp_path):
    requests = synthetic.records("requests", 30, replica_id="paths")
    expected = Counter({r.request_id: 1 for r in requests})
    lossy = AnswerLostStore(sidecar.store_url)
    first = Recorder(lossy, "paths", spool_dir=tmp_path / "spool", flush_interval=3600)
    for r in requests:
        first.on_request_finished(r)
    first.flush()  # a direct insert: stored, but the answer is lost, so the batch goes to the spool
    assert first.stats()["requests"] == {"written": 0, "spooled": 30, "replayed": 0, "dropped": 0}
    assert _ids(sidecar, "paths") == expected
    (path,) = first.spool.files()
    batch = first.spool.read(path)
    assert batch.dedup_token == first.batch_token("requests", 1)
    shutil.copytree(tmp_path / "spool", tmp_path / "found-after-restart", ignore=shutil.ignore_patterns("run-*"))
    first.close()  # the retry: replayed from the spool under the batch's token
    lossy.close()
    assert first.stats()["requests"] == {"written": 30, "spooled": 30, "replayed": 30, "dropped": 0}
    assert _ids(sidecar, "paths") == expected

    restarted = Recorder(sidecar.store_url, "paths", spool_dir=tmp_path / "found-after-restart")
    restarted.close()  # a new process finds the spool file and replays it
    assert restarted.stats()["requests"]["replayed"] == 30 and restarted.spool.files() == []
    assert _ids(sidecar, "paths") == expected

    Spool(tmp_path / "re-formed").put("requests", _re_formed(batch.data), batch.dedup_token)
    re_formed = Recorder(sidecar.store_url, "paths", spool_dir=tmp_path / "re-formed")
    re_formed.close()  # the same rows encoded anew (another column and row order, other chunks)
    assert re_formed.stats()["requests"]["replayed"] == 30
    with open_store(sidecar.store_url) as store:  # and sent straight through clickhouse-connect
        store.insert_arrow("requests", _re_formed(batch.data), dedup_token=batch.dedup_token)
    assert _ids(sidecar, "paths") == expected


def test_a_spool_file_without_its_token_is_set_aside_not_stored(sidecar, tmp_path):
    data = records_to_arrow("requests", synthetic.records("requests", 4, replica_id="tokenless"))
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    with pa.OSFile(str(spool_dir / "00000000000000000001-1-000000-requests.arrow"), "wb") as sink:
        schema = data.schema.with_metadata({"table": "requests"})  # no dedup_token
        with pa.ipc.new_file(sink, schema) as writer:
            writer.write_table(data.replace_schema_metadata(schema.metadata))
    rec = Recorder(sidecar.store_url, "tokenless", spool_dir=spool_dir)
    rec.close()
    assert rec.spool.files() == [] and len(list((spool_dir / "unreadable").iterdir())) == 1
    assert _ids(sidecar, "tokenless") == Counter()


# a recorder killed with its buffer full ------------------------------------------------------------

KILLED_RECORDER = """
import sys, time
from telemetry import synthetic
from telemetry.recorder import Recorder
rec = Recorder(sys.argv[1], "killed", spool_dir=sys.argv[2], flush_interval=3600, checkpoint_interval=0.05,
               max_batch_rows=10**6)
for i in range(10):
    rec.on_request_finished(synthetic.request(i, "killed"))
rec.flush()  # the store is down: these ten go to the spool
for i in range(10, 35):
    rec.on_request_finished(synthetic.request(i, "killed"))
for i in range(7):
    rec.on_step(synthetic.step(i, "killed"))
time.sleep(300)
"""


def _marker(spool_dir) -> dict:
    markers = list(spool_dir.glob("run-*.json"))
    try:
        return json.loads(markers[0].read_text()) if len(markers) == 1 else {}
    except (OSError, ValueError):  # not there yet
        return {}


def test_a_killed_recorder_is_reported_and_its_buffer_counted_by_the_next_start(sidecar, tmp_path, caplog):
    spool_dir = tmp_path / "spool"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_RECORDER, closed_port_url(), str(spool_dir)])
    try:
        wait_for(lambda: _marker(spool_dir).get("buffered") == {"requests": 25, "steps": 7}, 60,
                 "the recorder's marker shows what it holds in memory")
        assert len(list(spool_dir.glob("*.arrow"))) == 1
    finally:
        proc.kill()  # kill -9: no final flush
        proc.wait()

    # while a recorder lives, its marker is its own: another one on the directory leaves it alone
    with caplog.at_level(logging.WARNING, logger="telemetry.recorder"):
        rec = Recorder(sidecar.store_url, "killed", spool_dir=spool_dir)
        bystander = Recorder(closed_port_url(), "killed", spool_dir=spool_dir, flush_interval=3600)
        rec.close()
        bystander.close()
    assert len(rec.abandoned_runs) == 1 and bystander.abandoned_runs == []
    stats = rec.stats()
    assert (stats["requests"]["dropped"], stats["steps"]["dropped"]) == (25, 7)  # lost with the process, counted
    assert stats["requests"]["replayed"] == 10  # what it had spooled arrives
    assert "ended without its final flush" in caplog.text and "32 rows it held only in memory" in caplog.text
    assert _ids(sidecar, "killed") == Counter({f"killed-req-{i}": 1 for i in range(10)})
    assert list(spool_dir.glob("run-*.json")) == []
    again = Recorder(sidecar.store_url, "killed", spool_dir=spool_dir)
    again.close()
    assert again.abandoned_runs == [] and again.stats()["requests"]["dropped"] == 0  # reported once


# a journaling recorder killed mid-insert -------------------------------------------------------------

JOURNALED_RECORDER = """
import sys, threading, time
from telemetry import synthetic
from telemetry.recorder import Recorder
from telemetry.store.remote import RemoteStore

class StoresThenHangs(RemoteStore):  # the insert arrives, then the recorder never hears back
    hang = False
    def insert_arrow(self, table, data, dedup_token=None):
        rows = super().insert_arrow(table, data, dedup_token)
        if self.hang:
            print("stored, answer pending", flush=True)
            time.sleep(300)
        return rows

store = StoresThenHangs(sys.argv[1], connect_timeout=2, send_receive_timeout=30)
replica = sys.argv[3]
rec = Recorder(store, replica, spool_dir=sys.argv[2], flush_interval=3600, checkpoint_interval=3600, journal=True)
for i in range(10):
    rec.on_request_finished(synthetic.request(i, replica))
rec.flush()  # batch 1: stored and confirmed
store.hang = True
for i in range(10, 20):
    rec.on_request_finished(synthetic.request(i, replica))
threading.Thread(target=rec.flush, daemon=True).start()  # batch 2: stored, its answer never comes
while sys.stdin.readline().strip() != "go":
    pass
for i in range(20, 35):  # answered by the server after it synced the journal; in memory only otherwise
    rec.on_request_finished(synthetic.request(i, replica))
rec.sync_journal()
print("journaled", flush=True)
time.sleep(300)
"""


def test_a_killed_journaling_recorder_loses_nothing_it_journaled_and_stores_nothing_twice(sidecar, tmp_path, caplog):
    spool_dir = tmp_path / "spool"
    proc = subprocess.Popen([sys.executable, "-c", JOURNALED_RECORDER, sidecar.store_url, str(spool_dir),
                             "journaled"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "stored, answer pending"
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "journaled"
        assert _marker(spool_dir)["journal"] == {"journaled": 20, "appended": 20}  # its last checkpoint: behind
    finally:
        proc.kill()  # kill -9: batch 2 stored but unconfirmed, 15 records only in memory and the journal
        proc.wait()
    assert _ids(sidecar, "journaled") == Counter({f"journaled-req-{i}": 1 for i in range(20)})

    with caplog.at_level(logging.WARNING, logger="telemetry.recorder"):
        rec = Recorder(sidecar.store_url, "journaled", spool_dir=spool_dir)
        rec.close()
    assert "10 requests rows it had sent or spooled without confirmation" in caplog.text
    assert "15 it had not sent yet" in caplog.text
    assert rec.stats()["requests"]["dropped"] == 0
    assert _ids(sidecar, "journaled") == Counter({f"journaled-req-{i}": 1 for i in range(35)})  # batch 2 once
    assert list(spool_dir.glob("journal-*")) == [] and list(spool_dir.glob("*.arrow")) == []
    with open_store(sidecar.store_url) as store:  # a journaled record comes back as it was recorded
        row = store.query_df("SELECT prompt_token_ids, output_token_ids, token_times, e2e_seconds, prompt_text_hash "
                             "FROM requests WHERE request_id = 'journaled-req-27'").iloc[0]
    original = synthetic.request(27, "journaled")
    assert list(row["prompt_token_ids"]) == original.prompt_token_ids
    assert list(row["output_token_ids"]) == original.output_token_ids
    assert list(row["token_times"]) == pytest.approx(original.token_times, rel=1e-6)  # Float32 in the store
    assert row["e2e_seconds"] == original.e2e_seconds and row["prompt_text_hash"] == original.prompt_text_hash


def test_what_the_engine_handed_over_and_the_journal_never_got_is_counted_exactly(sidecar, tmp_path):
    spool_dir = tmp_path / "spool"
    proc = subprocess.Popen([sys.executable, "-c", JOURNALED_RECORDER, sidecar.store_url, str(spool_dir), "counted"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "stored, answer pending"
    finally:
        proc.kill()
        proc.wait()
    (marker,) = spool_dir.glob("run-*.json")  # as if its last checkpoint had seen 3 more not yet journaled
    state = json.loads(marker.read_text())
    state["journal"]["appended"] += 3
    marker.write_text(json.dumps(state))
    rec = Recorder(sidecar.store_url, "counted", spool_dir=spool_dir)
    rec.close()
    assert rec.stats()["requests"]["dropped"] == 3
    assert _ids(sidecar, "counted") == Counter({f"counted-req-{i}": 1 for i in range(20)})


def test_the_journal_keeps_only_what_is_not_yet_done(tmp_path):
    rec = Recorder(closed_port_url(), "segments", spool_dir=tmp_path, flush_interval=3600, checkpoint_interval=3600,
                   journal=True, max_batch_rows=4)
    rec._journal._segment_bytes = 1  # a new segment after every batch
    try:
        for i in range(10):
            rec.on_request_finished(synthetic.request(i, "segments"))
        rec.flush()  # three batches, spooled (the store is down): done
        assert len(list(tmp_path.glob("journal-*"))) == 1  # only the open segment: every record in it is done
        for i in range(10, 13):
            rec.on_request_finished(synthetic.request(i, "segments"))
        rec.sync_journal()
        assert rec.pending_rows() == 3 and rec.stats()["requests"]["spooled"] == 10
    finally:
        rec.close()
    assert list(tmp_path.glob("journal-*")) == []  # a clean close leaves nothing to recover


@pytest.mark.parametrize("store_text", [False, True])
def test_the_journal_holds_text_only_where_the_store_may(tmp_path, store_text):
    rec = Recorder(closed_port_url(), "redact", spool_dir=tmp_path, flush_interval=3600, checkpoint_interval=3600,
                   journal=True, store_text=store_text)
    try:
        request = synthetic.request(0, "redact")
        request.prompt_text, request.output_text = "a secret prompt", "a secret answer"
        rec.on_request_finished(request)
        rec.sync_journal()
        journal = "".join(p.read_text() for p in tmp_path.glob("journal-*"))
        assert "redact-req-0" in journal and request.prompt_text_hash in journal
        assert ("a secret prompt" in journal, "a secret answer" in journal) == (store_text, store_text)
    finally:
        rec.close()


def test_a_journal_written_by_an_older_version_is_recovered_by_name(sidecar, tmp_path):
    """The journal names its columns: a column this version added gets the record's default, one
    it dropped is ignored, whatever the order."""
    request = synthetic.request(0, "older")
    values = {f: getattr(request, f) for f in ("replica_id", "request_id", "trace_id", "model_name", "workload",
                                               "arrival_time", "scheduled_time", "first_token_time", "finish_time",
                                               "queue_seconds", "prefill_seconds", "ttft_seconds", "e2e_seconds",
                                               "prompt_tokens", "output_tokens", "cached_tokens", "prompt_token_ids",
                                               "output_token_ids", "token_times", "sampling_params_json",
                                               "finish_reason")}
    values["a_column_since_dropped"] = 1
    columns = list(reversed(values))
    run = "older.1"
    (tmp_path / f"journal-{run}-00000000.jsonl").write_text(
        json.dumps({"h": 1, "first": 0, "k": 0, "columns": columns}) + "\n"
        + json.dumps({"r": [values[c] for c in columns]}) + "\n" + '{"r": [cut short')
    rec = Recorder(sidecar.store_url, "older", spool_dir=tmp_path)
    rec.close()
    assert rec.stats()["requests"] == {"written": 1, "spooled": 0, "replayed": 1, "dropped": 0}
    assert _ids(sidecar, "older") == Counter({"older-req-0": 1})


def test_a_full_spool_logs_and_counts_its_drops(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="telemetry.recorder"):
        rec = Recorder(closed_port_url(), "full", spool_dir=tmp_path, flush_interval=3600, spool_max_bytes=1)
        rec.on_request_finished(synthetic.request(0, "full"))
        rec.close()
    assert rec.stats()["requests"]["dropped"] == 1
    assert "is full" in caplog.text and "1 telemetry rows dropped" in caplog.text


# real replicas ------------------------------------------------------------------------------------

REFERENCE_MODEL = Path(__file__).resolve().parents[2] / "evals" / "reference" / "models" / "target"


def _restart_after_kill(model, sidecar, replica_id: str, spool_dir, log_path) -> tuple[int, Counter]:
    """A new replica on a killed one's spool directory, stopped cleanly: (the requests rows it
    counted as lost by the killed run, the rows stored then)."""
    replica = Replica(model, sidecar.store_url, replica_id, spool_dir, log_path)
    try:
        assert "ended without its final flush" in replica.log()
        counted = replica.counters().get("dropped", {}).get("requests", 0)
        assert replica.stop() == 0
    finally:
        replica.kill()
    return counted, _ids(sidecar, replica_id)


@pytest.mark.slow
def test_a_replica_killed_mid_traffic_loses_no_answered_request(tmp_path):
    """kill -9 while three clients send: every request answered before the kill is stored once after
    the restart on the same spool directory; a request in flight at the kill is stored or counted."""
    sidecar = start_sidecar(tmp_path / "store")
    spool_dir = tmp_path / "spool"
    first = Replica(REFERENCE_MODEL, sidecar.store_url, "kill-d", spool_dir, tmp_path / "first.log")
    clients = []
    try:
        clients = [Traffic(first, f"kill-d-{c}") for c in range(3)]
        wait_for(lambda: stored_request_ids(sidecar.store_url, "kill-d"), 120, "the first rows stored")
        seen = sum(len(c.answered) for c in clients)
        wait_for(lambda: sum(len(c.answered) for c in clients) >= seen + 10, 120, "more requests answered")
        first.kill()  # between flushes: answered requests the recorder held only in memory
        answered = [rid for c in clients for rid in c.stop()]
        unanswered = {rid for c in clients for rid in c.refused}
        before_restart = _ids(sidecar, "kill-d")
        counted, stored = _restart_after_kill(REFERENCE_MODEL, sidecar, "kill-d", spool_dir, tmp_path / "second.log")
    finally:
        for c in clients:
            c.stop()
        first.kill()
        sidecar.stop()
    assert set(answered) - set(before_restart), "the kill should have caught answered requests in memory"
    assert set(stored.values()) == {1}, "nothing stored twice"
    assert set(answered) <= set(stored), f"answered and lost: {sorted(set(answered) - set(stored))}"
    in_flight = set(stored) - set(answered)
    assert in_flight <= unanswered  # stored without an answer: finished at the kill, the response cut off
    assert len(in_flight) + counted <= len(clients)  # one request in flight per client at most

@pytest.mark.slow
def test_sidecar_killed_mid_traffic_every_answered_request_stored_once(tiny_llama, tmp_path):
    sidecar = start_sidecar(tmp_path / "store")
    replica = Replica(tiny_llama, sidecar.store_url, "crash-a", tmp_path / "spool", tmp_path / "replica.log")
    traffic = None
    try:
        traffic = Traffic(replica, "crash-a")
        wait_for(lambda: stored_request_ids(sidecar.store_url, "crash-a"), 60, "the first rows stored")
        sidecar.kill()  # kill -9, while requests keep coming and the recorder may be mid-insert
        wait_for(lambda: replica.counters().get("spooled", {}).get("requests", 0) > 0, 60,
                 "the replica spools while the sidecar is down")
        sidecar = start_sidecar(tmp_path / "store", port=sidecar.port)
        seen = len(traffic.answered)
        wait_for(lambda: len(traffic.answered) >= seen + 10, 60, "more requests answered after the restart")
        answered = traffic.stop()
        assert traffic.refused == {}
        assert replica.stop() == 0  # drain and final flush
        stored = wait_for(lambda: (ids := _ids(sidecar, "crash-a")) and sum(ids.values()) >= len(answered) and ids,
                          60, "every answered request in the store")
    finally:
        if traffic is not None:
            traffic.stop()
        replica.kill()
        sidecar.stop()
    assert stored == Counter({rid: 1 for rid in answered}), "each answered request stored exactly once"


@pytest.mark.slow
def test_a_small_spool_fills_its_drops_are_exported_and_the_rest_arrives_once(tiny_llama, tmp_path):
    sidecar = start_sidecar(tmp_path / "store")
    replica = Replica(tiny_llama, sidecar.store_url, "full-b", tmp_path / "spool", tmp_path / "replica.log",
                      "--spool-max-bytes", "40KiB")
    answered: list[str] = []
    try:
        answered += replica.send([f"full-b-up-{i}" for i in range(3)])
        sidecar.stop()  # unreachable from here on
        settled = lambda: sum(replica.counters().get(k, {}).get("requests", 0)  # noqa: E731
                              for k in ("written", "spooled", "dropped"))
        for wave in range(12):  # bounded: until the spool refuses a batch of requests
            answered += replica.send([f"full-b-{wave}-{i}" for i in range(4)])
            wait_for(lambda: settled() == len(answered), 30, "the wave's rows flushed (stored, spooled or dropped)")
            if replica.counters().get("dropped", {}).get("requests", 0) > 0:
                break
        dropped = replica.counters()["dropped"]["requests"]
        assert dropped > 0, "the spool should have filled"
        sidecar = start_sidecar(tmp_path / "store", port=sidecar.port)
        counts = wait_for(lambda: (c := replica.counters()) and all(
            c["replayed"].get(t, 0) == c["spooled"].get(t, 0) for t in c["spooled"]) and c, 90,
            "everything spooled replayed")
        assert counts["dropped"]["requests"] == dropped  # nothing more lost once the store is back
        assert counts["written"]["requests"] == len(answered) - dropped
        assert "is full" in replica.log() and "telemetry rows dropped" in replica.log()
        assert replica.stop() == 0
        stored = _ids(sidecar, "full-b")
    finally:
        replica.kill()
        sidecar.stop()
    assert set(stored.values()) == {1} and set(stored) <= set(answered)
    assert sum(stored.values()) == len(answered) - dropped


@pytest.mark.slow
def test_a_replica_restarted_while_the_sidecar_is_down_delivers_its_spool(tiny_llama, tmp_path):
    sidecar = start_sidecar(tmp_path / "store")
    spool_dir = tmp_path / "spool"
    first = Replica(tiny_llama, sidecar.store_url, "restart-c", spool_dir, tmp_path / "first.log")
    second = None
    try:
        sidecar.stop()
        answered = first.send([f"restart-c-{i}" for i in range(10)])
        assert first.stop() == 0  # graceful: the final flush goes to the spool
        assert list(spool_dir.glob("*.arrow")) and "stay spooled" in first.log()
        second = Replica(tiny_llama, sidecar.store_url, "restart-c", spool_dir, tmp_path / "second.log")
        sidecar = start_sidecar(tmp_path / "store", port=sidecar.port)
        stored = wait_for(lambda: (ids := _ids(sidecar, "restart-c")) and sum(ids.values()) >= len(answered) and ids,
                          90, "the first process's spooled rows replayed by the second")
        assert stored == Counter({rid: 1 for rid in answered})
        wait_for(lambda: not list(spool_dir.glob("*.arrow")), 60, "the spool emptied")

        # kill -9 right after the answers: what the second process held in memory is in its request
        # journal, and the next start stores it
        more = second.send([f"restart-c-killed-{i}" for i in range(6)])
        second.kill()
        counted, after_kill = _restart_after_kill(tiny_llama, sidecar, "restart-c", spool_dir, tmp_path / "third.log")
    finally:
        for replica in (first, second):
            if replica is not None:
                replica.kill()
        sidecar.stop()
    assert set(after_kill.values()) == {1}  # still nothing twice
    assert set(more) <= set(after_kill) and counted == 0  # every answered request stored, nothing lost
