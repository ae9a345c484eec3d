"""The column types of every table, read from the migration files, and their Arrow types.

The DDL is the one source of truth for types: writers build Arrow batches with exactly the
types the tables hold, so nothing is cast (or silently wrapped) on the way in.
"""

from __future__ import annotations

import functools
import re

import pyarrow as pa

from telemetry.schema.sql_files import load_migrations

_CREATE = re.compile(r"^CREATE TABLE IF NOT EXISTS (\w+)\s*\n\((.*?)\n\)", re.S)
_ADD_COLUMN = re.compile(r"^ALTER TABLE (\w+)\s+ADD COLUMN (?:IF NOT EXISTS )?(`?)(\w+)\2\s+(.*)$", re.S)
_NOT_COLUMNS = ("INDEX ", "PROJECTION ", "CONSTRAINT ")
_HIDDEN = re.compile(r"^\s*(MATERIALIZED|ALIAS|EPHEMERAL)\b")

_SCALARS = {
    "String": pa.string(), "Bool": pa.bool_(),
    "UInt8": pa.uint8(), "UInt16": pa.uint16(), "UInt32": pa.uint32(), "UInt64": pa.uint64(),
    "Int8": pa.int8(), "Int16": pa.int16(), "Int32": pa.int32(), "Int64": pa.int64(),
    "Float32": pa.float32(), "Float64": pa.float64(),
}


def _split_type(text: str) -> tuple[str, str]:
    """'Array(UInt32) CODEC(...)' -> ('Array(UInt32)', ' CODEC(...)'): the type, balanced parens."""
    match = re.match(r"\w+", text)
    if not match:
        raise ValueError(f"cannot read a column type from {text!r}")
    end, depth = match.end(), 0
    if end < len(text) and text[end] == "(":
        for i in range(end, len(text)):
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            if depth == 0:
                end = i + 1
                break
    return text[:end], text[end:]


def _parse_column(line: str) -> tuple[str, str, bool] | None:
    line = line.strip().rstrip(",")
    if not line or line.startswith(_NOT_COLUMNS):
        return None
    match = re.match(r"(`?)(\w+)\1\s+(.*)$", line)
    name, rest = match.group(2), match.group(3)
    ch_type, tail = _split_type(rest)
    return name, ch_type, bool(_HIDDEN.match(tail))


@functools.cache
def table_columns(table: str) -> tuple[tuple[str, str], ...]:
    """(column, ClickHouse type) of a table in insert order, hidden (MATERIALIZED ...) columns left out."""
    columns: dict[str, dict[str, str]] = {}
    for migration in load_migrations():
        for statement in migration.statements:
            if m := _CREATE.match(statement):
                parsed = [_parse_column(line) for line in m.group(2).splitlines()]
                columns[m.group(1)] = {name: t for name, t, hidden in filter(None, parsed) if not hidden}
            elif m := _ADD_COLUMN.match(statement):
                ch_type, tail = _split_type(m.group(4))
                if not _HIDDEN.match(tail):
                    columns[m.group(1)][m.group(3)] = ch_type
    if table not in columns:
        raise KeyError(f"unknown table {table!r}; tables: {sorted(columns)}")
    return tuple(columns[table].items())


def arrow_type(ch_type: str) -> pa.DataType:
    if ch_type.startswith("LowCardinality("):
        return arrow_type(ch_type[len("LowCardinality("):-1])
    if ch_type.startswith("Array("):
        return pa.list_(arrow_type(ch_type[len("Array("):-1]))
    if ch_type.startswith("DateTime64("):
        return pa.timestamp("us", tz="UTC")  # the schema only uses DateTime64(6, 'UTC')
    if ch_type in _SCALARS:
        return _SCALARS[ch_type]
    raise ValueError(f"no Arrow type for ClickHouse type {ch_type!r}")


@functools.cache
def arrow_schema(table: str) -> pa.Schema:
    return pa.schema([pa.field(name, arrow_type(t)) for name, t in table_columns(table)])
