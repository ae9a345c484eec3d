"""The embedded store: parameter binding, errors, concurrency, one process per data directory.
(The remote store, clickhouse-connect over HTTP, is tested against the sidecar in test_sidecar_http.py.)"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pandas as pd
import pytest

from telemetry import synthetic
from telemetry.store import StoreError, StoreLockedError, open_store


def test_parameters_are_bound_server_side_never_spliced(store):
    hostile = "x'); DROP TABLE requests; --\n\t\\"
    df = store.query_df("SELECT {s:String} AS s, {n:UInt32} + 1 AS n, {ids:Array(UInt32)} AS ids",
                        {"s": hostile, "n": 41, "ids": [1, 2, 3]})
    assert df["s"][0] == hostile and df["n"][0] == 42 and list(df["ids"][0]) == [1, 2, 3]
    assert store.command("EXISTS TABLE requests").strip() == "1"


def test_a_bad_parameter_value_is_a_clear_error(store):
    with pytest.raises(StoreError) as e:
        store.query_df("SELECT {n:UInt32} AS n", {"n": "not a number"})
    assert e.value.code == 457 and "BAD_QUERY_PARAMETER" in str(e.value)


def test_bad_sql_raises_store_error_with_the_clickhouse_code(store):
    with pytest.raises(StoreError) as e:
        store.query_df("SELECT (1 +")
    assert e.value.code == 62 and e.value.permanent
    with pytest.raises(StoreError) as e:
        store.query_df("SELECT * FROM no_such_table")
    assert e.value.code == 60
    assert store.query_df("SELECT 1 AS one")["one"][0] == 1  # and the store keeps working


def test_query_df_and_arrow_types(store):
    store.insert_records("requests", synthetic.records("requests", 2, replica_id="types"))
    df = store.query_df("SELECT arrival_time, prompt_token_ids, token_times FROM requests "
                        "WHERE replica_id = {r:String} ORDER BY request_id", {"r": "types"})
    assert isinstance(df, pd.DataFrame) and len(df) == 2
    assert str(df["arrival_time"].dt.tz) == "UTC"
    assert list(df["prompt_token_ids"][0]) == synthetic.request(0, "types").prompt_token_ids
    table = store.query_arrow("SELECT output_token_ids FROM requests WHERE replica_id = {r:String}", {"r": "types"})
    assert str(table.schema.field("output_token_ids").type) == "list<item: uint32 not null>"


def test_insert_records_checks_the_record_type(store):
    with pytest.raises(TypeError, match="RequestRecord"):
        store.insert_records("requests", synthetic.records("steps", 1))
    with pytest.raises(ValueError, match="unknown table"):
        store.insert_records("nope", synthetic.records("steps", 1))


def test_out_of_range_values_are_refused_with_the_column_named(store):
    bad = synthetic.step(0, "bad")
    bad.num_seqs = -1
    with pytest.raises(ValueError, match="steps.num_seqs"):
        store.insert_records("steps", [bad])


def test_concurrent_writers_and_readers(store):
    errors = []

    def writer(w):
        try:
            for b in range(5):
                store.insert_records("steps", synthetic.records("steps", 50, replica_id=f"cw-{w}"),
                                     dedup_token=f"cw-{w}-{b}")
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    def reader():
        try:
            for _ in range(10):
                store.query_df("SELECT replica_id, count() FROM steps GROUP BY replica_id")
        except Exception as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)] + [threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    n = store.query_df("SELECT count() AS n FROM steps WHERE startsWith(replica_id, 'cw-')")["n"][0]
    assert n == 4 * 5 * 50


def test_session_settings_apply_and_do_not_leak(store):
    with store.session({"max_threads": "3"}) as s:
        assert str(s.query("SELECT getSetting('max_threads')", "TSV")).strip() == "3"
    for _ in range(4):  # every pooled session is back to the default
        with store.session() as s:
            assert str(s.query("SELECT getSetting('max_threads')", "TSV")).strip() != "3"


def test_readonly_sessions_refuse_writes(store):
    assert store.execute("SELECT count() FROM steps", readonly=True).bytes()
    with pytest.raises(StoreError) as e:
        store.execute("DROP TABLE steps", readonly=True)
    assert e.value.code == 164
    assert store.command("EXISTS TABLE steps").strip() == "1"


def test_same_directory_twice_in_one_process_is_shared(store):
    with open_store(store.path) as again:
        assert again.query_df("SELECT 1 AS x")["x"][0] == 1
    assert store.query_df("SELECT 2 AS x")["x"][0] == 2  # closing the second handle left the first working


def test_another_process_gets_a_clear_error(store):
    code = textwrap.dedent(f"""
        from telemetry.store import open_store, StoreLockedError
        try:
            open_store({store.path!r})
        except StoreLockedError as e:
            print("LOCKED", e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "LOCKED" in out.stdout, out.stderr
    assert f"pid " in out.stdout and "one process per data directory" in out.stdout


def test_locked_error_type():
    assert issubclass(StoreLockedError, StoreError)


def test_lock_is_released_on_close(store):  # last: it closes the module's store
    store.close()
    code = (f"from telemetry.store import open_store\n"
            f"print(open_store({store.path!r}).query_df('SELECT 7 AS x')['x'][0])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "7", out.stderr
