"""Migration 0010: each request's mean ITL, MATERIALIZED by ClickHouse from token_times with the one
definition of telemetry.contract.derived. Writers send the record contract's columns only; the value is
computed at insert, computed on read for parts written before the migration, and never part of SELECT *."""

from __future__ import annotations

import dataclasses
import math
import re

from telemetry import synthetic
from telemetry.contract import derived
from telemetry.contract.records import record_fields
from telemetry.schema import load_migrations, migrate, render_statements
from telemetry.store import open_store
from tests.telemetry.older_schema import insert_as_then

COLUMN = "mean_itl_seconds"
# edge cases: no token, one token (no gap), a clock stepping back (gap 0), tokens accepted together,
# Float32 offsets that do not round-trip as decimals, a long stream
TIMES = [[], [0.12], [0.1, 0.35], [0.3, 0.1, 0.5], [0.2, 0.2, 0.2], [0.1, 0.1 + 1e-7, 1 / 3, 2 / 3, 7 / 9],
         [0.05 + 0.013 * k for k in range(500)]]


def _migration_expression() -> str:
    (migration,) = [m for m in load_migrations() if m.version == 10]
    (statement,) = migration.statements
    match = re.fullmatch(rf"ALTER TABLE requests ADD COLUMN IF NOT EXISTS {COLUMN} Float64 MATERIALIZED (.+) "
                         r"CODEC\(ZSTD\(1\)\) AFTER prompt_tail_max", statement)
    assert match, statement
    return match[1]


def _records(replica_id: str):
    base = [synthetic.request(i, replica_id=replica_id) for i in range(len(TIMES))]
    return [dataclasses.replace(r, token_times=t, output_tokens=len(t), output_token_ids=list(range(len(t))))
            for r, t in zip(base, TIMES)]


def _rows(store, replica_id: str) -> list[dict]:
    # the query-time form beside the stored one, and token_times as stored (Float32)
    return store.query_arrow(
        f"SELECT token_times, {COLUMN}, {derived.mean_itl_sql('token_times')} AS at_query_time FROM requests "
        "WHERE replica_id = {r:String} ORDER BY arrival_time", {"r": replica_id}).to_pylist()


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def _check(rows: list[dict]) -> None:
    assert len(rows) == len(TIMES)
    for row in rows:
        python = derived.mean_itl(row["token_times"])
        assert _same(row[COLUMN], python), row  # exact: Float32 offsets, Float64 differences and mean
        assert _same(row[COLUMN], row["at_query_time"]), row
    assert [math.isnan(r[COLUMN]) for r in rows[:2]] == [True, True]  # no gap: nan, as in SQL
    t = rows[3]["token_times"]
    assert rows[3][COLUMN] == (t[2] - t[1]) / 2  # gaps 0 (the clock stepped back) and 0.5 - 0.1
    assert rows[4][COLUMN] == 0.0


def test_the_migration_expression_is_the_contracts_definition():
    assert _migration_expression() == derived.mean_itl_sql("token_times")


def test_mean_itl_is_computed_at_insert_from_the_contract_columns(store):
    store.insert_records("requests", _records("itl-new"))  # the contract's columns only
    _check(_rows(store, "itl-new"))
    described = store.query_df("DESCRIBE TABLE requests")
    kinds = dict(zip(described["name"], described["default_type"]))
    types = dict(zip(described["name"], described["type"]))
    assert (kinds[COLUMN], types[COLUMN]) == ("MATERIALIZED", "Float64")
    star = store.query_arrow("SELECT * FROM requests WHERE replica_id = 'itl-new' LIMIT 1")
    assert star.column_names == record_fields(type(_records("x")[0]))  # not in SELECT *
    stored = store.query_df("SELECT DISTINCT column FROM system.parts_columns WHERE database = {db:String} "
                            "AND table = 'requests' AND active", {"db": store.database})
    assert COLUMN in set(stored["column"])  # written with the part, not computed when read


def test_parts_written_before_the_migration_read_the_same_mean_itl(store):
    with open_store(store.path, database="pre0010") as s:  # a second database, same data directory
        migrate(s, until=9)  # as a store before migration 0010
        assert COLUMN not in set(s.query_df("DESCRIBE TABLE requests")["name"])
        insert_as_then(s, "requests", _records("itl-old"))
        assert migrate(s, until=10) == [10]
        _check(_rows(s, "itl-old"))  # computed on read: the part has no such column
        migrate(s)  # the later migrations, so the contract's records insert whole
        s.insert_records("requests", _records("itl-after"))
        s.command("OPTIMIZE TABLE requests FINAL")  # a merge stores it for the old part too
        stored = s.query_df("SELECT DISTINCT column FROM system.parts_columns WHERE database = 'pre0010' "
                            "AND table = 'requests' AND active")
        assert COLUMN in set(stored["column"])
        _check(_rows(s, "itl-old"))
        _check(_rows(s, "itl-after"))


def test_the_cluster_variant_adds_it_to_the_local_and_the_distributed_table():
    ours = [s for s in render_statements(cluster="c1", database="telemetry") if f" {COLUMN} " in s]
    assert [s.split(" ADD COLUMN")[0] for s in ours] == ["ALTER TABLE telemetry.requests_local ON CLUSTER c1",
                                                         "ALTER TABLE telemetry.requests ON CLUSTER c1"]
    assert all(derived.mean_itl_sql("token_times") in s for s in ours)
