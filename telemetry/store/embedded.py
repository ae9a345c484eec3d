"""The embedded store: chdb (ClickHouse in-process) at a data directory.

One process per data directory (a lock file guards it). Within the process, a small pool of
chdb sessions on that directory lets readers and writers run in parallel; a session is used
by one caller at a time, so per-request settings (SET ... then back to DEFAULT) cannot leak
between callers. Read-only sessions take their settings once, when they open, then
`readonly = 1`: from then on ClickHouse itself refuses any write, DDL, SET or SETTINGS clause on
them (so a read-only caller's limits cannot be lifted); they are pooled by those settings.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import threading
from collections.abc import Iterable, Iterator, Mapping

import pyarrow as pa
from chdb import session as chdb_session
from clickhouse_connect.driver.binding import format_bind_value

from telemetry.store import dir_lock
from telemetry.store.base import Store, check_dedup_token, check_identifier
from telemetry.store.errors import InsertNotStoredError, StoreError

DEFAULT_POOL_SIZE = 4
_NO_LOCK = contextlib.nullcontext()
# chdb's insert stream answers an insert whose part could not be written (an unwritable or full
# data directory) with its rows as written and no error; the engine counts it here all the same
_FAILED_INSERTS = "SELECT toUInt64(sum(value)) FROM system.events WHERE name = 'FailedInsertQuery'"
# transport-level names that are not ClickHouse settings (never SET)
NOT_SETTINGS = frozenset({"readonly"})


def sql_string(value: str) -> str:
    """A ClickHouse string literal (for setting values, which SET cannot take as parameters)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def bind_values(parameters: Mapping | None) -> dict[str, str]:
    """Python values in ClickHouse's text form for server-side `{name:Type}` binding
    (the same encoding clickhouse-connect sends as `param_<name>` over HTTP)."""
    return {str(k): format_bind_value(v) for k, v in (parameters or {}).items()}


def _failed_inserts(session) -> int:
    return int(session.query(_FAILED_INSERTS, "TSVRaw").bytes().strip() or 0)


def _chdb_error(e: Exception) -> StoreError:
    undecodable = e if isinstance(e, UnicodeDecodeError) else e.__cause__
    if isinstance(undecodable, UnicodeDecodeError):  # ClickHouse's message quoted bytes that are not UTF-8
        message = undecodable.object.decode("utf-8", "replace")  # (a query's or its data's): its own words
    else:  # the insert stream's wrapper words before ClickHouse's own ("Code: N. DB::Exception: ...")
        message = re.sub(r"^Streaming insert \w+ failed: ", "", str(e).strip())
    return StoreError(message.strip())


class EmbeddedStore(Store):
    def __init__(self, path: str | os.PathLike, database: str = "default", pool_size: int = DEFAULT_POOL_SIZE):
        self.path = os.path.realpath(os.fspath(path))
        self.target = self.path
        self.database = check_identifier(database, "database")
        os.makedirs(self.path, exist_ok=True)
        dir_lock.acquire(self.path)
        self._pools: dict[tuple, queue.LifoQueue] = {}  # (readonly, fixed settings) -> idle sessions
        self._slots = {False: threading.Semaphore(pool_size), True: threading.Semaphore(pool_size)}
        self._all: list = []
        self._all_lock = threading.Lock()
        self._insert_lock = threading.Lock()  # insert_stream: see there
        self._closed = False
        try:
            # open the engine now, so that a directory already taken fails here, clearly
            with chdb_session.Session(self.path) as s:
                s.query(f"CREATE DATABASE IF NOT EXISTS {self.database}", "CSV")
        except Exception as e:
            self.close()
            if "different path" in str(e):
                raise StoreError(f"cannot open {self.path}: this process already has another chdb data "
                                 f"directory open (chdb allows one per process): {e}") from None
            raise

    # sessions ----------------------------------------------------------------------------------

    def _new_session(self, readonly: bool, fixed: tuple = ()):
        s = chdb_session.Session(self.path)
        s.query(f"USE {self.database}", "CSV")
        if readonly:  # the settings first: after readonly = 1 not even this session can change them
            try:
                s.query("SET " + ", ".join([f"{k} = {sql_string(v)}" for k, v in fixed] + ["readonly = 1"]), "CSV")
            except Exception:
                s.close()
                raise
        with self._all_lock:
            self._all.append(s)
        return s

    def _discard(self, s) -> None:
        with self._all_lock:
            if s in self._all:
                self._all.remove(s)
        with contextlib.suppress(Exception):
            s.close()

    @contextlib.contextmanager
    def session(self, settings: Mapping[str, str] | None = None, readonly: bool = False,
                database: str | None = None) -> Iterator:
        """A chdb session for one caller, with `settings` (and `database`) applied for the duration.
        Read-only: a session opened with exactly `settings`, which it keeps."""
        if self._closed:
            raise StoreError(f"store {self.path} is closed")
        names = [check_identifier(k, "setting") for k in (settings or {}) if k not in NOT_SETTINGS]
        fixed = tuple(sorted((k, str(settings[k])) for k in names)) if readonly else ()
        if readonly:
            names = []
        with self._all_lock:
            pool = self._pools.setdefault((readonly, fixed), queue.LifoQueue())
        slot = self._slots[readonly]
        slot.acquire()
        try:
            try:
                s = pool.get_nowait()
            except queue.Empty:
                try:
                    s = self._new_session(readonly, fixed)
                except Exception as e:
                    raise _chdb_error(e) from None
            switch_db = database is not None and check_identifier(database, "database") != self.database
            reusable = True
            try:
                try:
                    if names:
                        s.query("SET " + ", ".join(f"{k} = {sql_string(str(settings[k]))}" for k in names), "CSV")
                    if switch_db:
                        s.query(f"USE {database}", "CSV")
                except Exception as e:
                    raise _chdb_error(e) from None
                try:
                    yield s
                except BaseException:
                    # chdb can keep a failed query's partial output and return it as the next query's
                    # result (seen after max_result_bytes): a session that failed is never reused
                    reusable = False
                    raise
            finally:
                try:
                    if names:
                        s.query("SET " + ", ".join(f"{k} = DEFAULT" for k in names), "CSV")
                    if switch_db:
                        s.query(f"USE {self.database}", "CSV")
                except Exception:
                    reusable = False  # settings may be stuck on it: never hand it out again
                if reusable:
                    pool.put(s)
                else:
                    self._discard(s)
        finally:
            slot.release()

    # raw access (the sidecar's HTTP endpoint uses these) ----------------------------------------

    def execute(self, sql: str | bytes, fmt: str = "TabSeparated", params: Mapping[str, str] | None = None,
                settings: Mapping[str, str] | None = None, readonly: bool = False, database: str | None = None):
        """Run one statement; returns chdb's result (`.bytes()`, `.rows_read()` ...).
        `params` are already in ClickHouse text form (see `bind_values`). `sql` as bytes: a statement
        whose string literals hold bytes that are not UTF-8 (`SELECT '\\xff'`), passed through as they are."""
        # an INSERT ... SELECT that fails counts in the failed-insert counter insert_stream reads: one
        # insert at a time (not a security decision: a statement is checked before it gets here)
        text = sql if isinstance(sql, str) else sql[:256].decode("latin-1")
        is_insert = text.lstrip()[:6].upper() == "INSERT"
        with self.session(settings, readonly, database) as s, (self._insert_lock if is_insert else _NO_LOCK):
            try:
                return s.query(sql, fmt, params=dict(params or {}))
            except Exception as e:
                raise _chdb_error(e) from None

    def insert_stream(self, insert_sql: str, fmt: str, chunks: Iterable[bytes],
                      settings: Mapping[str, str] | None = None, database: str | None = None) -> int:
        """`INSERT INTO t (cols)` (no FORMAT, no data) fed with `chunks` in format `fmt`; returns the
        rows written. Raises InsertNotStoredError when the engine counted a failed insert while this
        one ran: possibly this one, which then reported success without storing anything. Inserts (here and
        an INSERT ... SELECT through `execute`) run one at a time, so another's failure is not counted
        against this one; were it, it would cost a retry, never an acknowledged loss (a retry with the
        same dedup token stores the rows once)."""
        # one insert at a time between the two reads of the process-wide failed-insert counter, so that
        # a concurrent insert failing (a writer's INSERT ... SELECT that throws) cannot count against this one
        with self.session(settings, database=database) as s, self._insert_lock:
            try:
                failed_before = _failed_inserts(s)
                inserter = s.send_insert(insert_sql, fmt)
            except Exception as e:
                raise _chdb_error(e) from None
            with inserter:
                try:
                    for chunk in chunks:
                        if chunk:
                            inserter.append(chunk)
                    rows = inserter.finish().rows_written
                    failed = _failed_inserts(s) - failed_before
                except StoreError:
                    raise
                except Exception as e:
                    raise _chdb_error(e) from None
            if failed:
                raise InsertNotStoredError(
                    f"the insert was not stored: the engine counted {failed} failed insert(s) while it ran, though "
                    f"its stream reported {rows} rows written (an unwritable or full data directory does this); "
                    "nothing of it may be taken as stored: send it again with the same insert_deduplication_token")
            return rows

    # Store interface -----------------------------------------------------------------------------

    def insert_arrow(self, table: str, data: pa.Table, dedup_token: str | None = None) -> int:
        check_identifier(table)
        columns = ", ".join(f"`{check_identifier(name, 'column')}`" for name in data.column_names)
        settings = {"insert_deduplication_token": check_dedup_token(dedup_token)} if dedup_token else None
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, data.schema) as writer:
            writer.write_table(data)
        self.insert_stream(f"INSERT INTO {self.database}.{table} ({columns})", "ArrowStream",
                           [sink.getvalue().to_pybytes()], settings)
        return data.num_rows

    def query_arrow(self, sql: str, parameters: Mapping | None = None) -> pa.Table:
        with self.session() as s:
            try:
                return s.query(sql, "ArrowTable", params=bind_values(parameters))
            except Exception as e:
                raise _chdb_error(e) from None

    def command(self, sql: str, parameters: Mapping | None = None) -> str:
        return self.execute(sql, "TabSeparated", bind_values(parameters)).bytes().decode()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._all_lock:
            sessions, self._all = self._all, []
        for s in sessions:
            with contextlib.suppress(Exception):
                s.close()
        dir_lock.release(self.path)
