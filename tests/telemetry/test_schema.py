"""The DDL mirrors the records, migrations are versioned and idempotent, and the cluster
variant rendered from the same files parses."""

from __future__ import annotations

import dataclasses
import shutil
import typing

import pyarrow as pa
import pytest

from telemetry import synthetic
from telemetry.contract.records import RECORD_TYPES, record_fields
from telemetry.schema import MIGRATIONS_DIR, MigrationError, arrow_schema, migrate, render, render_statements
from telemetry.schema.columns import table_columns
from telemetry.store import open_store


def _expected_arrow(annotation: str, name: str) -> tuple:
    if annotation == "str":
        return (pa.types.is_string,)
    if annotation == "bool":
        return (pa.types.is_boolean,)
    if annotation == "int":
        return (pa.types.is_integer,)
    if annotation == "float":  # instants become timestamps, durations and scores stay floats
        return (pa.types.is_timestamp,) if name.endswith(("_time", "_seen", "window_start", "window_end")) \
            else (pa.types.is_floating,)
    if annotation == "list[int]":
        return (lambda t: pa.types.is_list(t) and t.value_type == pa.uint32(),)
    if annotation == "list[float]":
        return (lambda t: pa.types.is_list(t) and t.value_type == pa.float32(),)
    raise AssertionError(f"unexpected annotation {annotation}")


@pytest.mark.parametrize("table", sorted(RECORD_TYPES))
def test_ddl_columns_mirror_the_records(table):
    record_type = RECORD_TYPES[table]
    assert [name for name, _ in table_columns(table)] == record_fields(record_type)
    hints = {f.name: f.type for f in dataclasses.fields(record_type)}
    for field in arrow_schema(table):
        (check,) = _expected_arrow(str(hints[field.name]).replace("typing.", ""), field.name)
        assert check(field.type), f"{table}.{field.name}: {hints[field.name]} vs {field.type}"


def test_migrate_creates_every_table_as_the_records_say(store):
    tables = store.query_df("SELECT name, engine FROM system.tables WHERE database = {db:String}",
                            {"db": store.database})
    engines = dict(zip(tables["name"], tables["engine"]))
    assert set(RECORD_TYPES) | {"schema_migrations"} <= set(engines)
    replaced = {"findings", "probe_baselines"}  # the only tables whose rows are updated (the latest wins)
    assert {engines[t] for t in replaced} == {"ReplacingMergeTree"}
    assert {engines[t] for t in RECORD_TYPES if t not in replaced} == {"MergeTree"}
    for table, record_type in RECORD_TYPES.items():
        described = store.query_df(f"DESCRIBE TABLE {table}")
        visible = described[described["default_type"] != "MATERIALIZED"]
        assert list(visible["name"]) == record_fields(record_type), table
    assert "DateTime64(6, 'UTC')" in set(store.query_df("DESCRIBE TABLE requests")["type"])


def test_table_and_text_ttls_and_skip_indexes(store):
    ddl = store.command("SHOW CREATE TABLE requests")
    assert "TTL toDateTime(arrival_time) + toIntervalDay(90)" in ddl
    assert "prompt_text String CODEC(ZSTD(3)) TTL toDateTime(arrival_time) + toIntervalDay(7)" in ddl.replace("`", "")
    assert "INDEX idx_request_id request_id TYPE bloom_filter" in ddl
    assert "INDEX idx_trace_id trace_id TYPE bloom_filter" in ddl
    assert "PARTITION BY toDate(arrival_time)" in ddl


def test_migrate_is_idempotent_and_recorded(store):
    assert migrate(store) == []
    rows = store.query_df("SELECT version, name FROM schema_migrations ORDER BY version")
    assert list(rows["version"]) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    assert list(rows["name"]) == ["initial", "steps_spec_num_drafts", "requests_rendered_prompt_hash",
                                 "probe_baselines", "requests_output_logprobs", "steps_num_context_tokens",
                                 "engine_request_timings", "requests_prompt_logprobs", "requests_token_id_summaries",
                                 "requests_mean_itl", "requests_outcomes"]


def test_new_migration_applies_once_and_a_changed_one_is_refused(store, tmp_path):
    migrations = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS_DIR, migrations)
    shipped = sorted(int(p.name[:4]) for p in MIGRATIONS_DIR.glob("*.sql"))
    new_version = shipped[-1] + 1
    new_file = migrations / f"{new_version:04d}_request_priority.sql"
    # a second database in the same data directory (chdb allows one directory per process)
    with open_store(store.path, database="versioned") as s:
        assert migrate(s, migrations_dir=migrations) == shipped
        new_file.write_text("ALTER TABLE requests ADD COLUMN IF NOT EXISTS priority Int32 DEFAULT 0;\n")
        assert migrate(s, migrations_dir=migrations) == [new_version]
        assert migrate(s, migrations_dir=migrations) == []
        assert "priority" in set(s.query_df("DESCRIBE TABLE requests")["name"])
        new_file.write_text("ALTER TABLE requests ADD COLUMN IF NOT EXISTS priority Int64 DEFAULT 0;\n")
        with pytest.raises(MigrationError, match=f"{new_version:04d}_request_priority changed"):
            migrate(s, migrations_dir=migrations)


def test_cluster_variant_parses_and_has_replicated_and_distributed_tables(store):
    statements = render_statements(cluster="infer_cluster", database="telemetry")
    for sql in statements:  # ClickHouse's own parser, fed the SQL as a bound parameter
        formatted = store.command("SELECT formatQuerySingleLine({q:String})", {"q": sql})
        assert formatted.startswith(("CREATE TABLE", "ALTER TABLE"))
    text = render(cluster="infer_cluster", database="telemetry")
    for table in RECORD_TYPES:
        assert f"CREATE TABLE IF NOT EXISTS telemetry.{table}_local ON CLUSTER infer_cluster" in text
        assert f"ENGINE = Distributed(infer_cluster, telemetry, {table}_local," in text
    assert ("ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/telemetry/findings_local', '{replica}', "
            "last_seen)") in text
    assert "non_replicated_deduplication_window" not in text
    assert ("ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/telemetry/probe_baselines_local', "
            "'{replica}', pinned_time)") in text
    # every table but the two replacing ones, + schema_migrations
    assert text.count("ENGINE = ReplicatedMergeTree(") == len(RECORD_TYPES) - 1


def test_single_node_render_is_what_migrate_runs(store):
    text = render(database="default")
    assert "ON CLUSTER" not in text and "Distributed" not in text
    for sql in render_statements(database="default"):  # every statement executes (tables exist: no-op)
        store.command(sql)


def test_render_rejects_bad_names():
    with pytest.raises(ValueError, match="invalid database"):
        render(database="x; DROP TABLE y")
    with pytest.raises(ValueError, match="invalid cluster"):
        render(cluster="c'1")


UNIQUE_KEY = {"replicas": "replica_id", "requests": "request_id", "steps": "step_id", "eval_runs": "run_id",
              "eval_items": "item_id", "findings": "finding_id", "profiles": "samples",
              "probe_baselines": "probe_id", "engine_request_timings": "request_id"}


@pytest.mark.parametrize("table", sorted(RECORD_TYPES))
def test_records_round_trip_through_the_ddl(store, table):
    records = synthetic.records(table, 3, replica_id=f"rt-{table}", t=synthetic.T0 + 10_000)
    store.insert_records(table, records)
    key = UNIQUE_KEY[table]
    got = store.query_arrow(f"SELECT * FROM {table} WHERE toString({key}) IN {{keys:Array(String)}}",
                            {"keys": [str(getattr(r, key)) for r in records]})
    rows = sorted(got.to_pylist(), key=lambda row: row[key])
    expected = sorted((dataclasses.asdict(r) for r in records), key=lambda row: row[key])
    assert len(rows) == len(expected) == 3
    for row, want in zip(rows, expected):
        for name, value in want.items():
            cell = row[name]
            if hasattr(cell, "timestamp"):  # instants come back as UTC datetimes, exact to the microsecond
                assert cell.timestamp() == pytest.approx(value, abs=1e-6), name
            elif isinstance(value, list) and value and isinstance(value[0], float):
                assert cell == pytest.approx(value, rel=1e-6), name  # Float32 arrays
            else:
                assert cell == value, name


def test_dedup_token_stores_a_retried_batch_once(store):
    batch = synthetic.records("steps", 5, replica_id="dedup")
    for _ in range(3):
        store.insert_records("steps", batch, dedup_token="batch-1")
    store.insert_records("steps", batch, dedup_token="batch-2")  # a different batch (same rows) is kept
    count = store.query_df("SELECT count() AS n FROM steps WHERE replica_id = 'dedup'")["n"][0]
    assert count == 10


def test_typing_of_records_module_is_what_the_check_expects():
    # the annotation strings above depend on `from __future__ import annotations` in records.py
    assert typing.get_type_hints(RECORD_TYPES["requests"])["prompt_token_ids"] == list[int]


def test_migrate_cli_renders_and_applies(store, capsys):
    from dashboards.console.cli import main

    assert main(["migrate", "--render", "--cluster", "prod", "--database", "telemetry"]) == 0
    out = capsys.readouterr().out
    assert "ON CLUSTER prod" in out and "ENGINE = Distributed(prod, telemetry, requests_local" in out
    assert main(["migrate", "--store", store.path]) == 0
    assert "up to date" in capsys.readouterr().out
    assert main(["migrate", "--render", "--database", "bad name"]) == 2
    assert "invalid database name" in capsys.readouterr().err
