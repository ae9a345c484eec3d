"""The dashboard's read-only access to the store: named queries in, DataFrames out.

Only the SQL in `dashboards.queries` runs here, with bound parameters. On the embedded
store the queries run in chdb's read-only sessions; over HTTP the sidecar's read-only
user (or a ClickHouse user with `readonly`) enforces the same. Results are cached for a
short while so that widgets do not re-run every query on each interaction.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import pandas as pd
import streamlit as st

from dashboards import queries
from dashboards import settings as settings_mod

CACHE_SECONDS = 30

# the only SQL this module runs: the statements of dashboards.queries
ALLOWED_SQL = frozenset(
    [v for k, v in vars(queries).items()
     if not k.startswith("_") and isinstance(v, str) and v.lstrip().startswith(("SELECT", "WITH"))]
    + [v for v in queries.SEARCH_REQUESTS.values()])

_injected = None  # a Store given by the process that embeds the dashboard (tests, benchmarks)
_timings: list[tuple[str, float, int]] = []  # (query, seconds, rows) of the current run


def use_store(store) -> None:
    """Serve the dashboard from this already-open Store (same process: tests, benchmarks)."""
    global _injected
    _injected = store
    st.cache_data.clear()


@st.cache_resource(show_spinner="Opening the store ...")
def _open(target: str):
    from telemetry.store import open_store

    return open_store(target)


def store():
    if _injected is not None:
        return _injected
    target = settings_mod.from_env().store
    if not target:
        raise RuntimeError("no store: start the dashboard with `infersight dashboard --store URL|DIR`")
    return _open(target)


def _run(sql: str, parameters: Mapping | None) -> pd.DataFrame:
    s = store()
    execute = getattr(s, "execute", None)
    if execute is not None:  # embedded chdb: a read-only session
        from telemetry.store.embedded import bind_values

        table = execute(sql, "ArrowTable", bind_values(parameters), readonly=True)
    else:
        table = s.query_arrow(sql, parameters)
    return table.to_pandas()


@st.cache_data(ttl=CACHE_SECONDS, show_spinner=False, max_entries=500)
def _cached(sql: str, frozen: tuple) -> pd.DataFrame:
    # arrays travel as tuples (hashable for the cache) and go back to lists (Array, not Tuple)
    return _run(sql, {k: list(v) if isinstance(v, tuple) else v for k, v in frozen})


def query(sql: str, **parameters) -> pd.DataFrame:
    """Run one of `dashboards.queries` with its parameters (cached for CACHE_SECONDS)."""
    if sql not in ALLOWED_SQL:
        raise ValueError("data.query runs only the statements of dashboards.queries")
    frozen = tuple(sorted((k, tuple(v) if isinstance(v, (list, tuple)) else v) for k, v in parameters.items()))
    t0 = time.perf_counter()
    df = _cached(sql, frozen)
    _timings.append((sql.strip().splitlines()[0][:60], time.perf_counter() - t0, len(df)))
    return df.copy()


def take_timings() -> list[tuple[str, float, int]]:
    out = list(_timings)
    _timings.clear()
    return out
