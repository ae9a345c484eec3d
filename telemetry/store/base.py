"""The one store interface: columnar inserts, parameterized queries, DataFrame or Arrow out."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import pandas as pd
import pyarrow as pa

from telemetry.columnar import records_to_arrow

IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# dedup tokens travel as a setting value: keep them to a safe alphabet rather than escape them
DEDUP_TOKEN = re.compile(r"^[A-Za-z0-9_.:\-]{1,256}$")


def check_identifier(value: str, kind: str = "table") -> str:
    if not isinstance(value, str) or not IDENTIFIER.match(value):
        raise ValueError(f"invalid {kind} name {value!r}: letters, digits and '_' only")
    return value


def check_dedup_token(token: str | None) -> str | None:
    if token is not None and not DEDUP_TOKEN.match(token):
        raise ValueError(f"invalid dedup token {token!r}: 1-256 of [A-Za-z0-9_.:-]")
    return token


class Store:
    """Embedded (chdb) or remote (ClickHouse HTTP) store; see `open_store`.

    Queries bind parameters server-side: write `{name:Type}` in the SQL and pass
    `parameters={"name": value}`; values are never formatted into the SQL text.
    """

    target: str
    database: str = "default"

    def insert_arrow(self, table: str, data: pa.Table, dedup_token: str | None = None) -> int:
        """Insert an Arrow table (columns named as the table's); returns the rows sent.

        With `dedup_token`, a retry of the same batch with the same token is stored once.
        """
        raise NotImplementedError

    def insert_records(self, table: str, records: Sequence, dedup_token: str | None = None) -> int:
        """Insert dataclass records of `telemetry.contract.records` (RECORD_TYPES[table])."""
        if not records:
            return 0
        return self.insert_arrow(table, records_to_arrow(table, records), dedup_token=dedup_token)

    def query_arrow(self, sql: str, parameters: Mapping | None = None) -> pa.Table:
        raise NotImplementedError

    def query_df(self, sql: str, parameters: Mapping | None = None) -> pd.DataFrame:
        return self.query_arrow(sql, parameters).to_pandas()

    def command(self, sql: str, parameters: Mapping | None = None) -> str:
        """Run a statement (DDL, OPTIMIZE ...) and return its text output, if any."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"{type(self).__name__}({self.target!r})"
