"""Render migration statements for one node or for a cluster, from the same files.

Single node: table names qualified with the database, nothing else changes.
Cluster: each table becomes `<name>_local ON CLUSTER` with the Replicated* form of its engine,
plus a Distributed table `<name>` over it (what readers and writers use); ALTERs run on both
where they change columns.
"""

from __future__ import annotations

import re

from telemetry.schema.sql_files import Migration

IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# How the Distributed table spreads rows over shards: rows that are read together stay together
# (a replica's requests and steps; an eval run's items; every version of one finding).
SHARDING_KEYS = {
    "replicas": "cityHash64(replica_id)",
    "requests": "cityHash64(replica_id)",
    "steps": "cityHash64(replica_id)",
    "eval_runs": "cityHash64(run_id)",
    "eval_items": "cityHash64(run_id)",
    "findings": "cityHash64(finding_id)",
    "profiles": "cityHash64(replica_id)",
    "probe_baselines": "cityHash64(model_name)",
    "engine_request_timings": "cityHash64(replica_id)",
}

_CREATE = re.compile(
    r"^CREATE TABLE IF NOT EXISTS (?P<name>\w+)\s*\n(?P<body>\(.*?\n\))\s*\n"
    r"ENGINE = (?P<engine>\w+)(?:\((?P<args>[^)]*)\))?(?P<rest>.*)$",
    re.S,
)
_ALTER = re.compile(r"^ALTER TABLE (?P<name>\w+)\s+(?P<rest>.*)$", re.S)
_COLUMN_ALTER = re.compile(r"^(ADD|DROP|MODIFY|RENAME|COMMENT|CLEAR) COLUMN\b", re.I)


def check_identifier(kind: str, value: str) -> str:
    if not IDENTIFIER.match(value or ""):
        raise ValueError(f"invalid {kind} name {value!r}: use letters, digits and '_'")
    return value


def render_statement(statement: str, database: str, cluster: str | None = None) -> list[str]:
    """One migration statement as the statements to run (one, or several for a cluster)."""
    check_identifier("database", database)
    if cluster is not None:
        check_identifier("cluster", cluster)
    create = _CREATE.match(statement)
    if create:
        return _render_create(create, database, cluster)
    alter = _ALTER.match(statement)
    if alter:
        return _render_alter(alter, database, cluster)
    raise ValueError(f"migration statement not in a form render() knows (CREATE TABLE IF NOT EXISTS / "
                     f"ALTER TABLE): {statement[:80]!r}")


def _render_create(m: re.Match, database: str, cluster: str | None) -> list[str]:
    name, body, engine, args, rest = m["name"], m["body"], m["engine"], m["args"], m["rest"]
    engine_call = f"{engine}({args})" if args is not None else engine
    if cluster is None:
        return [f"CREATE TABLE IF NOT EXISTS {database}.{name}\n{body}\nENGINE = {engine_call}{rest}"]
    if name not in SHARDING_KEYS:
        raise ValueError(f"table {name!r} has no sharding key: add it to SHARDING_KEYS")
    local = f"{name}_local"
    zk_path = f"'/clickhouse/tables/{{shard}}/{database}/{local}'"
    replicated_args = ", ".join([zk_path, "'{replica}'"] + ([args] if args else []))
    rest = rest.replace("non_replicated_deduplication_window", "replicated_deduplication_window")
    return [
        f"CREATE TABLE IF NOT EXISTS {database}.{local} ON CLUSTER {cluster}\n{body}\n"
        f"ENGINE = Replicated{engine}({replicated_args}){rest}",
        f"CREATE TABLE IF NOT EXISTS {database}.{name} ON CLUSTER {cluster} AS {database}.{local}\n"
        f"ENGINE = Distributed({cluster}, {database}, {local}, {SHARDING_KEYS[name]})",
    ]


def _render_alter(m: re.Match, database: str, cluster: str | None) -> list[str]:
    name, rest = m["name"], m["rest"]
    if cluster is None:
        return [f"ALTER TABLE {database}.{name} {rest}"]
    statements = [f"ALTER TABLE {database}.{name}_local ON CLUSTER {cluster} {rest}"]
    if _COLUMN_ALTER.match(rest):  # the Distributed table mirrors the local table's columns
        statements.append(f"ALTER TABLE {database}.{name} ON CLUSTER {cluster} {rest}")
    return statements


def migrations_table_ddl(database: str, cluster: str | None = None) -> str:
    """The bookkeeping table: one row per applied migration (replicated to every node on a cluster)."""
    check_identifier("database", database)
    if cluster is None:
        on_cluster, engine = "", "MergeTree"
    else:
        check_identifier("cluster", cluster)
        on_cluster = f" ON CLUSTER {cluster}"
        engine = f"ReplicatedMergeTree('/clickhouse/tables/{database}/schema_migrations', '{{replica}}')"
    dedup = "replicated_deduplication_window" if cluster else "non_replicated_deduplication_window"
    return (
        f"CREATE TABLE IF NOT EXISTS {database}.schema_migrations{on_cluster}\n"
        "(\n"
        "    version UInt32,\n"
        "    name String,\n"
        "    checksum String,\n"
        "    applied_at DateTime64(6, 'UTC') DEFAULT now64(6, 'UTC')\n"
        ")\n"
        f"ENGINE = {engine}\n"
        "ORDER BY version\n"
        f"SETTINGS {dedup} = 1000"
    )


def render_migrations(migrations: list[Migration], database: str = "default",
                      cluster: str | None = None) -> list[str]:
    statements = [migrations_table_ddl(database, cluster)]
    for migration in migrations:
        for statement in migration.statements:
            statements.extend(render_statement(statement, database, cluster))
    return statements
