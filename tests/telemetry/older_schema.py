"""Rows as a writer of an older release wrote them: for the tests of migrations that read parts written
before them. The record contract has grown since (every later migration adds columns), so such a part
holds only the columns the store had then."""

from __future__ import annotations

from collections.abc import Sequence

from telemetry.columnar import records_to_arrow


def insert_as_then(store, table: str, records: Sequence) -> None:
    """Insert `records` with only the columns `table` has in `store` now (an older schema)."""
    existing = set(store.query_df(f"DESCRIBE TABLE {table}")["name"])
    data = records_to_arrow(table, records)
    store.insert_arrow(table, data.select([c for c in data.column_names if c in existing]))
