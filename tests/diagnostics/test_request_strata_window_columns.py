"""The offered-load window function sorts every row it is given, all its columns along: request_strata
gives it the raw columns only and computes the buckets and TPOT after it (3-8% of the query's CPU time
over 1M requests, diagnostics/request_strata.py). tests/diagnostics/test_request_strata_mean_itl.py
holds the results equal to those of the query that computed them before the window."""

from __future__ import annotations

from diagnostics import request_strata as rs
from diagnostics.scope import Scope

SCOPE = Scope(start=1_700_000_000.0)


def _window_input(sql: str) -> str:
    """The subquery the window function reads (its rows are what it sorts)."""
    start = sql.index("(SELECT *, toUInt64(prompt_tokens + output_tokens) AS work FROM ")
    return sql[start + 1:sql.index(")) AS t\n", start)]


def test_the_window_sorts_the_raw_columns_only(store):
    params = {**SCOPE.parameters(), **SCOPE.narrowed(start=SCOPE.start - rs.OFFERED_WINDOW).parameters("reach_")}
    described = store.query_df(f"DESCRIBE TABLE ({_window_input(rs._sql(SCOPE))})", params)
    assert set(described["name"]) == set(rs._RAW) | {"at", "work"}  # no bucket string, TPOT, arrival_time
