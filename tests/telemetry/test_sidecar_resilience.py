"""The sidecar keeps serving under hostile or heavy load, and reports store damage loudly.

Real sidecar processes on loopback, attacked over raw sockets and driven with clickhouse-connect:
oversized and compression-bomb bodies, half-open and trickling connections, stalled bodies, slow
reads that fill every statement slot; then stores damaged on disk (a truncated part, random
bytes in a part, a deleted table's metadata). Loops are bounded in count and time; nothing here
asserts how fast anything is.
"""

from __future__ import annotations

import gzip
import os
import re
import socket
import threading
import time

import anyio
import clickhouse_connect
import httpx
import lz4.frame
import pytest

try:
    from compression import zstd
except ImportError:
    from backports import zstd

from hostile_clients import (
    MiB, basic_auth, compression_bomb, flood_body, open_idle_sockets, peak_rss_bytes, request_head, send_and_read,
    status_of, trickle_headers, wait_until_closed_by_server,
)
from telemetry import synthetic
from telemetry.sidecar.lanes import Busy, Lanes
from telemetry.sidecar.limits import Limits
from telemetry.sidecar.process import start_sidecar
from telemetry.store import open_store

ADMIN, READER = ("admin", "adm1n:pw"), ("grafana", "read-only")
BODY_LIMIT_MB, QUERY_SLOTS, MAX_CONNECTIONS = 4, 3, 64
INSERT_STEPS_TSV = "/?query=INSERT%20INTO%20steps%20FORMAT%20TabSeparated"
PART_NAME = re.compile(r"^\w+_\d+_\d+_\d+(_\d+)?$")  # partition_min_max_level[_mutation]


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory):
    handle = start_sidecar(tmp_path_factory.mktemp("resilience"), user=ADMIN[0], password=ADMIN[1],
                           readonly_user=READER[0], readonly_password=READER[1],
                           extra_args=("--max-body-mb", str(BODY_LIMIT_MB), "--query-slots", str(QUERY_SLOTS),
                                       "--max-connections", str(MAX_CONNECTIONS), "--header-timeout", "2",
                                       "--receive-timeout", "2", "--query-timeout", "60"))
    yield handle
    handle.kill()  # slow reads may still be sleeping: no need to wait for them


def _still_serving(sidecar) -> None:
    assert sidecar.alive()
    assert httpx.get(f"{sidecar.url}/ping", timeout=30).text == "Ok.\n"
    with open_store(sidecar.store_url) as store:
        assert store.command("SELECT 1").strip() == "1"


def _rejected(sidecar, reason: str) -> float:
    text = httpx.get(f"{sidecar.url}/metrics", timeout=30).text
    for line in text.splitlines():
        if line.startswith("infersight_sidecar_rejected_total{") and f'reason="{reason}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no infersight_sidecar_rejected_total sample for {reason}")


# bodies ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("who, path, status", [
    (None, "/", 403),  # a stranger: refused on its headers
    (("admin", "wrong"), "/", 403),
    (READER, "/", 413),  # statements are SQL text: 1 MiB at most
    (ADMIN, "/", 413),
    (ADMIN, INSERT_STEPS_TSV, 413),  # INSERT data: past --max-body-mb
])
def test_a_50_mb_body_is_refused_before_it_is_read(sidecar, who, path, status):
    headers = {"Content-Length": str(50 * MiB)}
    if who:
        headers["Authorization"] = basic_auth(*who)
    # only the first KiB of the 50 MB is ever sent: the answer comes without the rest
    response = send_and_read(sidecar.port, request_head(path, headers) + b"SELECT 1 -- " + b"x" * 1024)
    assert status_of(response) == status, response[:300]
    assert b"X-ClickHouse-Exception-Code" in response
    _still_serving(sidecar)


@pytest.mark.parametrize("path", ["/", INSERT_STEPS_TSV])
def test_a_chunked_50_mb_body_is_cut_off_past_its_limit(sidecar, path):
    head = request_head(path, {"Authorization": basic_auth(*ADMIN), "Transfer-Encoding": "chunked"})
    chunk = b"%x\r\n%s\r\n" % (64 << 10, b"x" * (64 << 10))
    sent, response = flood_body(sidecar.port, head + b"10\r\nSELECT 1 -- xxxx\r\n", chunk, 50 * MiB)
    assert status_of(response) == 413, response[:300]
    assert sent < 25 * MiB  # the server stopped reading long before the end
    _still_serving(sidecar)


@pytest.mark.parametrize("encoding, inflated", [("gzip", 256 * MiB), ("zstd", 1024 * MiB), ("lz4", 512 * MiB)])
def test_compression_bombs_are_refused_without_being_inflated(sidecar, encoding, inflated):
    bomb = compression_bomb(encoding, inflated)
    assert len(bomb) < BODY_LIMIT_MB * MiB  # small on the wire ...
    peak_before = peak_rss_bytes(sidecar.pid)
    with httpx.Client(base_url=sidecar.url, timeout=60) as h:
        as_insert = h.post(INSERT_STEPS_TSV, auth=ADMIN, content=bomb, headers={"Content-Encoding": encoding})
        as_statement = h.post("/", auth=READER, content=bomb, headers={"Content-Encoding": encoding})
    assert as_insert.status_code == 413 and "decompressed body exceeds" in as_insert.text
    assert as_statement.status_code == 413
    # ... huge inflated: the sidecar stopped at the limit instead of holding the whole of it
    assert peak_rss_bytes(sidecar.pid) - peak_before < inflated // 2
    _still_serving(sidecar)


@pytest.mark.parametrize("encoding", ["gzip", "zstd", "lz4"])
def test_a_body_of_several_compressed_members_is_inserted_whole(sidecar, encoding):
    compress = {"gzip": gzip.compress, "zstd": zstd.compress, "lz4": lz4.frame.compress}[encoding]
    now = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    rows = [f'{{"replica_id": "members-{encoding}", "step_id": {i}, "start_time": "{now}"}}\n'.encode()
            for i in range(4)]
    body = compress(b"".join(rows[:2])) + compress(b"".join(rows[2:]))  # as `cat a.gz b.gz` makes
    r = httpx.post(f"{sidecar.url}/?query=INSERT%20INTO%20steps%20FORMAT%20JSONEachRow", auth=ADMIN, content=body,
                   headers={"Content-Encoding": encoding}, timeout=60)
    assert r.status_code == 200, r.text
    with open_store(sidecar.store_url) as store:
        n = store.query_df(f"SELECT count() AS n FROM steps WHERE replica_id = 'members-{encoding}'")["n"][0]
    assert n == 4  # not only the first member's rows


def test_a_stalled_body_gets_408(sidecar):
    head = request_head("/", {"Authorization": basic_auth(*ADMIN), "Content-Length": "100"})
    response = send_and_read(sidecar.port, head + b"SELECT", timeout=60)
    assert status_of(response) == 408 and b"Code: 209" in response
    assert _rejected(sidecar, "receive_timeout") >= 1
    _still_serving(sidecar)


def test_a_body_cut_off_by_a_disconnect_is_never_inserted(sidecar):
    head = request_head("/?query=INSERT%20INTO%20steps%20FORMAT%20JSONEachRow",
                        {"Authorization": basic_auth(*ADMIN), "Content-Length": "1000"})
    before = _rejected(sidecar, "incomplete_body")
    now = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()).encode()  # (rows past the TTL are not stored)
    row = b'{"replica_id": "cut-off", "step_id": %d, "start_time": "%s"}\n'
    with socket.create_connection(("127.0.0.1", sidecar.port), timeout=10) as sock:
        sock.sendall(head + b"".join(row % (i, now) for i in range(3)))  # whole rows, then the client dies
    for _ in range(300):  # until the sidecar has seen the disconnect
        if _rejected(sidecar, "incomplete_body") > before:
            break
        time.sleep(0.05)
    assert _rejected(sidecar, "incomplete_body") > before
    with open_store(sidecar.store_url) as store:
        assert store.query_df("SELECT count() AS n FROM steps WHERE replica_id = 'cut-off'")["n"][0] == 0


# connections -------------------------------------------------------------------------------------

def test_half_open_sockets_do_not_lock_out_inserts_or_metrics(sidecar):
    idle = open_idle_sockets(sidecar.port, 4 * MAX_CONNECTIONS)  # far more than --max-connections
    try:
        with open_store(sidecar.store_url) as store:  # a replica connecting and writing, meanwhile
            store.insert_records("steps", synthetic.records("steps", 50, replica_id="half-open"))
            assert store.query_df("SELECT count() AS n FROM steps WHERE replica_id = 'half-open'")["n"][0] == 50
        assert httpx.get(f"{sidecar.url}/metrics", timeout=30).status_code == 200
        assert _rejected(sidecar, "too_many_connections") >= 4 * MAX_CONNECTIONS - MAX_CONNECTIONS
    finally:
        still_open = wait_until_closed_by_server(idle)
    assert still_open == []  # the survivors were closed at the header deadline
    assert _rejected(sidecar, "header_timeout") >= 1
    _still_serving(sidecar)


def test_a_trickling_request_is_cut_off_at_the_header_deadline(sidecar):
    sent, response = trickle_headers(sidecar.port, interval=0.1, max_bytes=600)
    assert sent < 600  # it kept sending bytes, and was cut off all the same
    assert status_of(response) == 408
    _still_serving(sidecar)


# capacity ----------------------------------------------------------------------------------------

def test_slow_reads_do_not_starve_inserts_or_metrics(sidecar):
    # ~13 s, and no SETTINGS clause (the read-only user may not send one); each sleep() call is
    # capped at 3 s, so five different ones
    slow_sql = "SELECT sleep(2.9) + sleep(2.8) + sleep(2.7) + sleep(2.6) + sleep(2.5)"
    results: list[httpx.Response] = []

    def slow_read():
        results.append(httpx.post(sidecar.url, auth=READER, content=slow_sql, timeout=120))

    readers = [threading.Thread(target=slow_read) for _ in range(2 * QUERY_SLOTS)]
    for t in readers:
        t.start()
    for _ in range(600):  # the reads past the slots are refused at once, not queued
        if len(results) >= QUERY_SLOTS:
            break
        time.sleep(0.05)
    refused = list(results)
    assert len(refused) == QUERY_SLOTS and all(r.status_code == 503 for r in refused), [r.text for r in refused]
    assert all(r.headers["Retry-After"] and r.headers["X-ClickHouse-Exception-Code"] == "202" for r in refused)

    # every slot is held by a slow read now: a replica connects (clickhouse-connect's handshake
    # runs statements), inserts, and Prometheus scrapes
    client = clickhouse_connect.get_client(host="127.0.0.1", port=sidecar.port, username=ADMIN[0],
                                           password=ADMIN[1])
    try:
        rows = synthetic.records("steps", 20, replica_id="beside-slow-reads")
        with open_store(sidecar.store_url) as store:
            store.insert_records("steps", rows)
        metrics = httpx.get(f"{sidecar.url}/metrics", timeout=30)
        assert metrics.status_code == 200 and "infersight_sidecar_queries_total" in metrics.text
        assert httpx.post(sidecar.url, auth=READER, content="SELECT 1").status_code == 503  # reads still full
        still_running = sum(t.is_alive() for t in readers)
        n = client.command("SELECT count() FROM steps WHERE replica_id = 'beside-slow-reads'")
    finally:
        client.close()
    assert still_running == QUERY_SLOTS  # all of that happened while the slow reads provably ran
    assert n == 20
    for t in readers:
        t.join(120)
    assert sorted(r.status_code for r in results) == [200] * QUERY_SLOTS + [503] * QUERY_SLOTS
    assert _rejected(sidecar, "queries_busy") >= QUERY_SLOTS + 1
    _still_serving(sidecar)


def test_lanes_bound_each_kind_of_work_on_its_own():
    """The bookkeeping the slow-read test relies on, and the insert queue's bound, in one event loop."""
    lanes = Lanes(Limits(query_slots=1, insert_threads=1, insert_queue=1, metrics_threads=1))
    release = threading.Event()
    outcomes: dict[str, list] = {}

    async def attempt(name, run, *args):
        try:
            outcomes.setdefault(name, []).append(await run(*args, release.wait, 60))
        except Busy as e:
            outcomes.setdefault(name, []).append(e)

    async def main():
        async with anyio.create_task_group() as tg:
            for _ in range(3):  # 1 runs, 1 waits for the thread, the third is refused
                tg.start_soon(attempt, "insert", lanes.run_insert)
            tg.start_soon(attempt, "readonly", lanes.run_statement, "readonly")
            tg.start_soon(attempt, "readonly", lanes.run_statement, "readonly")  # refused: one slot
            tg.start_soon(attempt, "full", lanes.run_statement, "full")  # its own slot: runs
            for _ in range(200):  # until every refusal has come back
                await anyio.sleep(0.01)
                if sum(isinstance(o, Busy) for v in outcomes.values() for o in v) == 2:
                    break
            release.set()

    anyio.run(main)
    assert sorted(map(type, outcomes["insert"]), key=str) == sorted([bool, bool, Busy], key=str)
    assert sorted(map(type, outcomes["readonly"]), key=str) == sorted([bool, Busy], key=str)
    assert outcomes["full"] == [True]


# store damage --------------------------------------------------------------------------------------

def _health(sidecar) -> httpx.Response:
    for _ in range(600):  # until the start-up check has read every table
        response = httpx.get(f"{sidecar.url}/health", timeout=30)
        if response.json()["full_check_done"]:
            return response
        time.sleep(0.1)
    raise AssertionError(f"the store check did not finish: {response.text}")


def _damage_gauges(sidecar) -> dict[str, float]:
    text = httpx.get(f"{sidecar.url}/metrics", timeout=30).text
    out = {}
    for line in text.splitlines():
        if line.startswith("infersight_sidecar_store_damage{"):
            table = line.split('table="', 1)[1].split('"', 1)[0]
            out[table] = float(line.rsplit(" ", 1)[1])
    return out


def _fill(sidecar) -> None:
    """One insert per table: one part per table (and day), so no merge moves the parts under us."""
    with open_store(sidecar.store_url) as store:
        for table in ("requests", "steps"):
            store.insert_records(table, synthetic.records(table, 300, replica_id="damage"))
        store.insert_records("findings", [synthetic.finding("f-damage")])


def _part_dirs(data_dir, table: str) -> list[str]:
    """The table's data parts on disk: store/<uuid prefix>/<uuid>/<part>, the UUID from its metadata."""
    metadata = (data_dir / "metadata" / "default" / f"{table}.sql").read_text()
    uuid = re.search(r"UUID '([0-9a-f-]{36})'", metadata).group(1)
    table_dir = data_dir / "store" / uuid[:3] / uuid
    return sorted(str(d) for d in table_dir.iterdir() if d.is_dir() and PART_NAME.match(d.name))


def test_a_clean_store_reports_no_damage(tmp_path):
    sidecar = start_sidecar(tmp_path / "store")
    try:
        _fill(sidecar)
        health = _health(sidecar)
        assert health.status_code == 200 and health.json() == {"status": "ok", "full_check_done": True,
                                                               "damage": [], "writes": {"failing": False}}
        gauges = _damage_gauges(sidecar)
        assert {"requests", "steps", "findings", "schema_migrations"} <= set(gauges)
        assert set(gauges.values()) == {0.0}
        assert "store damage" not in sidecar.output()
    finally:
        sidecar.stop()


def test_damage_on_disk_is_reported_on_health_metrics_and_log(tmp_path):
    data_dir = tmp_path / "store"
    sidecar = start_sidecar(data_dir)
    _fill(sidecar)
    sidecar.stop()
    truncated, scrambled = _part_dirs(data_dir, "requests")[0], _part_dirs(data_dir, "steps")[0]
    data_bin = os.path.join(truncated, "data.bin")
    os.truncate(data_bin, os.path.getsize(data_bin) // 2)
    data_bin = os.path.join(scrambled, "data.bin")
    with open(data_bin, "r+b") as f:
        f.seek(64)
        f.write(os.urandom(os.path.getsize(data_bin) - 128))
    os.remove(data_dir / "metadata" / "default" / "findings.sql")

    restarted = start_sidecar(data_dir)
    try:
        health = _health(restarted)
        report = health.json()
        assert health.status_code == 503 and report["status"] == "damaged", report
        by_table = {}
        for d in report["damage"]:
            by_table.setdefault(d["table"], []).append(d)
        truncated_name, scrambled_name = os.path.basename(truncated), os.path.basename(scrambled)
        assert any(d["kind"] == "detached_part" and truncated_name in d["part"] for d in by_table["requests"])
        assert any(scrambled_name in d["part"] for d in by_table["steps"])  # broken, or detached as broken
        assert [d["kind"] for d in by_table["findings"]] == ["missing_table"]
        assert not {"replicas", "eval_runs", "profiles"} & set(by_table)

        gauges = _damage_gauges(restarted)
        assert gauges["requests"] >= 1 and gauges["steps"] >= 1 and gauges["findings"] == 1
        assert gauges["replicas"] == 0 and gauges["eval_items"] == 0

        log = restarted.output()
        assert f"store damage: table requests, part {next(d['part'] for d in by_table['requests'])}" in log
        assert "store damage: table steps, part " in log and scrambled_name in log
        assert "store damage: table findings: missing_table" in log
        assert httpx.get(f"{restarted.url}/ping").text == "Ok.\n"  # liveness stays as ClickHouse's
        with open_store(restarted.url) as store:  # what is sound is still served
            assert store.query_df("SELECT count() AS n FROM replicas")["n"][0] == 0
    finally:
        restarted.stop()


def test_corruption_found_by_a_failing_read_is_reported(tmp_path):
    sidecar = start_sidecar(tmp_path / "store")
    try:
        _fill(sidecar)
        part = _part_dirs(tmp_path / "store", "requests")[0]
        assert _health(sidecar).status_code == 200
        data_bin = os.path.join(part, "data.bin")
        with open(data_bin, "r+b") as f:  # the disk goes bad under a running sidecar
            f.seek(64)
            f.write(os.urandom(os.path.getsize(data_bin) - 128))
        read = httpx.post(sidecar.url, content="SELECT * FROM requests FORMAT Null", timeout=60)
        assert read.status_code >= 400
        for _ in range(600):
            health = httpx.get(f"{sidecar.url}/health", timeout=30)
            if health.json()["status"] == "damaged":
                break
            time.sleep(0.1)
        assert health.status_code == 503
        name = os.path.basename(part)
        assert [(d["table"], d["part"]) for d in health.json()["damage"]] == [("requests", name)]
        assert f"store damage: table requests, part {name}" in sidecar.output()
    finally:
        sidecar.stop()
