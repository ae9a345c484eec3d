"""The sidecar's ClickHouse HTTP endpoint, tested with what really talks to it: clickhouse-connect
(the recorder's and dashboards' client) and plain HTTP requests as curl and Grafana send them,
against a real sidecar process."""

from __future__ import annotations

import datetime
import gzip
import json
import socket
import threading
import time

import clickhouse_connect
import httpx
import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

from telemetry import synthetic
from telemetry.columnar import records_to_arrow
from telemetry.contract.records import StepRecord, record_fields
from telemetry.sidecar.process import start_sidecar
from telemetry.store import StoreError, open_store

ADMIN, READER = ("admin", "s3cret:pw"), ("grafana", "read-only")


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory):
    handle = start_sidecar(tmp_path_factory.mktemp("sidecar"), user=ADMIN[0], password=ADMIN[1],
                           readonly_user=READER[0], readonly_password=READER[1],
                           extra_args=("--max-body-mb", "4", "--finding-active-window", "600",
                                       "--query-timeout", "2", "--max-result-mb", "1"))
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def client(sidecar):
    c = clickhouse_connect.get_client(host="127.0.0.1", port=sidecar.port, username=ADMIN[0], password=ADMIN[1])
    yield c
    c.close()


@pytest.fixture(scope="module")
def http(sidecar):
    with httpx.Client(base_url=sidecar.url, auth=ADMIN, timeout=30) as h:
        yield h


def test_ping_needs_no_credentials(sidecar):
    r = httpx.get(f"{sidecar.url}/ping")
    assert r.status_code == 200 and r.text == "Ok.\n"


# clickhouse-connect --------------------------------------------------------------------------------

def test_clickhouse_connect_queries_in_native_and_arrow(client):
    assert client.server_version.count(".") >= 2
    row = client.query("SELECT toLowCardinality('ab') AS lc, [1, 2]::Array(UInt32) AS ids, "
                       "toDateTime64('2026-01-02 03:04:05.123456', 6, 'UTC') AS t").result_rows[0]
    assert row[0] == "ab" and row[1] == [1, 2] and row[2].microsecond == 123456
    assert client.query_arrow("SELECT number FROM numbers(5)").column("number").to_pylist() == [0, 1, 2, 3, 4]
    assert list(client.query_df("SELECT number AS n FROM numbers(3)")["n"]) == [0, 1, 2]


def test_clickhouse_connect_binds_parameters_server_side(client):
    hostile = "x'); DROP TABLE requests; --\n\\"
    result = client.query("SELECT {s:String} AS s, {n:UInt32} * 2 AS n", parameters={"s": hostile, "n": 21})
    assert result.result_rows == [(hostile, 42)]
    assert client.command("EXISTS TABLE requests") == 1


def test_parameters_too_long_for_a_url_come_as_a_form_and_are_bound(client, http):
    """clickhouse-connect sends bound parameters over 4 KiB as a multipart/form-data body (query and
    param_* fields); the sidecar read that body as SQL and answered a syntax error."""
    ids = [f"probe.p1764601234567.probe_number_{i}.solo.r{i % 3}" for i in range(300)]
    result = client.query("SELECT length({ids:Array(String)}) AS n, {ids:Array(String)}[300] AS last",
                          parameters={"ids": ids})
    assert result.result_rows == [(300, ids[-1])]
    # urlencoded forms too (curl --data-urlencode), with a setting among the fields
    form = {"query": "SELECT {n:UInt32} + 1 AS x FORMAT TabSeparated", "param_n": "41", "max_threads": "1"}
    assert http.post("/", data=form).text == "42\n"
    # an external-table file part is refused with a reason, never run as SQL or ignored
    refused = http.post("/", files={"query": (None, "SELECT 1"), "ext": ("t.tsv", b"1\n", "text/plain")})
    assert refused.status_code == 400 and "external tables are not supported" in refused.text
    broken = http.post("/", content=b"--nope\r\n", headers={"Content-Type": "multipart/form-data; boundary=x"})
    assert broken.status_code == 400 and "multipart" in broken.text


def test_clickhouse_connect_native_insert_compressed(client):
    now = datetime.datetime.now(datetime.timezone.utc)
    step = synthetic.step(7, "native")
    rows = [[getattr(step, name) for name in record_fields(StepRecord)]]
    rows[0][2] = now  # the Native writer takes datetimes for DateTime64
    summary = client.insert("steps", rows, column_names=record_fields(StepRecord))  # lz4-compressed body
    assert summary.written_rows == 1
    got = client.query("SELECT step_id, start_time FROM steps WHERE replica_id = 'native'").result_rows
    assert got[0][0] == 7 and abs(got[0][1].replace(tzinfo=datetime.timezone.utc) - now).total_seconds() < 1e-5


def test_clickhouse_connect_arrow_insert_with_dedup_token(client):
    data = records_to_arrow("requests", synthetic.records("requests", 20, replica_id="cc-arrow"))
    for _ in range(2):
        client.insert_arrow("requests", data, settings={"insert_deduplication_token": "cc-arrow-1"})
    assert client.command("SELECT count() FROM requests WHERE replica_id = 'cc-arrow'") == 20


def test_remote_store_through_the_sidecar(sidecar):
    with open_store(sidecar.store_url) as store:
        records = synthetic.records("requests", 30, replica_id="remote")
        store.insert_records("requests", records, dedup_token="remote-1")
        store.insert_records("requests", records, dedup_token="remote-1")  # a retry: stored once
        df = store.query_df("SELECT request_id, prompt_token_ids FROM requests WHERE replica_id = {r:String} "
                            "ORDER BY request_id", {"r": "remote"})
        assert len(df) == 30
        times = store.query_df("SELECT arrival_time FROM requests WHERE replica_id = 'remote' LIMIT 1")
        assert str(times["arrival_time"].dt.tz) == "UTC"  # as the embedded store returns them
        by_id = {r.request_id: r.prompt_token_ids for r in records}
        assert all(list(ids) == by_id[rid] for rid, ids in zip(df["request_id"], df["prompt_token_ids"]))
        with pytest.raises(StoreError) as e:
            store.query_df("SELECT * FROM no_such_table")
        assert e.value.code == 60


def test_remote_store_inserts_match_columns_by_name_not_position(sidecar):
    # RemoteStore's INSERT names no columns (they would go in the URL): Arrow's names place them
    records = synthetic.records("steps", 12, replica_id="by-name")
    data = records_to_arrow("steps", records)
    reordered = data.select(list(reversed(data.column_names)))
    with open_store(sidecar.store_url) as store:
        assert store.client.write_compression is None  # loopback: no compression by default
        assert store.insert_arrow("steps", reordered, dedup_token="by-name-1") == 12
        got = store.query_arrow("SELECT step_id, num_seqs, duration_seconds, phase FROM steps "
                                "WHERE replica_id = 'by-name' ORDER BY step_id").to_pylist()
    assert got == [{"step_id": r.step_id, "num_seqs": r.num_seqs, "duration_seconds": r.duration_seconds,
                    "phase": r.phase} for r in records]
    with open_store(sidecar.store_url + "?compress=lz4") as store:  # a remote ClickHouse may want it
        assert store.client.write_compression == "lz4"
        store.insert_arrow("steps", data, dedup_token="by-name-2")
        assert store.command("SELECT count() FROM steps WHERE replica_id = 'by-name'") == "24"


def test_wrong_password_and_no_credentials_are_refused(sidecar):
    with pytest.raises(Exception, match="516|Authentication failed"):
        clickhouse_connect.get_client(host="127.0.0.1", port=sidecar.port, username=ADMIN[0], password="wrong")
    r = httpx.post(sidecar.url, content="SELECT 1")
    assert r.status_code == 403 and r.headers["X-ClickHouse-Exception-Code"] == "516"


# curl / plain HTTP ---------------------------------------------------------------------------------

def test_get_with_query_param_and_post_body(http):
    r = http.get("/", params={"query": "SELECT 1 AS one FORMAT JSONEachRow"})
    assert r.status_code == 200 and r.json() == {"one": 1}
    assert r.headers["X-ClickHouse-Format"] == "JSONEachRow" and r.headers["X-ClickHouse-Query-Id"]
    r = http.post("/", content="SELECT number FROM numbers(3)")
    assert r.text == "0\n1\n2\n" and r.headers["Content-Type"].startswith("text/tab-separated-values")
    assert json.loads(r.headers["X-ClickHouse-Summary"])["read_rows"] == "3"


def test_query_parameters_settings_and_default_format(http):
    r = http.post("/", params={"param_n": "20", "param_s": "it's", "default_format": "JSONCompact"},
                  content="SELECT {n:UInt8} + 1 AS n, {s:String} AS s")
    assert r.json()["data"] == [[21, "it's"]]
    r = http.post("/", params={"max_threads": "1"}, content="SELECT getSetting('max_threads')")
    assert r.text.strip() == "1"  # max_threads may be lowered (never raised past the CPUs)
    r = http.post("/", content="SELECT getSetting('max_threads')")
    assert r.text.strip() != "1"  # settings are per request
    r = http.post("/", params={"no_such_setting": "1"}, content="SELECT 1")
    assert r.status_code == 400 and r.headers["X-ClickHouse-Exception-Code"] == "115"


def test_insert_with_query_in_url_and_data_in_a_chunked_body(http):
    def chunks():  # httpx sends a generator with Transfer-Encoding: chunked
        for i in range(5):
            yield f'{{"run_id":"chunked","item_id":"i{i}","suite":"s","task":"t","scorer":"x","score":1,' \
                  f'"reference":"","output_text":"","input_token_ids":[1,{i}],"output_token_ids":[],' \
                  f'"output_logprobs":[],"latency_seconds":0.5}}\n'.encode()

    r = http.post("/", params={"query": "INSERT INTO eval_items FORMAT JSONEachRow"}, content=chunks())
    assert r.status_code == 200, r.text
    assert json.loads(r.headers["X-ClickHouse-Summary"])["written_rows"] == "5"
    r = http.post("/", params={"default_format": "JSONEachRow"},
                  content="SELECT item_id, input_token_ids FROM eval_items WHERE run_id = 'chunked' ORDER BY item_id")
    assert [json.loads(line)["input_token_ids"] for line in r.text.splitlines()] == [[1, i] for i in range(5)]


def test_insert_with_query_heading_the_body_gzip(http):
    body = b"INSERT INTO eval_runs (run_id, suite, start_time, finish_time, accuracy) FORMAT CSV\n" \
           b"gz-run,arith,2026-01-01 00:00:00,2026-01-01 00:01:00,0.75\n"
    r = http.post("/", content=gzip.compress(body), headers={"Content-Encoding": "gzip"})
    assert r.status_code == 200, r.text
    r = http.post("/", content="SELECT accuracy FROM eval_runs WHERE run_id = 'gz-run'")
    assert r.text.strip() == "0.75"


@pytest.mark.parametrize("sql,status,code", [
    ("SELECT (1 +", 400, "62"),
    ("SELECT * FROM no_such_table", 404, "60"),
    ("SELECT 1; DROP TABLE requests", 400, "62"),  # one statement per request
    ("SELECT * FROM file('/etc/passwd', 'LineAsString')", 403, "497"),  # nothing outside the store
    ("SELECT * FROM url('http://127.0.0.1:1/', 'CSV')", 403, "497"),
    ("SELECT 1 INTO OUTFILE '/tmp/x.csv'", 403, "497"),
    ("", 400, "62"),
])
def test_errors_as_clickhouse_sends_them(http, sql, status, code):
    r = http.post("/", content=sql)
    assert r.status_code == status and r.headers["X-ClickHouse-Exception-Code"] == code
    assert r.text.startswith(f"Code: {code}. DB::Exception:") and "(version " in r.text
    assert http.post("/", content="EXISTS TABLE requests").text.strip() == "1"


def test_get_is_read_only(http):
    r = http.get("/", params={"query": "DROP TABLE steps"})
    assert r.status_code == 403 and r.headers["X-ClickHouse-Exception-Code"] == "164"


# the read-only user (dashboards) ----------------------------------------------------------------------

def test_readonly_user_reads_but_cannot_write(sidecar):
    with httpx.Client(base_url=sidecar.url, timeout=30, headers={"X-ClickHouse-User": READER[0],
                                                                   "X-ClickHouse-Key": READER[1]}) as h:
        for sql in ("SELECT count() FROM requests", "SHOW TABLES", "DESCRIBE TABLE steps", "EXISTS TABLE steps"):
            assert h.post("/", content=sql).status_code == 200, sql
        for sql in ("DROP TABLE steps", "CREATE TABLE x (a UInt8) ENGINE = Memory", "TRUNCATE TABLE steps",
                    "INSERT INTO eval_runs (run_id) VALUES ('ro')", "ALTER TABLE steps DELETE WHERE 1",
                    "OPTIMIZE TABLE steps"):
            r = h.post("/", content=sql)
            assert r.status_code == 403 and r.headers["X-ClickHouse-Exception-Code"] == "164", sql
        r = h.post("/", params={"query": "INSERT INTO eval_runs (run_id) FORMAT CSV"}, content=b"ro\n")
        assert r.status_code == 403 and r.headers["X-ClickHouse-Exception-Code"] == "164"
    ro = clickhouse_connect.get_client(host="127.0.0.1", port=sidecar.port, username=READER[0], password=READER[1])
    assert ro.query("SELECT 1").result_rows == [(1,)]
    with pytest.raises(DatabaseError, match="164|readonly"):
        ro.insert("eval_runs", [["ro-run"]], column_names=["run_id"])
    ro.close()


def test_grafana_style_requests(sidecar):
    # Grafana's ClickHouse data source: basic auth, default_format, metadata queries, a time filter
    with httpx.Client(base_url=sidecar.url, timeout=30, auth=READER) as h:
        assert h.post("/", content="SELECT version()").status_code == 200
        r = h.post("/", params={"default_format": "JSON"},
                   content="SELECT name FROM system.tables WHERE database = currentDatabase() ORDER BY name")
        assert "requests" in [row["name"] for row in r.json()["data"]]
        r = h.post("/", params={"param_from": "2020-01-01 00:00:00", "default_format": "JSON"},
                   content="SELECT toStartOfMinute(arrival_time) AS t, quantile(0.99)(ttft_seconds) AS p99 "
                           "FROM requests WHERE arrival_time >= {from:DateTime64(6)} GROUP BY t ORDER BY t")
        assert r.status_code == 200 and "data" in r.json()


# hostile and broken requests ------------------------------------------------------------------------------

def test_hostile_requests_get_errors_and_the_server_stays_up(sidecar, http):
    big = b"SELECT 1 -- " + b"x" * (5 << 20)
    r = http.post("/", content=big)
    assert r.status_code == 413
    r = http.post("/", content=b"\xff\xfe\x00garbage")
    assert r.status_code == 400
    r = http.post("/", params={"query": "INSERT INTO steps FORMAT Native"}, content=b"\x03\x01garbage-native")
    assert r.status_code >= 400 and r.headers.get("X-ClickHouse-Exception-Code")
    r = http.post("/", content=b"x" * 100, headers={"Content-Encoding": "zstd"})
    assert r.status_code == 400 and "zstd" in r.text
    r = http.post("/", content=b"x", headers={"Content-Encoding": "br"})
    assert r.status_code == 400 and "unsupported Content-Encoding" in r.text
    for garbage in (b"\x00\x01\x02 not http\r\n\r\n", b"POST / HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\nx",
                    b"GET /?" + b"a" * 100_000 + b" HTTP/1.1\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", sidecar.port), timeout=10) as raw:
            raw.sendall(garbage)
            raw.shutdown(socket.SHUT_WR)
            raw.recv(1024)  # an error response or a closed connection, not a crash
    assert http.get("/nope").status_code == 404
    assert http.post("/", params={"query_id": "\u00e9\u00e8 bad id"}, content="SELECT 1").status_code == 200
    assert httpx.get(f"{sidecar.url}/ping").text == "Ok.\n"
    assert sidecar.alive()


def test_runaway_queries_hit_the_limits_the_readonly_user_cannot_lift(sidecar, http):
    r = http.post("/", content="SELECT number FROM numbers(10000000)")
    assert r.status_code == 400 and r.headers["X-ClickHouse-Exception-Code"] == "396"  # result too large: a 4xx
    r = http.post("/", params={"max_result_bytes": "0"}, content="SELECT count() FROM numbers(1000000)")
    assert r.status_code == 403 and r.headers["X-ClickHouse-Exception-Code"] == "497"  # nor may the full user
    r = http.post("/", params={"max_result_bytes": "100"}, content="SELECT number FROM numbers(1000)")
    assert r.status_code == 400 and r.headers["X-ClickHouse-Exception-Code"] == "396"  # but it may lower one
    r = httpx.post(sidecar.url, auth=READER, params={"max_execution_time": "0"},
                   content="SELECT count() FROM numbers(100000000000)", timeout=60)
    assert r.status_code == 403 and r.headers["X-ClickHouse-Exception-Code"] == "164"  # readonly: no settings
    r = httpx.post(sidecar.url, auth=READER, content="SELECT count() FROM numbers(100000000000)", timeout=60)
    assert r.headers["X-ClickHouse-Exception-Code"] == "159"  # timeout: the read-only user cannot lift it
    assert httpx.get(f"{sidecar.url}/ping").text == "Ok.\n"


def test_concurrent_writers_and_readers(sidecar):
    errors = []

    def writer(w):
        try:
            with open_store(sidecar.store_url) as store:
                for b in range(4):
                    store.insert_records("steps", synthetic.records("steps", 100, replica_id=f"conc-{w}"),
                                         dedup_token=f"conc-{w}-{b}")
        except Exception as e:  # reported below
            errors.append(e)

    def reader():
        try:
            with httpx.Client(base_url=sidecar.url, auth=READER, timeout=60) as h:
                for _ in range(10):
                    r = h.post("/", content="SELECT replica_id, count() FROM steps GROUP BY replica_id")
                    assert r.status_code == 200
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)] + \
              [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    with open_store(sidecar.store_url) as store:
        n = store.query_df("SELECT count() AS n FROM steps WHERE startsWith(replica_id, 'conc-')")["n"][0]
    assert n == 4 * 4 * 100


# /metrics ---------------------------------------------------------------------------------------------------

def _samples(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name + "{")]


def test_metrics_export_requests_and_active_findings(sidecar):
    now = time.time()
    with open_store(sidecar.store_url) as store:
        store.insert_records("findings", [
            synthetic.finding("f-live", last_seen=now, severity="critical", kind="regression", subject="v2"),
            synthetic.finding("f-old", last_seen=now - 7200, severity="warning", kind="regression", subject="v1",
                              first_seen=now - 7300),
            synthetic.finding("f-upd", last_seen=now - 7200, severity="warning", kind="drift", subject="q",
                              first_seen=now - 7300),
        ])
        # f-upd seen again now: its latest version counts, even before any merge ran
        store.insert_records("findings", [synthetic.finding("f-upd", last_seen=now, severity="info", kind="drift",
                                                            subject="q", first_seen=now - 7300)])
    text = httpx.get(f"{sidecar.url}/metrics").text
    active = _samples(text, "infersight_finding_active")
    assert any('kind="regression"' in s and 'severity="critical"' in s and 'subject="v2"' in s
               and s.endswith(" 1.0") for s in active)
    assert not any('subject="v1"' in s for s in active)  # last seen two hours ago: not active
    assert [s for s in active if 'kind="drift"' in s] and all('severity="info"' in s
                                                              for s in active if 'kind="drift"' in s)
    levels = _samples(text, "infersight_finding_severity_level")
    assert any('subject="v2"' in s and s.endswith(" 2.0") for s in levels)
    assert any('kind="regression"' in s and 'severity="warning"' in s
               for s in _samples(text, "infersight_findings_total"))
    assert any('table="findings"' in s for s in _samples(text, "infersight_sidecar_insert_rows_total"))
    for name in ("infersight_sidecar_queries_total", "infersight_sidecar_errors_total",
                 "infersight_sidecar_request_duration_seconds_bucket"):
        assert _samples(text, name), name
    assert "_created" not in text  # no companion *_created series: they are off the metric contract
