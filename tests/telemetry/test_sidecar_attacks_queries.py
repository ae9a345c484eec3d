"""What a query may do through the sidecar, tried as an attacker on loopback would: a real sidecar
process with a writer and a read-only user, attacked as anonymous, with a wrong password, as the
read-only user and as the writer. Every attack gets a 4xx, the sidecar keeps serving, no file
appears (every path an attack names lies in a directory that must stay empty), no outbound
connection is made (every URL an attack names points at a listener that must see none), and the
dashboards', Grafana's, the diagnostics' and the migrations' own statements still pass."""

from __future__ import annotations

import re
import time
import uuid

import httpx
import pytest
from attacked_sidecar import (  # noqa: F401 - the fixtures: target, listener, sidecar, nothing_escaped
    CHANGES, LEAKS, READER, REFUSED, WRITER, assert_refused, attacks, listener, nothing_escaped, send, sidecar, target,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from telemetry import synthetic
from telemetry.store import open_store

# strangers --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("who", ["anonymous", "wrong"])
def test_strangers_are_refused_before_anything_runs(sidecar, target, listener, who):
    for sql in [*attacks(target, listener).values(), *CHANGES.values(), *LEAKS.values(), "SELECT 1"]:
        r = send(sidecar, sql, who)
        assert r.status_code == 403 and r.headers["X-ClickHouse-Exception-Code"] == "516", (sql, r.text)


# what reaches outside the store ---------------------------------------------------------------------------

@pytest.mark.parametrize("who", ["readonly", "writer"])
def test_nothing_reaches_outside_the_store(sidecar, target, listener, who):
    for name, sql in attacks(target, listener).items():
        # VALUES data is never evaluated: the writer's INSERT runs, and ClickHouse refuses the expression
        disabled = {"344"} if name == "values expression" and who == "writer" else set()
        assert_refused(send(sidecar, sql, who), REFUSED | disabled)


def test_the_seen_attack_is_refused_on_the_parse_tree(sidecar, target, listener):
    r = send(sidecar, attacks(target, listener)["the seen attack"], "readonly")
    assert_refused(r, {"497"})
    assert "INTO OUTFILE" in r.text


# what changes the store ---------------------------------------------------------------------------------------

def test_the_read_only_user_changes_nothing(sidecar):
    for name, sql in CHANGES.items():
        assert_refused(send(sidecar, sql, "readonly"), {"164"})
    r = send(sidecar, "SELECT 1", "readonly", {"readonly": "0"})  # a transport switch cannot widen the role
    assert r.status_code == 200
    assert_refused(send(sidecar, CHANGES["insert"], "readonly", {"readonly": "0"}), {"164"})
    r = httpx.post(sidecar.url, params={"query": "INSERT INTO steps (replica_id) FORMAT CSV"}, content=b"attack\n",
                   auth=READER, timeout=30)
    assert_refused(r, {"164"})
    assert send(sidecar, "SELECT count() FROM steps WHERE replica_id = 'attack'", "writer").text == "0\n"


def test_the_writer_inserts_only_into_the_contract_tables(sidecar):
    for name, sql in CHANGES.items():
        if name != "insert":
            assert_refused(send(sidecar, sql, "writer"), {"497"})
    r = httpx.post(sidecar.url, params={"query": "INSERT INTO attack_t FORMAT CSV"}, content=b"1\n",
                   auth=WRITER, timeout=30)
    assert_refused(r, {"497"})
    r = httpx.post(sidecar.url, params={"query": "INSERT INTO system.one FORMAT CSV"}, content=b"1\n",
                   auth=WRITER, timeout=30)
    assert_refused(r, {"497"})
    # what it may do: insert into a contract table (and nothing else changed)
    assert send(sidecar, "INSERT INTO eval_runs (run_id, suite) VALUES ('w-run', 's')", "writer").status_code == 200
    r = send(sidecar, "SELECT count() FROM system.tables WHERE database = currentDatabase() AND name LIKE 'attack%'",
             "readonly")
    assert r.text == "0\n"


# settings -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("who", ["readonly", "writer"])
def test_limits_cannot_be_lifted(sidecar, who):
    code = "164" if who == "readonly" else "497"
    for setting, value in (("max_execution_time", "0"), ("max_result_bytes", "0"), ("max_memory_usage", "0"),
                           ("max_execution_time", "3600"), ("allow_experimental_eval_table_function", "1"),
                           ("allow_introspection_functions", "1")):
        assert_refused(send(sidecar, "SELECT 1", who, {setting: value}), {code})
    for clause in ("max_execution_time = 0", "max_result_bytes = 0", "max_memory_usage = 0", "readonly = 0"):
        assert_refused(send(sidecar, f"SELECT count() FROM numbers(10) SETTINGS {clause}", who), {"164"})
        assert_refused(send(sidecar, f"SET {clause}", who), {code})
    # the limits hold (what the SETTINGS above would have lifted)
    r = send(sidecar, "SELECT number FROM numbers(1000000)", who)
    assert r.headers["X-ClickHouse-Exception-Code"] == "396"  # result over --max-result-mb
    assert r.status_code == 400  # the client's query over a limit: a 4xx, never a 5xx


@pytest.mark.parametrize("who", ["readonly", "writer"])
def test_runaway_queries_are_stopped_by_the_per_query_limits(sidecar, who):
    for sql in ("SELECT count() FROM numbers(1e12)", "SELECT sum(number) FROM numbers_mt(1000000000000)"):
        r = send(sidecar, sql, who)
        assert_refused(r, {"159"})  # TIMEOUT_EXCEEDED at --query-timeout: 408
        assert r.status_code == 408
    r = send(sidecar, "SELECT length(groupArray(repeat('x', 1000000))) FROM numbers(1000)", who)  # ~1 GB
    assert_refused(r, {"241"})  # MEMORY_LIMIT_EXCEEDED at --max-query-memory-mb
    assert "Query memory limit exceeded" in r.text


def test_a_failed_querys_partial_output_never_reaches_the_next_request(sidecar):
    # chdb keeps a query's output when max_result_bytes stops it and returns it with the session's next
    # result: the next request (anyone's, its parse included) would get it
    for who, then in (("readonly", "readonly"), ("readonly", "writer"), ("writer", "readonly"), ("writer", "writer")):
        assert send(sidecar, "SELECT number FROM numbers(1000000)", who).headers["X-ClickHouse-Exception-Code"] == "396"
        r = send(sidecar, "SELECT 'next'", then)
        assert r.status_code == 200 and r.text == "next\n", r.text


def test_the_writer_may_lower_a_limit(sidecar):
    r = send(sidecar, "SELECT number FROM numbers(1000)", "writer", {"max_result_bytes": "100"})
    assert r.headers["X-ClickHouse-Exception-Code"] == "396"
    r = send(sidecar, "SELECT getSetting('max_execution_time')", "writer", {"max_execution_time": "1.5"})
    assert r.text == "1.5\n"


# one statement per request ------------------------------------------------------------------------------------

@pytest.mark.parametrize("who", ["readonly", "writer"])
def test_a_second_statement_cannot_hide_anywhere(sidecar, who):
    for sql in ("SELECT 1; DROP TABLE steps", "SELECT 1 -- hidden\n; DROP TABLE steps",
                "SELECT 1 /* ; */; DROP TABLE steps", "SELECT 1 # hidden\n; TRUNCATE TABLE steps",
                "SELECT ';' ; INSERT INTO steps (replica_id) VALUES ('attack')",
                "SELECT 1;\nSET readonly = 0;\nINSERT INTO steps (replica_id) VALUES ('attack')"):
        assert_refused(send(sidecar, sql, who), {"62"})
    assert send(sidecar, "EXISTS TABLE steps", who).text == "1\n"


# system tables -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("who", ["readonly", "writer"])
def test_system_tables_that_leak_are_refused(sidecar, who):
    for name, sql in LEAKS.items():
        assert_refused(send(sidecar, sql, who))
    r = send(sidecar, "SELECT query FROM processes", who, {"database": "system"})
    assert_refused(r, {"497"})
    for table in ("system.users", "system.processes"):  # a name bound into the statement after it was sent
        assert_refused(send(sidecar, "SELECT * FROM {t:Identifier}", who, {"param_t": table}), {"497"})


# quoting tricks, generated -------------------------------------------------------------------------------------

TRICKY = st.text(alphabet=st.sampled_from(list("a1 '`\"\\;-/*#$()=,.\n\t")), min_size=1, max_size=20)


def backquoted(s: str, doubled: bool) -> str:
    s = s.replace("\\", "\\\\")
    return "`" + (s.replace("`", "``") if doubled else s.replace("`", "\\`")) + "`"


def double_quoted(s: str, doubled: bool) -> str:
    s = s.replace("\\", "\\\\")
    return '"' + (s.replace('"', '""') if doubled else s.replace('"', '\\"')) + '"'


def single_quoted(s: str, doubled: bool) -> str:
    s = s.replace("\\", "\\\\")
    return "'" + (s.replace("'", "''") if doubled else s.replace("'", "\\'")) + "'"


TEMPLATES = (
    "SELECT 1 AS {alias}, {string} INTO OUTFILE {path} TRUNCATE",
    "SELECT {string} AS {alias} FROM url({url}, 'CSV', 'a String')",
    "INSERT INTO FUNCTION file({path}, 'CSV') SELECT {string} AS {alias}",
    "SELECT {string} AS {alias}, file({path})",
    "SELECT {string} AS {ident} FROM system.processes",
    "SELECT 1 AS {alias}, {string} AS {ident} SETTINGS max_execution_time = 0",
    "SELECT {string} AS {alias} FROM executable({string}, 'TSV', 'x String')",
    "DESCRIBE TABLE (SELECT {string} AS {ident} FROM url({url}, 'CSV'))",
)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                      HealthCheck.too_slow])
@given(template=st.sampled_from(TEMPLATES), alias=TRICKY, ident=TRICKY, string=TRICKY,
       styles=st.tuples(st.booleans(), st.booleans(), st.booleans()), ident_style=st.booleans(),
       who=st.sampled_from(["readonly", "writer"]))
def test_quoting_tricks_hide_nothing_from_the_parse_tree(sidecar, target, listener, template, alias, ident,
                                                         string, styles, ident_style, who):
    name = f"attack-{uuid.uuid4().hex[:8]}"
    sql = template.format(
        alias=backquoted(alias, styles[0]),
        ident=(double_quoted if ident_style else backquoted)(ident, styles[1]),
        string=single_quoted(string, styles[2]),
        path=single_quoted(f"{target}/{name}.csv", styles[2]),
        url=single_quoted(f"http://127.0.0.1:{listener.getsockname()[1]}/{name}", styles[2]))
    r = send(sidecar, sql, who)
    assert_refused(r)  # a well-formed statement refused for what it does, never a syntax error
    assert not (target / f"{name}.csv").exists()


# what must still pass -------------------------------------------------------------------------------------------

_DEFAULTS = {"String": "x", "Float64": "0", "UInt32": "1000", "UInt64": "1000", "Int64": "0", "UInt8": "1"}


def _placeholder_value(type_: str) -> str:
    if type_.startswith("Array("):
        return "[]"
    if type_.startswith("DateTime"):
        return "2026-01-01 00:00:00"
    return _DEFAULTS[type_]


def test_the_dashboards_queries_pass_as_the_read_only_user(sidecar):
    from dashboards.data import ALLOWED_SQL

    assert len(ALLOWED_SQL) > 10
    for sql in sorted(ALLOWED_SQL):
        params = {f"param_{n}": _placeholder_value(t) for n, t in re.findall(r"\{(\w+):([^}]+)\}", sql)}
        r = send(sidecar, sql, "readonly", params)
        assert r.status_code == 200, (sql, r.text)


def _grafana_expand(sql: str, start: float, end: float) -> str:
    """Grafana's $__timeFilter / $__timeInterval macros and ${var:format} variables, as the plugin expands them."""
    sql = re.sub(r"\$__timeFilter\((\w+)\)",
                 lambda m: f"{m[1]} >= toDateTime({int(start)}) AND {m[1]} <= toDateTime({int(end)})", sql)
    sql = re.sub(r"\$__timeInterval\((\w+)\)", lambda m: f"toStartOfInterval(toDateTime({m[1]}), INTERVAL 60 second)",
                 sql)
    values = {"replica": "'seed'", "request_id": "'x'", "min_e2e": "0"}
    return re.sub(r"\$\{(\w+):(\w+)\}", lambda m: values[m[1]], sql)


def test_grafanas_queries_pass_as_the_read_only_user(sidecar):
    from dashboards.promql import clickhouse_queries

    expressions = clickhouse_queries()
    assert expressions
    for e in expressions:
        r = send(sidecar, _grafana_expand(e.expr, time.time() - 3600, time.time()), "readonly")
        assert r.status_code == 200, (e.where, r.text)


def test_clickhouse_connect_and_the_remote_store_work_for_both_users(sidecar):
    with open_store(sidecar.store_url) as store:
        store.insert_records("requests", synthetic.records("requests", 5, replica_id="cc"), dedup_token="cc-1")
    reader_url = sidecar.store_url.replace(f"{WRITER[0]}:{WRITER[1]}", f"{READER[0]}:{READER[1]}")
    with open_store(reader_url) as store:
        assert store.query_df("SELECT count() AS n FROM requests WHERE replica_id = {r:String}", {"r": "cc"})["n"][0] == 5
        # the one system table with values in it that a client must read: the session's own settings,
        # where the read-only user finds its limits set and locked
        limits = store.query_df("SELECT name, value, readonly FROM system.settings WHERE name IN "
                                "('max_execution_time', 'max_memory_usage', 'readonly') ORDER BY name")
    assert limits.to_dict("records") == [{"name": "max_execution_time", "value": "2", "readonly": 1},
                                         {"name": "max_memory_usage", "value": str(256 << 20), "readonly": 1},
                                         {"name": "readonly", "value": "1", "readonly": 1}]


def test_the_migrations_and_the_diagnostics_run_as_the_writer(sidecar):
    from diagnostics import DIAGNOSTICS, DiagnosticRequest, Scope, run
    from telemetry.schema import load_migrations, migrate, render_migrations

    now = time.time()
    with open_store(sidecar.store_url) as store:
        for sql in render_migrations(load_migrations(), store.database):  # every CREATE / ALTER, again
            store.command(sql)
        assert migrate(store) == []
        for replica in ("d1", "d2"):
            store.insert_records("replicas", [synthetic.replica(replica, now - 600)], dedup_token=f"d-{replica}")
            for table in ("requests", "steps"):
                store.insert_records(table, synthetic.records(table, 40, replica_id=replica, t=now - 300),
                                     dedup_token=f"d-{replica}-{table}")
        errors: list = []
        run(DIAGNOSTICS, store, DiagnosticRequest(Scope.window(since="1h")), write=True, errors=errors)
        assert errors == []
