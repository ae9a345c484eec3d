"""Apply migrations to a store: in version order, each once, recorded in `schema_migrations`."""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa

from telemetry.schema.render import migrations_table_ddl, render_statement
from telemetry.schema.sql_files import load_migrations

log = logging.getLogger(__name__)


class MigrationError(Exception):
    pass


def applied_migrations(store) -> dict[int, str]:
    """version -> checksum of every migration recorded in the store."""
    df = store.query_df(f"SELECT version, any(checksum) AS checksum FROM {store.database}.schema_migrations "
                        "GROUP BY version ORDER BY version")
    return dict(zip(df["version"].astype(int), df["checksum"]))


def migrate(store, cluster: str | None = None, migrations_dir: str | Path | None = None,
            until: int | None = None) -> list[int]:
    """Bring the store's schema up to date (`until`: only up to that version, as a store of an older
    release stands); returns the versions applied now (idempotent)."""
    migrations = [m for m in load_migrations(migrations_dir) if until is None or m.version <= until]
    store.command(migrations_table_ddl(store.database, cluster))
    applied = applied_migrations(store)
    for migration in migrations:
        if migration.version in applied and applied[migration.version] != migration.checksum:
            raise MigrationError(
                f"migration {migration.version:04d}_{migration.name} changed after it was applied to "
                f"{store!r}; never edit an applied migration: add a new one")
    done = []
    for migration in migrations:
        if migration.version in applied:
            continue
        for statement in migration.statements:
            for sql in render_statement(statement, store.database, cluster):
                store.command(sql)
        row = pa.table({"version": pa.array([migration.version], pa.uint32()),
                        "name": [migration.name], "checksum": [migration.checksum]})
        store.insert_arrow("schema_migrations", row,
                           dedup_token=f"migration-{migration.version}-{migration.checksum[:16]}")
        log.info("applied migration %04d_%s to %r", migration.version, migration.name, store)
        done.append(migration.version)
    return done
