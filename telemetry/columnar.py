"""Records and column buffers -> Arrow tables with exactly the types of the DDL.

Records carry instants as float epoch seconds; the tables hold DateTime64(6, 'UTC'), so
instants become int64 microseconds here (rounded, not truncated).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa

from telemetry.contract.records import RECORD_TYPES
from telemetry.schema.columns import arrow_schema


def _column(values: Sequence, arrow_type: pa.DataType) -> pa.Array:
    if pa.types.is_timestamp(arrow_type):
        micros = np.rint(np.asarray(values, dtype=np.float64) * 1e6).astype(np.int64)
        return pa.array(micros, type=arrow_type)  # int64 microseconds are the timestamp's storage
    return pa.array(values, type=arrow_type)


def columns_to_arrow(table: str, columns: Mapping[str, Sequence]) -> pa.Table:
    """A dict column name -> list of values (record units) as an Arrow table of the table's schema."""
    schema = arrow_schema(table)
    missing = [f.name for f in schema if f.name not in columns]
    if missing:
        raise ValueError(f"{table}: missing columns {missing}")
    arrays = []
    for field in schema:
        try:
            arrays.append(_column(columns[field.name], field.type))
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
            raise ValueError(f"{table}.{field.name}: cannot convert to {field.type}: {e}") from e
    return pa.Table.from_arrays(arrays, schema=schema)


def as_one_batch(data: pa.Table) -> pa.Table:
    """The table with one chunk per column, so that it travels as one Arrow record batch.

    ClickHouse makes one insert block per record batch and derives each block's deduplication id
    from the insert's token and the block's place in the insert: the same rows sent again under
    the same token but chunked otherwise would be stored a second time (measured on chdb 26.9).
    """
    if all(column.num_chunks == 1 for column in data.columns):
        return data
    return data.combine_chunks()


def records_to_arrow(table: str, records: Sequence) -> pa.Table:
    """Dataclass records (of RECORD_TYPES[table]) as an Arrow table."""
    record_type = RECORD_TYPES.get(table)
    if record_type is None:
        raise ValueError(f"unknown table {table!r}; tables: {sorted(RECORD_TYPES)}")
    for r in records:
        if not isinstance(r, record_type):
            raise TypeError(f"{table} takes {record_type.__name__} records, got {type(r).__name__}")
    names = [f.name for f in arrow_schema(table)]
    return columns_to_arrow(table, {name: [getattr(r, name) for r in records] for name in names})
