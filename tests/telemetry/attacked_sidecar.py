"""The attacked sidecar the attack suites share: a real sidecar process with a writer and a
read-only user, a directory every file an attack names would land in (must stay empty), a
loopback listener every URL an attack names points at (must see no connection), and the
statements that reach outside the store, change it, or read what leaks."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest

from telemetry import synthetic
from telemetry.sidecar.process import start_sidecar
from telemetry.store import open_store

WRITER, READER = ("writer", "w-secret"), ("reader", "r-secret")
ROLES = {"writer": WRITER, "readonly": READER}
REFUSED = {"164", "497"}  # READONLY, ACCESS_DENIED: refused on the statement, before it runs


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """Where every file an attack names would go: must stay empty."""
    return tmp_path_factory.mktemp("attack_targets")


@pytest.fixture(scope="module")
def listener():
    """Where every URL an attack names points: must never see a connection."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.setblocking(False)
    yield sock
    sock.close()


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory, migrated_copy):
    handle = start_sidecar(migrated_copy(tmp_path_factory.mktemp("attacked_store")), user=WRITER[0], password=WRITER[1],
                           readonly_user=READER[0], readonly_password=READER[1],
                           extra_args=("--query-timeout", "2", "--max-result-mb", "1",
                                       "--max-query-memory-mb", "256"))
    with open_store(handle.store_url) as store:
        store.insert_records("steps", synthetic.records("steps", 20, replica_id="seed"), dedup_token="seed-steps")
    yield handle
    handle.stop()


@pytest.fixture(autouse=True)
def nothing_escaped(target, listener, sidecar):
    yield
    assert_nothing_escaped(target, listener, sidecar)


def assert_nothing_escaped(target, listener, sidecar) -> None:
    assert sorted(p.name for p in target.iterdir()) == [], "an attack wrote a file"
    assert not list(sidecar.data_dir.rglob("attack-*")), "an attack wrote into the data directory"
    assert not list(Path.cwd().glob("attack-*")), "an attack wrote into the sidecar's working directory"
    with pytest.raises(BlockingIOError):
        listener.accept()  # nobody connected to it
    assert_still_serving(sidecar)


def send(sidecar, sql: str, who: str, params: dict | None = None) -> httpx.Response:
    auth = {"anonymous": None, "wrong": (READER[0], "not-the-password")}.get(who, ROLES.get(who))
    return httpx.post(sidecar.url, content=sql.encode(), params=params or {}, auth=auth, timeout=60)


def assert_refused(r: httpx.Response, codes=REFUSED) -> None:
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    assert r.headers["X-ClickHouse-Exception-Code"] in codes, r.text
    assert r.text.startswith(f"Code: {r.headers['X-ClickHouse-Exception-Code']}. DB::Exception:"), r.text


def assert_still_serving(sidecar) -> None:
    assert httpx.get(f"{sidecar.url}/ping", timeout=10).text == "Ok.\n"
    r = send(sidecar, "SELECT count() FROM steps WHERE replica_id = 'seed'", "readonly")
    assert r.status_code == 200 and r.text == "20\n", r.text
    assert sidecar.alive()


def attacks(target, listener) -> dict[str, str]:
    """name -> statement: each reaches outside the store, or changes it, or reads what leaks."""
    port = listener.getsockname()[1]
    path = f"'{target}/attack-{{}}.csv'"
    url = f"'http://127.0.0.1:{port}/attack'"
    return {
        "the seen attack": f"SELECT 1 AS `a'`, 'x' INTO OUTFILE {path.format('seen')} TRUNCATE",
        "outfile": f"SELECT number FROM numbers(3) INTO OUTFILE {path.format('out')}",
        "outfile relative": "SELECT 1 INTO OUTFILE 'attack-relative.csv'",
        "outfile of show": f"SHOW TABLES INTO OUTFILE {path.format('show')}",
        "outfile of explain": f"EXPLAIN SELECT 1 INTO OUTFILE {path.format('explain')}",
        "infile": "INSERT INTO steps FROM INFILE '/etc/hostname' FORMAT LineAsString",
        "file()": f"SELECT * FROM file({path.format('read')}, 'CSV', 'a String')",
        "scalar file()": "SELECT file('/etc/hostname')",
        "insert into function": f"INSERT INTO FUNCTION file({path.format('ins')}, 'CSV') SELECT 1",
        "url()": f"SELECT * FROM url({url}, 'CSV', 'a String')",
        "s3()": f"SELECT * FROM s3({url}, 'CSV', 'a String')",
        "remote()": f"SELECT * FROM remote('127.0.0.1:{port}', system.one)",
        "executable()": "SELECT * FROM executable('attack-exec.sh', 'TSV', 'x String')",
        "input()": "INSERT INTO steps (replica_id) SELECT * FROM input('x String') FORMAT CSV",
        "filesystem()": "SELECT * FROM filesystem('/etc')",
        "deltaLakeS3()": f"SELECT * FROM deltaLakeS3({url})",
        "paimonS3()": f"SELECT * FROM paimonS3({url})",
        "eval()": "SELECT * FROM eval('echo attack') SETTINGS allow_experimental_eval_table_function = 1",
        "merge() over system": "SELECT * FROM merge('system', '^users$')",
        "apply file()": "SELECT * APPLY(file) FROM (SELECT '/etc/hostname' AS p)",
        "replace with file()": "SELECT * REPLACE (file(p) AS p) FROM (SELECT '/etc/hostname' AS p)",
        "describe url()": f"DESCRIBE TABLE url({url}, 'CSV')",
        "values expression": "INSERT INTO steps (replica_id) VALUES (file('/etc/hostname'))",
        "file engine": f"CREATE TABLE attack_file (a UInt8) ENGINE = File(CSV, {path.format('engine')})",
        "dynamic disk": f"CREATE TABLE requests (a UInt8) ENGINE = MergeTree ORDER BY a "
                        f"SETTINGS disk = disk(type = local, path = '{target}/attack-disk/')",
        "dictionary source": "CREATE DICTIONARY attack_dict (a String) PRIMARY KEY a "
                             "SOURCE(FILE(path '/etc/hostname' format 'LineAsString')) LAYOUT(FLAT()) LIFETIME(0)",
        "backup": f"BACKUP TABLE steps TO File({path.format('backup')})",
    }


CHANGES = {
    "insert": "INSERT INTO steps (replica_id) VALUES ('attack')",
    "insert elsewhere": "INSERT INTO schema_migrations_attack SELECT 1",
    "alter": "ALTER TABLE steps DELETE WHERE 1",
    "alter setting": "ALTER TABLE steps MODIFY SETTING ttl_only_drop_parts = 0",
    "drop": "DROP TABLE steps",
    "truncate": "TRUNCATE TABLE steps",
    "rename": "RENAME TABLE steps TO attack_steps",
    "delete": "DELETE FROM steps WHERE 1",
    "create table": "CREATE TABLE attack_t (a UInt8) ENGINE = MergeTree ORDER BY a",
    "create view": "CREATE VIEW attack_v AS SELECT 1",
    "create user": "CREATE USER attacker IDENTIFIED BY 'x'",
    "grant": "GRANT ALL ON *.* TO reader",
    "set readonly": "SET readonly = 0",
    "kill": "KILL QUERY WHERE 1",
    "system": "SYSTEM FLUSH LOGS",
    "optimize": "OPTIMIZE TABLE steps FINAL",
    "create or replace": "CREATE OR REPLACE TABLE steps (a UInt8) ENGINE = MergeTree ORDER BY a",
    "create as select": "CREATE TABLE IF NOT EXISTS steps ENGINE = MergeTree ORDER BY a AS SELECT 1 AS a",
    "attach": "ATTACH TABLE attack_a (a UInt8) ENGINE = MergeTree ORDER BY a",
    "detach": "DETACH TABLE steps",
    "alter drop column": "ALTER TABLE steps DROP COLUMN step_id",
    # a name that EXPLAIN AST prints as lines of its own, made to look like a contract table's
    "forged name": "CREATE TABLE `requests\n Identifier steps` (a UInt8) ENGINE = MergeTree ORDER BY a",
}

LEAKS = {
    "users": "SELECT * FROM system.users",
    "grants": "SELECT * FROM system.grants",
    "roles": "SELECT * FROM system.roles",
    "processes": "SELECT query FROM system.processes",
    "query_log": "SELECT query FROM system.query_log",
    "server_settings": "SELECT * FROM system.server_settings",
    "disks": "SELECT path FROM system.disks",
    "named_collections": "SELECT * FROM system.named_collections",
    "information_schema": "SELECT * FROM information_schema.tables",
    "processes in IN": "SELECT 'x' IN system.processes",
    "processes in a join": "SELECT s.step_id FROM steps AS s JOIN system.processes AS p ON 1",
    "show processlist": "SHOW PROCESSLIST",
    "show users": "SHOW USERS",
    "show grants": "SHOW GRANTS",
    "show create user table": "SHOW CREATE TABLE system.users",
    "show system tables": "SHOW TABLES FROM system",
    "show columns": "SHOW COLUMNS FROM system.users",
    "show settings": "SHOW SETTINGS LIKE '%'",
    "describe": "DESCRIBE TABLE system.users",
    "exists": "EXISTS system.users",
}
