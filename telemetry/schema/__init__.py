"""The ClickHouse schema of the telemetry store: versioned migrations mirroring telemetry/contract/records.py.

- `migrate(store)`: apply pending migrations (idempotent; versions recorded in schema_migrations);
- `render(cluster=None, database="default")`: the DDL as text, for one node or for a cluster
  (ON CLUSTER, Replicated* engines, a Distributed table over each local table), from the same files;
- `table_columns(table)`, `arrow_schema(table)`: column types as the DDL declares them.
"""

from __future__ import annotations

from pathlib import Path

from telemetry.schema.columns import arrow_schema, table_columns
from telemetry.schema.migrator import MigrationError, applied_migrations, migrate
from telemetry.schema.render import render_migrations
from telemetry.schema.sql_files import MIGRATIONS_DIR, load_migrations

__all__ = ["MIGRATIONS_DIR", "MigrationError", "applied_migrations", "arrow_schema", "load_migrations",
           "migrate", "render", "render_statements", "table_columns"]


def render_statements(cluster: str | None = None, database: str = "default",
                      migrations_dir: str | Path | None = None) -> list[str]:
    return render_migrations(load_migrations(migrations_dir), database, cluster)


def render(cluster: str | None = None, database: str = "default", migrations_dir: str | Path | None = None) -> str:
    """All migrations as one SQL script (statements separated by ';')."""
    return "".join(f"{s};\n\n" for s in render_statements(cluster, database, migrations_dir))
