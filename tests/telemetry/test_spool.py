"""The disk spool: batches keep their table and dedup token, the size bound holds, crashes leave no half files."""

from __future__ import annotations

import pyarrow as pa

from telemetry import synthetic
from telemetry.columnar import records_to_arrow
from telemetry.spool import Spool


def _batch(n=50):
    return records_to_arrow("requests", synthetic.records("requests", n, replica_id="spool"))


def test_a_batch_comes_back_with_its_table_and_token(tmp_path):
    spool = Spool(tmp_path)
    data = _batch()
    assert spool.put("requests", data, "r0.abc.requests.7")
    (path,) = spool.files()
    batch = spool.read(path)
    assert batch.table == "requests" and batch.dedup_token == "r0.abc.requests.7"
    assert batch.data.equals(data) and batch.data.schema.metadata is None
    spool.remove(path)
    assert spool.files() == [] and spool.size_bytes == 0


def test_the_size_bound_refuses_and_writes_nothing(tmp_path):
    one = Spool(tmp_path / "probe")
    assert one.put("requests", _batch(), "t")
    size = one.size_bytes
    spool = Spool(tmp_path / "bounded", max_bytes=int(size * 2.5))
    assert spool.put("requests", _batch(), "t1") and spool.put("requests", _batch(), "t2")
    assert not spool.put("requests", _batch(), "t3")
    assert len(spool.files()) == 2 and spool.size_bytes <= spool.max_bytes


def test_files_come_oldest_first_and_survive_a_new_process(tmp_path):
    spool = Spool(tmp_path)
    for i in range(5):
        spool.put("steps", records_to_arrow("steps", [synthetic.step(i)]), f"tok-{i}")
    (tmp_path / "half-written.tmp").write_bytes(b"partial")  # a crash mid-write
    reopened = Spool(tmp_path)
    assert [reopened.read(p).dedup_token for p in reopened.files()] == [f"tok-{i}" for i in range(5)]
    assert not list(tmp_path.glob("*.tmp"))
    assert reopened.size_bytes == spool.size_bytes


def test_unreadable_files_are_moved_aside(tmp_path):
    spool = Spool(tmp_path)
    spool.put("steps", records_to_arrow("steps", [synthetic.step(0)]), "tok")
    (path,) = spool.files()
    path.write_bytes(b"not arrow")
    try:
        spool.read(path)
        raise AssertionError("expected an error")
    except (pa.ArrowException, OSError):
        spool.quarantine(path)
    assert spool.files() == [] and (tmp_path / "unreadable" / path.name).exists()
